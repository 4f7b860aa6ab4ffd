"""The Kubernetes backend's checks against the live cluster, a part of KubernetesScheduler (`check`): the CRD and
runtime are installed, the namespace exists, a node has room for one worker pod, the quota allows the job, the
PVCs exist and can be shared; and the warnings that need no cluster (a run dir off the shared volumes).
"""

from __future__ import annotations

import posixpath
import re
from decimal import Decimal
from typing import Any

from hpctrain.errors import UserError
from hpctrain.fsutil import format_bytes
from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers import base
from hpctrain.schedulers.base import NodeView
from hpctrain.schedulers.kubernetes.queries.kubeflow_objects import GPU, node_views, requests_by_node, with_use
from hpctrain.schedulers.kubernetes.manifests.options import parse_quantity
from hpctrain.schedulers.kubernetes.manifests.params import PRIORITY_LABEL
from hpctrain.schedulers.kubernetes.manifests.pod_template import resources_per_pod
from hpctrain.schedulers.kubernetes.api.rest import NODES, path
from hpctrain.schedulers.kubernetes.manifests.validate import unknown_fields, validate_manifest
from hpctrain.schedulers.kubernetes.manifests import render as r

# The first release whose CRD declares a field hpctrain renders (the CRDs of kubeflow/trainer at each tag:
# manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml): v2.0.x and v2.1.x have no runtimePatches and no
# activeDeadlineSeconds (v2.1 has podTemplateOverrides instead); v2.2's runtime patch has no
# terminationGracePeriodSeconds. Every field of a PyTorchJob hpctrain renders is in training-operator v1.7's CRD.
FIELD_RELEASES = (
    (
        "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template.spec"
        ".terminationGracePeriodSeconds",
        "Kubeflow Trainer v2.3.0",
    ),
    ("spec.runtimePatches", "Kubeflow Trainer v2.2.0"),
    ("spec.activeDeadlineSeconds", "Kubeflow Trainer v2.2.0"),
)


def _api_error(err: Any, what: str) -> UserError:
    from hpctrain.schedulers.kubernetes.api.client import describe_api_error

    return UserError(describe_api_error(err, what))


def _fmt_cpu(value: Decimal | float) -> str:
    return f"{float(value):g}"


def _tolerated(taint: dict[str, Any], tolerations: list[dict[str, str]]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t["key"] == taint.get("key") and (t["operator"] == "Exists" or t.get("value") == (taint.get("value") or "")):
            return True
    return False


PROBED_NODES = 8  # nodes whose running pods the check reads one by one before it reads them all


class LiveChecks:
    """KubernetesScheduler's `check` and its parts (they read the cluster's JSON through its `raw` API, and the
    running pods of a node, or of all, through its `running_pods`)."""

    def check(self, job: JobSpec) -> list[str]:
        from kubernetes.client.rest import ApiException

        rendered = self.render(job)
        problems = [
            f"the rendered {self.kind} does not match its CRD schema ({line}): this is a bug in hpctrain, "
            "please report it"
            for line in validate_manifest(rendered.payload)
        ]
        problems += self._pure_problems(job)
        try:
            problems += self._crd_problems(rendered.payload)
            problems += self._priority_problems()
            namespace_ok = self._namespace_problems(problems)
            problems += self._node_problems(job)
            if namespace_ok:
                problems += self._quota_problems(job)
                problems += self._volume_problems(job)
        except ApiException as err:
            problems.append(str(_api_error(err, "checking the cluster")))
        return problems

    def _pure_problems(self, job: JobSpec) -> list[str]:
        problems = []
        memory = job.resources.mem_bytes
        shm = self.options.shm_bytes
        if shm is not None and memory and shm > memory:
            problems.append(
                f"--shm {self.options.shm} exceeds the pod's memory --mem {job.resources.mem}: /dev/shm "
                "counts against the pod's memory; lower --shm or raise --mem"
            )
        directory = r.run_dir(job)
        if directory is None:
            problems.append(
                f"{base.WARNING_PREFIX}no --run-dir: checkpoints stay inside the pod and are lost when it "
                "restarts; set --run-dir on a volume every replica mounts (--volume)"
            )
        elif not self._on_shared_volume(directory):
            mounts = ", ".join(v.mount for v in self.options.parsed_volumes if v.shared) or "none"
            problems.append(
                f"{base.WARNING_PREFIX}--run-dir {directory} is not on a volume all replicas share "
                f"(shared mounts: {mounts}): restarted pods cannot resume and rank 0's checkpoint is "
                "invisible to the others; put it under a --volume mount path"
            )
        return problems

    def _on_shared_volume(self, directory: str) -> bool:
        if not directory.startswith("/"):
            return False
        path = posixpath.normpath(directory)
        return any(
            v.shared and not v.read_only and (path + "/").startswith(posixpath.normpath(v.mount) + "/")
            for v in self.options.parsed_volumes
        )

    def _crd_problems(self, manifest: dict[str, Any] | None = None) -> list[str]:
        from kubernetes.client.rest import ApiException

        name = f"{self.plural}.{self.group}"
        try:
            crd = self._crd(name)
        except ApiException as err:
            if err.status != 404:
                raise
            other = "trainjob" if self.options.api == "pytorchjob" else "pytorchjob"
            return [
                f"the Kubeflow {self.kind} CRD ({name}) is not installed: install Kubeflow's "
                f"{'training-operator v1' if self.kind == 'PyTorchJob' else 'Trainer v2'}, or use --k8s-api {other}"
            ]
        conditions = (crd.get("status") or {}).get("conditions") or []
        established = any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
        if not established:
            return [f"the {self.kind} CRD ({name}) is not Established yet: wait, or ask the admin to check it"]
        if manifest is not None:
            dropped = self._dropped_fields(crd, manifest)
            if dropped:
                return dropped
        own = ((manifest or {}).get("spec") or {}).get("runtimeRef", {}).get("kind") == "TrainingRuntime"
        if own:  # --max-restarts: hpctrain makes the job's own TrainingRuntime (runtime.py): its CRD must be served
            try:
                self._crd(f"trainingruntimes.{self.group}")
            except ApiException as err:
                if err.status != 404:
                    raise
                return [
                    f"the cluster has no TrainingRuntime CRD (trainingruntimes.{self.group}), which --max-restarts "
                    "needs for the TrainJob's own runtime: drop --max-restarts, or ask the admin to install Trainer's"
                ]
        elif self.options.api == "trainjob":
            try:
                self.raw.get(
                    path("apis", self.group, self.version, "clustertrainingruntimes", self.options.runtime),
                    f"reading the ClusterTrainingRuntime {self.options.runtime}",
                )
            except ApiException as err:
                if err.status != 404:
                    raise
                return [
                    f"the ClusterTrainingRuntime {self.options.runtime!r} does not exist: install Trainer's runtimes, "
                    "or pass --runtime NAME (runtime: in the job file's kubernetes: section) with one that "
                    "`kubectl get clustertrainingruntimes` lists"
                ]
        return []

    def _crd(self, name: str) -> dict[str, Any]:
        """The CustomResourceDefinition `name`, as JSON."""
        return self.raw.get(
            path("apis", "apiextensions.k8s.io", "v1", "customresourcedefinitions", name), f"reading CRD {name}"
        )

    def _dropped_fields(self, served: dict[str, Any], manifest: dict[str, Any]) -> list[str]:
        """The served CRD's schema against the manifest: a field it does not declare would be dropped without a word
        by an API server that predates fieldValidation=Strict (Kubernetes < 1.25), and refused by a newer one."""
        version = next(
            (
                v
                for v in served.get("spec", {}).get("versions", [])
                if v.get("name") == self.version and v.get("served")
            ),
            None,
        )
        name = f"{self.plural}.{self.group}"
        if version is None:
            return [
                f"the cluster's {self.kind} CRD ({name}) does not serve {self.group}/{self.version}, the version "
                "hpctrain writes: upgrade Kubeflow "
                f"{'Trainer to v2.2.0' if self.kind == 'TrainJob' else 'training-operator'} or later"
            ]
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if not schema:
            return []
        paths = unknown_fields(manifest, schema)
        if not paths:
            return []
        needed = [release for field, release in FIELD_RELEASES if any(p.startswith(field) for p in paths)]
        release = f"{needed[0]} or later" if needed else "a newer Kubeflow release"
        shown = ", ".join(sorted({re.sub(r"\[\d+\]", "[]", p) for p in paths})[:3])
        return [
            f"the cluster's {self.kind} CRD ({name}) has no field {shown}, which this job needs (the API server "
            f"would drop it): the job needs {release}; ask the admin to upgrade"
        ]

    def _priority_problems(self) -> list[str]:
        """--priority-class must name a PriorityClass (the API server refuses pods that name another, so the job would
        wait with no pod); a params file's priority=N is only a label: say which classes would schedule by priority."""
        from kubernetes.client.rest import ApiException

        wanted = self.options.priority_class
        labelled = self.options.label_map.get(PRIORITY_LABEL)
        if wanted is None and labelled is None:
            return []
        try:
            listed = self.raw.list("/apis/scheduling.k8s.io/v1/priorityclasses", "listing the PriorityClasses")
            classes = {c["metadata"]["name"]: int(c.get("value") or 0) for c in listed}
        except ApiException as err:
            if err.status == 403:  # not allowed to list them: the pods' admission tells
                return []
            raise
        offered = ", ".join(f"{n} ({v})" for n, v in sorted(classes.items(), key=lambda kv: -kv[1])) or "none"
        if wanted is not None and wanted not in classes:
            return [
                f"PriorityClass {wanted!r} does not exist (the cluster has: {offered}): the API server would refuse "
                "every pod of the job; pick one of these with --priority-class"
            ]
        if wanted is None:
            return [
                f"{base.WARNING_PREFIX}priority={labelled} (the params file) is only the label {PRIORITY_LABEL}: it "
                f"does not change scheduling; to schedule by priority add --priority-class NAME (this cluster has: "
                f"{offered})"
            ]
        return []

    def _namespace_problems(self, problems: list[str]) -> bool:
        from kubernetes.client.rest import ApiException

        try:
            self.raw.get(path("api", "v1", "namespaces", self.namespace), f"reading namespace {self.namespace}")
        except ApiException as err:
            if err.status == 404:
                problems.append(
                    f"namespace {self.namespace!r} does not exist: create it "
                    f"({self.kubectl('create', 'namespace', self.namespace)}) or pick another --namespace"
                )
                return False
            if err.status != 403:  # not allowed to read namespaces: the later calls tell
                raise
        return True

    def _node_problems(self, job: JobSpec) -> list[str]:
        """Whether a node has room for one worker pod: what the nodes offer decides first (a page of nodes at a time,
        each kept as a NodeView only if it could take the pod); the pods running on a node are read only for nodes
        that could hold the pod when empty, the largest first, a node at a time (fieldSelector spec.nodeName, from
        the API server's cache), until one has room now. Only when PROBED_NODES of them are full does the check
        read every running pod, a page at a time, summed per candidate node and never kept, to say exactly whether
        any node has room and name the freest: a 10,000-node cluster with room costs its node list and a few small
        pod lists, not its 80,000 pods; a full one costs reading them, in memory that grows with the nodes only."""
        want = {k: parse_quantity(v) for k, v in resources_per_pod(job).items()}
        selector = self.options.node_selector_map
        tolerations = self.options.toleration_list
        excluded = set(job.exclude_nodes)
        count, candidates = self._candidates(excluded)
        ask = (
            f"cpu {_fmt_cpu(want['cpu'])}"
            + (f", memory {format_bytes(want['memory'])}" if "memory" in want else "")
            + (f", {GPU} {int(want[GPU])}" if GPU in want else "")
        )
        if not candidates:
            why = (
                "no schedulable node"
                if not selector and not tolerations
                else "no schedulable node matches --node-selector and tolerates its taints with --toleration"
            )
            if excluded:
                return [
                    f"{why} outside --exclude-nodes {','.join(job.exclude_nodes)} ({count} node(s) in "
                    "the cluster): exclude fewer nodes, or fix --node-selector/--toleration"
                ]
            return [f"{why} ({count} node(s) in the cluster): fix --node-selector/--toleration or ask the admin"]

        def fits(n: NodeView, free: bool) -> bool:
            cpu, mem, gpu = (
                (n.cpu_free, n.memory_free, n.gpus_free)
                if free
                else (n.cpu_allocatable, n.memory_allocatable, n.gpus_allocatable)
            )
            return Decimal(str(cpu)) >= want["cpu"] and mem >= want.get("memory", 0) and gpu >= want.get(GPU, 0)

        roomy = sorted(
            (n for n in candidates if fits(n, free=False)),
            key=lambda n: (n.gpus_allocatable, n.cpu_allocatable, n.memory_allocatable),
            reverse=True,
        )
        now: list[NodeView] = []
        for n in roomy[:PROBED_NODES]:
            now.append(with_use(n, requests_by_node(self.running_pods(n.name)).get(n.name, {})))
            if fits(now[-1], free=True):
                return []
        rest = roomy[PROBED_NODES:]
        if rest:  # the largest are full: every running pod, summed for the others, to tell for each
            used = requests_by_node(self.running_pods(), {n.name for n in rest})
            now += [with_use(n, used.get(n.name, {})) for n in rest]
            if any(fits(n, free=True) for n in now):
                return []
        if now:
            best = max(now, key=lambda n: (n.gpus_free, n.cpu_free, n.memory_free))
            free = f"cpu {_fmt_cpu(best.cpu_free)}, memory {format_bytes(best.memory_free)}, {GPU} {best.gpus_free}"
            return [
                f"no node has room for one worker pod ({ask}) now; the freest, {best.name}, has {free} free: "
                "the pod will wait until running pods end; ask for less per pod, or wait"
            ]
        biggest = max(candidates, key=lambda n: (n.gpus_allocatable, n.cpu_allocatable, n.memory_allocatable))
        return [
            f"one worker pod asks for {ask}, more than any node offers (largest: {biggest.name} with cpu "
            f"{_fmt_cpu(biggest.cpu_allocatable)}, memory {format_bytes(biggest.memory_allocatable)}, {GPU} "
            f"{biggest.gpus_allocatable}); a pod lives on one node, so it never schedules: ask for less per pod "
            "(--cpus-per-task, --mem, --gpus-per-node) and use more pods (--nodes)"
        ]

    def _candidates(self, excluded: set[str]) -> tuple[int, list[NodeView]]:
        """(how many nodes the cluster has, the views of those a job's pod may use: schedulable, not excluded,
        matching --node-selector and tolerating their taints), read a page of nodes at a time, none kept."""
        selector = self.options.node_selector_map
        tolerations = self.options.toleration_list
        count, candidates = 0, []
        for page in self.raw.pages(NODES, "listing the nodes"):
            count += len(page)
            candidates += [
                view
                for n, view in zip(page, node_views(page, {}))
                if view.schedulable
                and view.name not in excluded
                and all((n["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())
                and all(
                    t.get("effect") not in ("NoSchedule", "NoExecute") or _tolerated(t, tolerations)
                    for t in (n.get("spec") or {}).get("taints") or []
                )
            ]
        return count, candidates

    def _quota_problems(self, job: JobSpec) -> list[str]:
        per_pod = {k: parse_quantity(v) for k, v in resources_per_pod(job).items()}
        pods = job.resources.nodes
        total = {k: v * pods for k, v in per_pod.items()}
        asks = {
            "pods": Decimal(pods),
            "count/pods": Decimal(pods),
            "requests.cpu": total["cpu"],
            "cpu": total["cpu"],
            "limits.cpu": total["cpu"],
            "requests.memory": total.get("memory"),
            "memory": total.get("memory"),
            "limits.memory": total.get("memory"),
            f"requests.{GPU}": total.get(GPU, Decimal(0)),
            f"limits.{GPU}": total.get(GPU, Decimal(0)),
            f"count/{self.plural}.{self.group}": Decimal(1),
        }
        problems = []
        for quota in self.quotas():
            status = quota.get("status") or {}
            hard = status.get("hard") or (quota.get("spec") or {}).get("hard") or {}
            used = status.get("used") or {}
            quota_name = quota["metadata"]["name"]
            for key, limit in hard.items():
                ask = asks.get(key)
                if key in ("requests.memory", "memory", "limits.memory") and ask is None:
                    problems.append(
                        f"namespace {self.namespace} has a memory quota ({quota_name}: {key}): "
                        "pods must state their memory; give --mem"
                    )
                    continue
                if ask is None or ask == 0:
                    continue
                limit_q, used_q = parse_quantity(limit), parse_quantity(used.get(key, "0"))
                show = format_bytes if "memory" in key else _fmt_cpu
                if ask > limit_q:
                    problems.append(
                        f"the job asks for {key} {show(ask)} but the quota {quota_name} of namespace "
                        f"{self.namespace} allows {show(limit_q)} in all: it can never run; ask for less "
                        "(fewer --nodes or less per pod) or ask for a larger quota"
                    )
                elif used_q + ask > limit_q:
                    problems.append(
                        f"{base.WARNING_PREFIX}the job will queue until {show(used_q + ask - limit_q)} of "
                        f"{key} is freed in namespace {self.namespace} (quota {quota_name}: "
                        f"{show(used_q)} of {show(limit_q)} used, the job needs {show(ask)})"
                    )
        return problems

    def _volume_problems(self, job: JobSpec) -> list[str]:
        from kubernetes.client.rest import ApiException

        problems = []
        directory = r.run_dir(job)
        for v in self.options.parsed_volumes:
            if v.kind != "pvc":
                continue
            try:
                pvc = self.raw.get(
                    path("api", "v1", "namespaces", self.namespace, "persistentvolumeclaims", v.source),
                    f"reading PersistentVolumeClaim {v.source}",
                )
            except ApiException as err:
                if err.status != 404:
                    raise
                problems.append(
                    f"PersistentVolumeClaim {v.source!r} does not exist in namespace {self.namespace}: "
                    "create it or fix --volume pvc:NAME:/mount"
                )
                continue
            modes = set((pvc.get("spec") or {}).get("accessModes") or [])
            holds_run_dir = directory is not None and (posixpath.normpath(directory) + "/").startswith(
                posixpath.normpath(v.mount) + "/"
            )
            if job.resources.nodes > 1 and holds_run_dir and "ReadWriteMany" not in modes:
                problems.append(
                    f"{base.WARNING_PREFIX}PVC {v.source} holds the run dir but its access modes are "
                    f"{', '.join(sorted(modes)) or 'none'}: pods on different nodes need ReadWriteMany"
                )
        return problems
