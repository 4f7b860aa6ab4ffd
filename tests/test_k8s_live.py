"""The Kubernetes backend against the real local API server (scripts/local-k8s.sh): check accepts and refuses
with real Nodes, Pods bound to them, ResourceQuotas and PVCs; submit creates the object; status parses the
conditions, pod phases, restarts and events set here; cancel deletes; the cluster view adds up.

No kubelet, scheduler or controller runs on that server: the Nodes, their allocatable resources, pod phases and
job conditions are written by the tests through the API (the status subresources), as those components would.
Each test works in its own namespace, and its nodes carry a label unique to the test that the job's
--node-selector names, so that nodes other tests create do not change the answers.
"""

from __future__ import annotations

import copy
import re

import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest

from hpctrain.errors import UserError
from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.jobs.values import parse_mem_bytes, parse_time_limit
from hpctrain.schedulers import blocking
from hpctrain.schedulers.base import CANCELLED, FAILED, RUNNING
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
from hpctrain.schedulers.kubernetes.scheduler import KubernetesScheduler
from k8s_fixtures import LocalK8s
from kubeflow_standin import create_namespace, delete_namespace, now

pytestmark = pytest.mark.k8s
NODE_LABEL = "hpctrain-test-node"
IMAGE = "example.invalid/pytorch:latest"


@dataclass
class Ctx:
    api: Any
    namespace: str
    tag: str
    nodes: list[str] = field(default_factory=list)

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    def node(
        self,
        cpu: str = "8",
        memory: str = "32Gi",
        gpus: int = 0,
        taints: list | None = None,
        unschedulable: bool = False,
    ) -> str:
        name = f"{self.tag}-n{len(self.nodes)}"
        self.core.create_node(
            {"metadata": {"name": name, "labels": {NODE_LABEL: self.tag}}, "spec": {"unschedulable": unschedulable}}
        )
        self.nodes.append(name)
        alloc = {"cpu": cpu, "memory": memory, "pods": "110", **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
        self.core.patch_node_status(
            name,
            {
                "status": {
                    "capacity": alloc,
                    "allocatable": alloc,
                    "conditions": [
                        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test node"}
                    ],
                }
            },
        )
        # The TaintNodesByCondition admission plugin marks a new node not-ready; the node lifecycle controller
        # (absent here) lifts that once the kubelet reports Ready. Set the taints this test wants instead.
        self.core.patch_node(name, {"spec": {"taints": taints or None}})
        return name

    def pod(
        self,
        node: str | None,
        cpu: str = "1",
        memory: str = "1Gi",
        gpus: int = 0,
        name: str | None = None,
        labels: dict | None = None,
    ) -> str:
        name = name or f"filler-{uuid.uuid4().hex[:6]}"
        requests = {"cpu": cpu, "memory": memory, **({"nvidia.com/gpu": str(gpus)} if gpus else {})}
        container = {"name": "pytorch", "image": IMAGE, "resources": {"requests": requests, "limits": requests}}
        spec: dict[str, Any] = {"containers": [container]}
        if node:
            spec["nodeName"] = node
        self.core.create_namespaced_pod(
            self.namespace, {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}
        )
        return name

    def pvc(self, name: str, mode: str = "ReadWriteMany") -> None:
        self.core.create_namespaced_persistent_volume_claim(
            self.namespace,
            {
                "metadata": {"name": name},
                "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "1Gi"}}},
            },
        )

    def quota(self, hard: dict[str, str], used: dict[str, str]) -> None:
        """A ResourceQuota with the status the quota controller would write."""
        self.core.create_namespaced_resource_quota(
            self.namespace, {"metadata": {"name": "team"}, "spec": {"hard": hard}}
        )
        self.core.patch_namespaced_resource_quota_status(
            "team", self.namespace, {"status": {"hard": hard, "used": used}}
        )

    def scheduler(self, **options: Any) -> KubernetesScheduler:
        options.setdefault("namespace", self.namespace)
        options.setdefault("image", IMAGE)
        options.setdefault("node_selector", (f"{NODE_LABEL}={self.tag}",))
        return KubernetesScheduler(KubernetesOptions(**options), api_client=self.api)


@pytest.fixture
def ctx(k8s_cluster: LocalK8s):
    api = k8s_cluster.api_client()
    namespace = create_namespace(api)
    context = Ctx(api, namespace, namespace)
    yield context
    delete_namespace(api, namespace)
    for node in context.nodes:
        context.core.delete_node(node)


def job(
    nodes: int = 2,
    cpus: int = 2,
    mem: str | None = "8G",
    gpus: int = 0,
    run_dir: str | None = "/mnt/runs/%j",
    **kw: Any,
) -> JobSpec:
    if "time" in kw:  # as typed
        kw["time_limit_s"] = parse_time_limit(kw.pop("time"))
    return JobSpec(
        command=("hpctrain", "train", "mnist"),
        name=kw.pop("name", "mnist"),
        run_dir=run_dir,
        resources=Resources(
            nodes=nodes,
            nproc_per_node=max(1, gpus),
            gpus_per_node=gpus,
            cpus_per_task=cpus,
            mem_bytes=None if mem is None else parse_mem_bytes(mem),
        ),
        **kw,
    )


def test_check_accepts_a_job_that_fits(ctx: Ctx) -> None:
    ctx.node(gpus=2)
    ctx.node(gpus=2)
    ctx.pvc("runs")
    sched = ctx.scheduler(shm="4Gi", volumes=("pvc:runs:/mnt/runs",))
    assert sched.check(job(gpus=2, cpus=2, mem="16G")) == []


def test_check_refuses_a_pod_larger_than_any_node(ctx: Ctx) -> None:
    ctx.node(cpu="8", memory="32Gi")
    ctx.pvc("runs")
    problems = ctx.scheduler(volumes=("pvc:runs:/mnt/runs",)).check(job(cpus=16))
    assert len(problems) == 1, problems
    assert "one worker pod asks for cpu 16, memory 8 GiB, more than any node offers" in problems[0]
    assert "never schedules" in problems[0] and "--nodes" in problems[0]
    problems = ctx.scheduler(volumes=("pvc:runs:/mnt/runs",)).check(job(cpus=1, mem="64G"))
    assert "more than any node offers" in problems[0]


def test_check_counts_requests_of_running_pods_only(ctx: Ctx) -> None:
    a, b = ctx.node(cpu="8"), ctx.node(cpu="8")
    fillers = [ctx.pod(a, cpu="6"), ctx.pod(b, cpu="6")]
    ctx.pod(None, cpu="6")  # not bound to a node: takes nothing from any node
    ctx.pvc("runs")
    sched = ctx.scheduler(volumes=("pvc:runs:/mnt/runs",))
    problems = sched.check(job(cpus=4, mem="1G"))
    assert len(problems) == 1, problems
    assert "no node has room for one worker pod (cpu 4, memory 1 GiB) now" in problems[0]
    assert "cpu 2, " in problems[0] and "will wait" in problems[0]
    # A pod that has finished no longer holds its requests.
    ctx.core.patch_namespaced_pod_status(fillers[0], ctx.namespace, {"status": {"phase": "Succeeded"}})
    assert sched.check(job(cpus=4, mem="1G")) == []


def test_check_node_selector_taints_and_cordons(ctx: Ctx) -> None:
    ctx.node(gpus=4, taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}])
    ctx.node(cpu="64", unschedulable=True)
    ctx.pvc("runs")
    volumes = ("pvc:runs:/mnt/runs",)
    problems = ctx.scheduler(volumes=volumes).check(job(gpus=2))
    # The count is of the whole cluster's nodes: other tests' stand-ins add their own meanwhile.
    assert len(problems) == 1 and re.fullmatch(
        r"no schedulable node matches --node-selector and tolerates its taints with --toleration \(\d+ node\(s\) in "
        r"the cluster\): fix --node-selector/--toleration or ask the admin",
        problems[0],
    ), problems
    assert ctx.scheduler(volumes=volumes, tolerations=("nvidia.com/gpu:NoSchedule",)).check(job(gpus=2)) == []
    assert ctx.scheduler(volumes=volumes, tolerations=("nvidia.com/gpu=present",)).check(job(gpus=2)) == []
    problems = ctx.scheduler(volumes=volumes, tolerations=("nvidia.com/gpu",)).check(job(gpus=8))
    assert "more than any node offers" in problems[0] and "nvidia.com/gpu 4" in problems[0]


def test_check_leaves_out_excluded_nodes(ctx: Ctx) -> None:
    sick, well = ctx.node(cpu="16"), ctx.node(cpu="4")
    ctx.pvc("runs")
    sched = ctx.scheduler(volumes=("pvc:runs:/mnt/runs",))
    assert sched.check(job(cpus=8, mem="1G")) == []  # fits on the big node
    problems = sched.check(job(cpus=8, mem="1G", exclude_nodes=(sick,)))
    assert len(problems) == 1 and "more than any node offers" in problems[0], problems  # the small one is left
    problems = sched.check(job(cpus=2, mem="1G", exclude_nodes=(sick, well)))
    assert len(problems) == 1 and problems[0].startswith(
        f"no schedulable node matches --node-selector and tolerates its taints with --toleration outside "
        f"--exclude-nodes {sick},{well} ("
    ), problems
    assert problems[0].endswith("exclude fewer nodes, or fix --node-selector/--toleration")


def test_check_names_missing_namespace_pvc_runtime_and_bad_shm(ctx: Ctx) -> None:
    ctx.node()
    problems = ctx.scheduler(namespace=f"{ctx.namespace}-missing").check(job())
    assert any(
        f"namespace '{ctx.namespace}-missing' does not exist: create it (kubectl create namespace" in p
        for p in problems
    )

    problems = ctx.scheduler(volumes=("pvc:nope:/mnt/runs",), shm="16Gi").check(job(mem="8G"))
    assert "PersistentVolumeClaim 'nope' does not exist in namespace" in " | ".join(problems)
    assert "--shm 16Gi exceeds the pod's memory --mem 8G" in " | ".join(problems)
    assert len(blocking(problems)) == 2

    problems = ctx.scheduler(api="trainjob", runtime="no-such-runtime", volumes=("nfs:nas:/export:/mnt/runs",)).check(
        job()
    )
    assert problems == [
        "the ClusterTrainingRuntime 'no-such-runtime' does not exist: install Trainer's runtimes, or "
        "pass --runtime NAME (runtime: in the job file's kubernetes: section) with one that "
        "`kubectl get clustertrainingruntimes` lists"
    ]
    assert ctx.scheduler(api="trainjob", volumes=("nfs:nas:/export:/mnt/runs",)).check(job()) == []


def test_check_reads_the_served_crd_and_the_clusters_priority_classes(ctx: Ctx) -> None:
    """The served TrainJob CRD (Trainer v2.3.0's, CEL stripped for this 1.20 server) declares every field hpctrain
    writes, the backstop deadline and the runtime patch included (test_k8s_kubeflow_rules.py has the older releases);
    --priority-class must name a PriorityClass of the cluster, and a params file's priority=N is only a label."""
    from kubernetes import client

    ctx.node()
    shared = ("nfs:nas:/export:/mnt/runs",)
    assert ctx.scheduler(api="trainjob", volumes=shared).check(job(time="01:00:00", exclude_nodes=("gpu07",))) == []
    scheduling = client.SchedulingV1Api(ctx.api)
    name = f"{ctx.tag}-batch"
    scheduling.create_priority_class({"metadata": {"name": name}, "value": 1000})
    try:
        assert ctx.scheduler(volumes=shared, priority_class=name).check(job()) == []
        [refused] = ctx.scheduler(volumes=shared, priority_class=f"{name}-x").check(job())
        assert re.fullmatch(
            rf"PriorityClass '{name}-x' does not exist \(the cluster has: .*\b{name} \(1000\).*\): the "
            r"API server would refuse every pod of the job; pick one of these with --priority-class",
            refused,
        )
        [warned] = ctx.scheduler(volumes=shared, labels=("hpctrain.io/priority=3",)).check(job())
        assert warned.startswith(
            "warning: priority=3 (the params file) is only the label hpctrain.io/priority: it does "
            "not change scheduling; to schedule by priority add --priority-class NAME (this "
            "cluster has: system-node-critical (2000001000), system-cluster-critical (2000000000)"
        )
        assert blocking([warned]) == []
    finally:
        scheduling.delete_priority_class(name)


def test_check_warns_when_the_run_dir_is_not_shared(ctx: Ctx) -> None:
    ctx.node()
    ctx.pvc("scratch", mode="ReadWriteOnce")
    problems = ctx.scheduler().check(job())
    assert problems == [
        "warning: --run-dir /mnt/runs/mnist is not on a volume all replicas share (shared mounts: none): "
        "restarted pods cannot resume and rank 0's checkpoint is invisible to the others; put it under "
        "a --volume mount path"
    ]
    assert blocking(problems) == []
    problems = ctx.scheduler(volumes=("pvc:scratch:/mnt/runs",)).check(job(nodes=2))
    assert problems == [
        "warning: PVC scratch holds the run dir but its access modes are ReadWriteOnce: pods on "
        "different nodes need ReadWriteMany"
    ]
    assert ctx.scheduler(volumes=("pvc:scratch:/mnt/runs",)).check(job(nodes=1)) == []
    assert "no --run-dir" in ctx.scheduler().check(job(run_dir=None))[0]


def test_check_quota(ctx: Ctx) -> None:
    ctx.node(cpu="32", memory="128Gi")
    ctx.pvc("runs")
    sched = ctx.scheduler(volumes=("pvc:runs:/mnt/runs",))
    ctx.quota(
        {"requests.cpu": "8", "requests.memory": "64Gi", "pods": "10"},
        {"requests.cpu": "6", "requests.memory": "0", "pods": "3"},
    )
    problems = sched.check(job(nodes=2, cpus=2, mem="8G"))  # 4 CPUs, 2 free under the quota
    assert problems == [
        "warning: the job will queue until 2 of requests.cpu is freed in namespace "
        f"{ctx.namespace} (quota team: 6 of 8 used, the job needs 4)"
    ]
    problems = sched.check(job(nodes=3, cpus=4, mem="8G"))  # 12 CPUs: more than the quota allows at all
    assert problems == [
        f"the job asks for requests.cpu 12 but the quota team of namespace {ctx.namespace} allows 8 in "
        "all: it can never run; ask for less (fewer --nodes or less per pod) or ask for a larger quota"
    ]
    problems = sched.check(job(nodes=1, cpus=1, mem=None))
    assert problems == [
        f"namespace {ctx.namespace} has a memory quota (team: requests.memory): pods must state "
        "their memory; give --mem"
    ]
    assert sched.check(job(nodes=1, cpus=1, mem="1G")) == []


def test_submit_creates_the_object_and_refuses_a_duplicate(ctx: Ctx) -> None:
    from kubernetes import client

    sched = ctx.scheduler(shm="2Gi")
    spec = job(nodes=3, max_restarts=2, time="01:00:00")
    rendered = sched.render(spec)
    assert sched.submit(spec, rendered) == "mnist"
    stored = client.CustomObjectsApi(ctx.api).get_namespaced_custom_object(
        "kubeflow.org", "v1", ctx.namespace, "pytorchjobs", "mnist"
    )
    assert stored["spec"]["runPolicy"].pop("suspend") is False  # the CRD's one default
    assert stored["spec"] == rendered.payload["spec"]  # nothing pruned: every field is one the CRD knows
    assert stored["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "hpctrain"}
    with pytest.raises(UserError, match="a PyTorchJob named 'mnist' already exists in namespace"):
        sched.submit(spec, rendered)
    trainjob = ctx.scheduler(api="trainjob", volumes=("nfs:nas:/export:/mnt/runs",))
    spec = job(name="mnist-v2")
    assert trainjob.submit(spec, trainjob.render(spec)) == "mnist-v2"
    assert [s.job_id for s in trainjob.list_jobs()] == ["mnist-v2"]
    missing = ctx.scheduler(namespace=f"{ctx.namespace}-gone")
    with pytest.raises(UserError, match="namespace .*-gone.* does not exist: create it"):
        missing.submit(job(), missing.render(job()))


def _kubeflow_pod(ctx: Ctx, node: str | None, rtype: str, index: int) -> str:
    labels = {
        "training.kubeflow.org/job-name": "mnist",
        "training.kubeflow.org/replica-type": rtype,
        "training.kubeflow.org/replica-index": str(index),
    }
    return ctx.pod(node, name=f"mnist-{rtype}-{index}", labels=labels)


def test_status_parses_conditions_pods_and_events(ctx: Ctx) -> None:
    from kubernetes import client

    custom = client.CustomObjectsApi(ctx.api)
    node = ctx.node()
    sched = ctx.scheduler()
    spec = job(nodes=3)
    sched.submit(spec, sched.render(spec))
    status = sched.status("mnist")
    assert (status.state, status.replicas) == ("PENDING", ())
    assert "no pods yet" in status.pending_reasons[-1]

    master = _kubeflow_pod(ctx, node, "master", 0)
    worker0 = _kubeflow_pod(ctx, node, "worker", 0)
    worker1 = _kubeflow_pod(ctx, None, "worker", 1)
    ctx.core.patch_namespaced_pod_status(
        master,
        ctx.namespace,
        {
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "pytorch",
                        "image": IMAGE,
                        "imageID": "",
                        "ready": True,
                        "restartCount": 2,
                        "state": {"running": {"startedAt": now()}},
                        "lastState": {
                            "terminated": {"exitCode": 75, "reason": "Error", "startedAt": now(), "finishedAt": now()}
                        },
                    }
                ],
            }
        },
    )
    ctx.core.patch_namespaced_pod_status(worker0, ctx.namespace, {"status": {"phase": "Running"}})
    ctx.core.patch_namespaced_pod_status(
        worker1,
        ctx.namespace,
        {
            "status": {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/1 nodes are available",
                    }
                ],
            }
        },
    )
    ctx.core.create_namespaced_event(
        ctx.namespace,
        {
            "metadata": {"name": f"{worker1}.1"},
            "type": "Warning",
            "reason": "FailedScheduling",
            "count": 1,
            "message": "0/1 nodes are available: 1 Insufficient cpu.",
            "firstTimestamp": now(),
            "lastTimestamp": now(),
            "involvedObject": {"kind": "Pod", "name": worker1, "namespace": ctx.namespace},
            "source": {"component": "default-scheduler"},
        },
    )
    ctx.core.create_namespaced_event(
        ctx.namespace,
        {
            "metadata": {"name": f"{master}.1"},
            "type": "Normal",
            "reason": "Started",
            "message": "Started container",
            "involvedObject": {"kind": "Pod", "name": master, "namespace": ctx.namespace},
        },
    )
    conditions = [
        {"type": "Created", "status": "True", "reason": "PyTorchJobCreated", "message": "created"},
        {"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": "PyTorchJob mnist is running."},
    ]
    custom.patch_namespaced_custom_object_status(
        "kubeflow.org", "v1", ctx.namespace, "pytorchjobs", "mnist", {"status": {"conditions": conditions}}
    )

    status = sched.status("mnist")
    assert status.state == RUNNING and status.message == "PyTorchJob mnist is running."
    assert [(r.name, r.phase, r.node, r.restarts, r.exit_code, r.reason) for r in status.replicas] == [
        ("master-0", "Running", node, 2, 75, None),
        ("worker-0", "Running", node, 0, None, None),
        ("worker-1", "Pending", None, 0, None, "Unschedulable"),
    ]
    assert status.restarts == 2 and status.exit_code is None and not status.finished
    assert status.pending_reasons == (f"{worker1}: FailedScheduling: 0/1 nodes are available: 1 Insufficient cpu.",)

    # What a real kubelet reports once the backoff limit failed the job: the container waits to restart
    # (CrashLoopBackOff) and only its last state holds the exit code, which the job's status must still give.
    ctx.core.patch_namespaced_pod_status(
        worker0,
        ctx.namespace,
        {
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "pytorch",
                        "image": IMAGE,
                        "imageID": "",
                        "ready": False,
                        "restartCount": 1,
                        "state": {
                            "waiting": {
                                "reason": "CrashLoopBackOff",
                                "message": "back-off 10s restarting failed container",
                            }
                        },
                        "lastState": {
                            "terminated": {"exitCode": 3, "reason": "Error", "startedAt": now(), "finishedAt": now()}
                        },
                    }
                ],
            }
        },
    )
    assert [(r.exit_code, r.reason) for r in sched.status("mnist").replicas][1] == (3, "CrashLoopBackOff")
    ctx.core.patch_namespaced_pod_status(
        master,
        ctx.namespace,
        {
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": "pytorch",
                        "image": IMAGE,
                        "imageID": "",
                        "ready": False,
                        "restartCount": 2,
                        "state": {
                            "terminated": {"exitCode": 2, "reason": "Error", "startedAt": now(), "finishedAt": now()}
                        },
                    }
                ],
            }
        },
    )
    conditions[1]["status"] = "False"
    conditions.append({"type": "Failed", "status": "True", "reason": "PyTorchJobFailed", "message": "master failed"})
    custom.patch_namespaced_custom_object_status(
        "kubeflow.org", "v1", ctx.namespace, "pytorchjobs", "mnist", {"status": {"conditions": conditions}}
    )
    status = sched.status("mnist")
    assert (status.state, status.exit_code, status.message, status.finished) == (FAILED, 2, "master failed", True)
    assert status.replicas[0].reason == "Error" and status.pending_reasons == ()
    assert [(s.job_id, s.state, s.replicas) for s in sched.list_jobs()] == [("mnist", FAILED, 3)]
    with pytest.raises(UserError, match="no PyTorchJob named 'other'"):
        sched.status("other")


def test_cancel_deletes_in_the_foreground(ctx: Ctx) -> None:
    from kubernetes import client

    sched = ctx.scheduler()
    sched.submit(job(), sched.render(job()))
    sched.cancel("mnist")
    stored = client.CustomObjectsApi(ctx.api).get_namespaced_custom_object(
        "kubeflow.org", "v1", ctx.namespace, "pytorchjobs", "mnist"
    )
    # No garbage collector runs here, so the object waits for its (absent) pods, marked as being deleted.
    assert stored["metadata"]["deletionTimestamp"] and stored["metadata"]["finalizers"] == ["foregroundDeletion"]
    assert sched.status("mnist").state == CANCELLED
    with pytest.raises(UserError, match="no PyTorchJob named 'nothing' .*: nothing to cancel"):
        sched.cancel("nothing")


def test_cluster_view_numbers(ctx: Ctx) -> None:
    a = ctx.node(cpu="8", memory="32Gi", gpus=4)
    b = ctx.node(cpu="4", memory="16Gi")
    ctx.pod(a, cpu="2", memory="4Gi", gpus=1)
    ctx.pod(a, cpu="500m", memory="512Mi")
    ctx.pod(b, cpu="1", memory="1Gi")
    done = ctx.pod(b, cpu="3", memory="8Gi")
    ctx.core.patch_namespaced_pod_status(done, ctx.namespace, {"status": {"phase": "Failed"}})
    ctx.quota({"requests.cpu": "10", "pods": "20"}, {"requests.cpu": "3500m", "pods": "4"})
    view = ctx.scheduler().cluster()
    mine = {n.name: n for n in view.nodes if n.name in (a, b)}
    na, nb = mine[a], mine[b]
    assert (na.cpu_allocatable, na.cpu_requested, na.cpu_free) == (8.0, 2.5, 5.5)
    assert (na.memory_allocatable, na.memory_requested) == (32 * 2**30, 4 * 2**30 + 512 * 2**20)
    assert (na.gpus_allocatable, na.gpus_requested, na.gpus_free) == (4, 1, 3)
    assert (nb.cpu_requested, nb.memory_requested, nb.gpus_allocatable) == (1.0, 2**30, 0)
    assert view.quota == (
        f"{ctx.namespace}/team pods: 4 of 20 used",
        f"{ctx.namespace}/team requests.cpu: 3500m of 10 used",
    )


# ---- submit --wait: the exit status of a job whose pods went as it failed ------------------------------------

FAILED_AT_LIMIT = "Job mnist has failed because it has reached the specified backoff limit"  # TO v1.9.4 common/job.go


class _Operator:
    """training-operator v1.9.4's answers for a job with --max-restarts 1 that fails at its backoff limit, one step
    per `status` poll: the master runs; its container exits 3 and the kubelet restarts it in place (restartCount 1,
    CrashLoopBackOff, the code in lastState); the restart count reaches the limit, so the operator marks the job
    Failed and cleanPodPolicy Running deletes the restarting pod with its status (pkg/core/job.go PastBackoffLimit,
    pkg/controller.v1/common/job.go ReconcileJobs then DeletePodsAndServices). `wait` asks the real scheduler, on
    the real API server, between the steps."""

    def __init__(self, ctx: Ctx, sched: KubernetesScheduler) -> None:
        self.ctx, self.sched, self.step = ctx, sched, 0
        self.master = _kubeflow_pod(ctx, ctx.node(), "master", 0)

    def _container(self, **state: Any) -> dict[str, Any]:
        return {"name": "pytorch", "image": IMAGE, "imageID": "", "ready": "running" in state.get("state", {}), **state}

    def _conditions(self, *extra: dict[str, str]) -> None:
        from kubernetes import client

        conditions = [
            {"type": "Created", "status": "True", "reason": "PyTorchJobCreated", "message": "created"},
            {
                "type": "Running",
                "status": "False" if extra else "True",
                "reason": "PyTorchJobRunning",
                "message": "PyTorchJob mnist is running.",
            },
            *extra,
        ]
        client.CustomObjectsApi(self.ctx.api).patch_namespaced_custom_object_status(
            "kubeflow.org", "v1", self.ctx.namespace, "pytorchjobs", "mnist", {"status": {"conditions": conditions}}
        )

    def status(self, job_id: str) -> Any:
        core, ns = self.ctx.core, self.ctx.namespace
        if self.step == 0:
            core.patch_namespaced_pod_status(
                self.master,
                ns,
                {
                    "status": {
                        "phase": "Running",
                        "containerStatuses": [self._container(restartCount=0, state={"running": {"startedAt": now()}})],
                    }
                },
            )
            self._conditions()
        elif self.step == 1:
            core.patch_namespaced_pod_status(
                self.master,
                ns,
                {
                    "status": {
                        "phase": "Running",
                        "containerStatuses": [
                            self._container(
                                restartCount=1,
                                state={"waiting": {"reason": "CrashLoopBackOff"}},
                                lastState={
                                    "terminated": {
                                        "exitCode": 3,
                                        "reason": "Error",
                                        "startedAt": now(),
                                        "finishedAt": now(),
                                    }
                                },
                            )
                        ],
                    }
                },
            )
        elif self.step == 2:
            self._conditions(
                {"type": "Failed", "status": "True", "reason": "PyTorchJobFailed", "message": FAILED_AT_LIMIT}
            )
            core.delete_namespaced_pod(self.master, ns, grace_period_seconds=0)
        self.step += 1
        return self.sched.status(job_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sched, name)


def test_wait_keeps_the_exit_status_of_a_job_whose_pods_went_as_it_failed(ctx: Ctx, capsys: Any) -> None:
    from hpctrain.cli.submit import wait

    sched = ctx.scheduler()
    spec = job(nodes=1, max_restarts=1)
    sched.submit(spec, sched.render(spec))
    operator = _Operator(ctx, sched)
    assert wait(operator, "mnist", "submit", poll_s=0.01) == 3
    assert operator.step == 3 and sched.status("mnist").replicas == ()  # the end was seen with no pod left
    assert capsys.readouterr().err.splitlines()[-1] == "hpctrain submit: job mnist ended FAILED with exit status 3"


def test_a_failed_jobs_exit_status_comes_from_the_operators_events_or_is_said_unknown(ctx: Ctx, capsys: Any) -> None:
    """When `wait` saw no pod (it started after the end, or the pod went between two polls), the exit status is the
    last non-zero one of training-operator's ExitedWithCode events on the job (pkg/controller.v1/common/pod.go
    ReconcilePods: "Pod: NS.POD exited with code N", a Normal event on the PyTorchJob); with none, `wait` says that
    it could not learn it."""
    from kubernetes import client

    from hpctrain.cli.submit import wait

    sched = ctx.scheduler()
    spec = job(nodes=1, max_restarts=1)
    sched.submit(spec, sched.render(spec))
    client.CustomObjectsApi(ctx.api).patch_namespaced_custom_object_status(
        "kubeflow.org",
        "v1",
        ctx.namespace,
        "pytorchjobs",
        "mnist",
        {
            "status": {
                "conditions": [
                    {"type": "Failed", "status": "True", "reason": "PyTorchJobFailed", "message": FAILED_AT_LIMIT}
                ]
            }
        },
    )
    assert sched.status("mnist").exit_code is None
    assert wait(sched, "mnist", "submit", poll_s=0.01) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "hpctrain submit: job mnist ended FAILED; hpctrain could not learn its exit status (its processes' records "
        "are gone and the scheduler kept none): exiting with 1"
    )

    uid = sched.get_object("mnist")["metadata"]["uid"]
    for i, (code, seconds) in enumerate([(3, 10), (0, 20), (137, 30), (5, 40)]):
        involved = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "name": "mnist",
            "namespace": ctx.namespace,
            "uid": uid if i < 3 else "an-earlier-job-of-the-name",
        }
        at = f"2026-01-01T00:00:{seconds}Z"
        ctx.core.create_namespaced_event(
            ctx.namespace,
            {
                "metadata": {"name": f"mnist.{i}"},
                "type": "Normal",
                "reason": "ExitedWithCode",
                "count": 1,
                "message": f"Pod: {ctx.namespace}.mnist-master-0 exited with code {code}",
                "firstTimestamp": at,
                "lastTimestamp": at,
                "involvedObject": involved,
                "source": {"component": "pytorchjob-controller"},
            },
        )
    assert sched.status("mnist").exit_code == 137  # the newest non-zero one of this job
    assert wait(sched, "mnist", "submit", poll_s=0.01) == 137


# ---- a TrainJob's restart budget: hpctrain's own TrainingRuntime ----------------------------------------------


def _runtimes(ctx: Ctx) -> dict[str, dict[str, Any]]:
    from kubernetes import client

    listed = client.CustomObjectsApi(ctx.api).list_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", ctx.namespace, "trainingruntimes"
    )["items"]
    return {r["metadata"]["name"]: r for r in listed}


def test_trainjob_max_restarts_runs_on_its_own_runtime_owned_by_the_job(ctx: Ctx) -> None:
    """submit makes the runtime first (Trainer refuses a TrainJob whose TrainingRuntime is missing), then the job, then
    makes the job the runtime's owner (the garbage collector removes it with the job; this server runs none). A
    submit refused on the way leaves no runtime; a runtime hpctrain made earlier for the name is replaced; one it did
    not make is refused, untouched."""
    from kubernetes import client

    custom = client.CustomObjectsApi(ctx.api)
    sched = ctx.scheduler(api="trainjob")
    spec = job(nodes=2, max_restarts=2)
    assert sched.submit(spec, sched.render(spec)) == "mnist"
    trainjob = sched.get_object("mnist")
    assert trainjob["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
        "name": "hpctrain-mnist",
    }
    runtime = _runtimes(ctx)["hpctrain-mnist"]
    assert runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 2
    assert runtime["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "name": "mnist",
            "uid": trainjob["metadata"]["uid"],
        }
    ]
    # The same name again, without --replace: refused, the job's runtime untouched.
    with pytest.raises(UserError, match="a TrainJob named 'mnist' already exists"):
        sched.submit(spec.replace(max_restarts=3), sched.render(spec.replace(max_restarts=3)))
    assert _runtimes(ctx)["hpctrain-mnist"]["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 2

    # A refused TrainJob (here: the server's 409 for a name taken by a job on the cluster's runtime) takes its new
    # runtime away again.
    plain = job(name="other")
    sched.submit(plain, sched.render(plain))
    budgeted = plain.replace(max_restarts=1)
    with pytest.raises(UserError, match="a TrainJob named 'other' already exists"):
        sched.submit(budgeted, sched.render(budgeted))
    assert "hpctrain-other" not in _runtimes(ctx)

    # A runtime left by a submit that died before its TrainJob existed: replaced.
    stale = sched.render(job(name="stale", max_restarts=1)).text.split("---\n")[0]
    import yaml

    body = yaml.safe_load(stale)
    body["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] = 9
    custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", ctx.namespace, "trainingruntimes", body)
    assert sched.submit(job(name="stale", max_restarts=1), sched.render(job(name="stale", max_restarts=1))) == "stale"
    assert _runtimes(ctx)["hpctrain-stale"]["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 1

    # One that is not hpctrain's: refused and left as it was.
    body["metadata"] = {"name": "hpctrain-theirs", "labels": {"team": "vision"}}
    custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", ctx.namespace, "trainingruntimes", body)
    with pytest.raises(UserError, match="has a TrainingRuntime 'hpctrain-theirs' that hpctrain did not make"):
        sched.submit(job(name="theirs", max_restarts=1), sched.render(job(name="theirs", max_restarts=1)))
    assert "theirs" not in [s.job_id for s in sched.list_jobs()]
    assert _runtimes(ctx)["hpctrain-theirs"]["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 9


def _restricted(ctx: Ctx, name: str, runtime_verbs: list[str], trainjob_verbs: list[str]) -> Any:
    """An ApiClient of a real, restricted user of this server: a ServiceAccount of the test's namespace whose Role
    allows `runtime_verbs` on trainingruntimes and `trainjob_verbs` on trainjobs (RBAC, evaluated by the server),
    authenticated by a token from the server's own TokenRequest API."""
    from kubernetes import client

    core, rbac = ctx.core, client.RbacAuthorizationV1Api(ctx.api)
    core.create_namespaced_service_account(ctx.namespace, {"metadata": {"name": name}})
    group = "trainer.kubeflow.org"
    rules = [
        {"apiGroups": [group], "resources": ["trainingruntimes"], "verbs": runtime_verbs},
        {"apiGroups": [group], "resources": ["trainjobs"], "verbs": trainjob_verbs},
        {"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["get", "list"]},
    ]
    rbac.create_namespaced_role(ctx.namespace, {"metadata": {"name": name}, "rules": rules})
    rbac.create_namespaced_role_binding(
        ctx.namespace,
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ctx.namespace}],
        },
    )
    token = core.create_namespaced_service_account_token(name, ctx.namespace, {"spec": {"audiences": []}})
    config = copy.copy(ctx.api.configuration)  # the server and its TLS settings, as the kubeconfig gave them
    config.api_key = {"BearerToken": f"Bearer {token.status.token}"}
    config.refresh_api_key_hook = None  # the admin's token would come back
    return client.ApiClient(config)


ALL_BUT_PATCH = ["create", "get", "list", "delete"]


def test_trainjob_max_restarts_needs_no_patch_of_runtimes_and_runs_only_when_owned(ctx: Ctx) -> None:
    """A user who may create and delete runtimes but not patch them (a real RBAC Role on the real server): before,
    submit failed with 403 after the TrainJob was made, which ran on an unowned runtime that outlived `cancel`. Now
    the TrainJob is made suspended, its runtime made again owned by it, then resumed: submit succeeds, the runtime
    is the job's."""
    api = _restricted(ctx, "no-patch-runtimes", ALL_BUT_PATCH, ALL_BUT_PATCH + ["patch"])
    sched = KubernetesScheduler(ctx.scheduler(api="trainjob").options, api_client=api)
    spec = job(nodes=2, max_restarts=2)
    assert sched.submit(spec, sched.render(spec)) == "mnist"
    trainjob = sched.get_object("mnist")
    assert not trainjob["spec"].get("suspend")
    assert _runtimes(ctx)["hpctrain-mnist"]["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "name": "mnist",
            "uid": trainjob["metadata"]["uid"],
        }
    ]


def test_a_trainjob_submit_refused_at_any_step_leaves_nothing_behind(ctx: Ctx) -> None:
    """Real RBAC refusals at each step after the first: the TrainJob's create (no create on trainjobs), the runtime's
    re-creation as owned (no delete on runtimes: then the unowned one cannot go either, and the error says so), and
    the resume (no patch on trainjobs). Each is one line with exit status 2, and what was made is gone."""
    spec = job(nodes=1, max_restarts=1)

    def submit(user: str, runtime_verbs: list[str], trainjob_verbs: list[str]) -> str:
        api = _restricted(ctx, user, runtime_verbs, trainjob_verbs)
        sched = KubernetesScheduler(ctx.scheduler(api="trainjob").options, api_client=api)
        with pytest.raises(UserError) as err:
            sched.submit(spec, sched.render(spec))
        assert err.value.exit_code == 2 and "\n" not in str(err.value)
        assert "mnist" not in [s.job_id for s in ctx.scheduler(api="trainjob").list_jobs()]
        return str(err.value)

    said = submit("no-trainjobs", ALL_BUT_PATCH, ["get", "list", "delete", "patch"])
    assert "forbidden" in said and "nothing was left behind" in said, said
    assert "hpctrain-mnist" not in _runtimes(ctx)

    said = submit("no-resume", ALL_BUT_PATCH, ALL_BUT_PATCH)
    assert said.startswith("resuming the suspended TrainJob mnist in namespace ") and "forbidden (403)" in said, said
    assert "create and patch trainjobs" in said and said.endswith("nothing was left behind"), said
    assert "hpctrain-mnist" not in _runtimes(ctx)

    said = submit("no-delete", ["create", "get", "list"], ALL_BUT_PATCH + ["patch"])
    assert said.startswith("making the TrainingRuntime hpctrain-mnist the TrainJob's own"), said
    assert said.endswith("could not delete TrainingRuntime hpctrain-mnist: delete it by hand (`kubectl delete`)"), said
    assert "ownerReferences" not in _runtimes(ctx)["hpctrain-mnist"]["metadata"]


def test_a_runtime_another_trainjob_owns_is_refused_and_never_deleted(ctx: Ctx) -> None:
    """A TrainingRuntime named for this job but owned by another TrainJob: before, submit said "a TrainJob named
    mnist already exists" and --replace deleted it. Now one line names its owner, with or without --replace, and the
    runtime and its owner stay."""
    from kubernetes import client

    custom = client.CustomObjectsApi(ctx.api)
    sched = ctx.scheduler(api="trainjob")
    other = job(name="other", nodes=1, max_restarts=1)
    sched.submit(other, sched.render(other))
    owner = _runtimes(ctx)["hpctrain-other"]["metadata"]["ownerReferences"]
    body = sched.render(job(nodes=1, max_restarts=1)).text.split("---\n")[0]
    import yaml

    runtime = yaml.safe_load(body)
    runtime["metadata"]["ownerReferences"] = owner
    custom.create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", ctx.namespace, "trainingruntimes", runtime
    )
    for replace in (False, True):
        s = ctx.scheduler(api="trainjob", replace=replace)
        with pytest.raises(UserError) as err:
            s.submit(job(nodes=1, max_restarts=1), s.render(job(nodes=1, max_restarts=1)))
        assert str(err.value) == (
            f"namespace {ctx.namespace} has a TrainingRuntime 'hpctrain-mnist' owned by the TrainJob 'other', not "
            "by a TrainJob 'mnist'; --max-restarts needs that name for the job's own runtime: pick another --job-name"
        )
        assert _runtimes(ctx)["hpctrain-mnist"]["metadata"]["ownerReferences"] == owner
        assert [s.job_id for s in sched.list_jobs()] == ["other"]


def test_submit_wait_says_what_it_has_seen_of_a_job_that_gets_no_pods(ctx: Ctx, tmp_path) -> None:
    """No controller runs on this server, as when the Kubeflow operator (or the documented stand-ins) is not running:
    the job never gets pods. `submit --wait` said PENDING once and then nothing, for ever; now, after
    HPCTRAIN_WAIT_NOTE_S (here 1 s; a minute by default) without a change, it says what it has seen (no pods, the
    job's conditions: none) and keeps waiting, until Ctrl-C, which leaves the job."""
    import queue
    import signal
    import threading
    import time

    from k8s_fixtures import CONTEXT, DEADLINE_S
    from training_helpers import start_hpctrain

    proc = start_hpctrain(
        *("submit", "--scheduler", "kubernetes", "--context", CONTEXT, "--namespace", ctx.namespace),
        *("--image", IMAGE, "--job-name", "no-pods", "--no-check", "--wait", "--", "python3", "-c", "pass"),
        cwd=tmp_path,
        env={"HPCTRAIN_WAIT_NOTE_S": "1"},
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while not any("is still PENDING after" in line for line in seen):
            assert time.monotonic() < deadline and proc.poll() is None, seen
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                pass
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    note = next(line for line in seen if "is still PENDING after" in line)
    assert note.startswith("hpctrain submit: job no-pods is still PENDING after "), note
    assert (
        "no pods yet (no controller has set a condition): the Kubeflow controller creates them (is the PyTorchJob "
        "operator running?); still waiting (Ctrl-C stops waiting; the job stays queued until cancelled)"
    ) in note, note
    assert "no-pods" in [s.job_id for s in ctx.scheduler().list_jobs()]


def test_logs_follow_waits_for_the_pods_of_a_job_just_submitted(ctx: Ctx) -> None:
    """`logs JOB -f` (and the web console's page of a job it just submitted) of a job whose pods are still to come
    waits, saying once what for, instead of failing at once; it ends when the job does (here: cancelled, with no
    controller to make pods), with the line that says what is left."""
    import threading
    import time

    sched = ctx.scheduler()
    sched.submit(job(), sched.render(job()))
    heard: list[str] = []
    ended: list[str] = []

    def follow() -> None:
        try:
            ended.extend(sched.logs("mnist", follow=True, say=heard.append))
        except UserError as err:
            ended.append(str(err))

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    deadline = time.monotonic() + 60  # a bound on waiting, never asserted on
    while not heard and time.monotonic() < deadline:
        time.sleep(0.2)
    assert heard == [f"mnist is PENDING: waiting for its pods to be created (`{sched.command('status', 'mnist')}` "
                     "says why it waits)"]  # fmt: skip
    assert follower.is_alive() and ended == []
    sched.cancel("mnist")
    follower.join(timeout=60)
    assert not follower.is_alive() and heard == heard[:1]
    assert ended == [f"mnist has no pods yet: see `{sched.command('status', 'mnist')}` for why"]


def test_logs_of_a_replica_whose_pod_went_while_another_remains_are_its_kept_log(ctx: Ctx, tmp_path) -> None:
    """cleanPodPolicy Running deletes a finished job's running pods (an elastic job succeeds once any worker has, and
    the others go): `logs JOB --replica worker-0` then reads what worker-0 kept in the run directory, saying so,
    rather than refusing because another replica's pod is still there; a replica with neither is refused naming the
    replicas whose pods are there."""
    sched = ctx.scheduler(volumes=(f"host:{tmp_path}:/mnt/runs",))
    spec = job(nodes=2)
    sched.submit(spec, sched.render(spec))
    _kubeflow_pod(ctx, None, "worker", 1)
    kept = tmp_path / "mnist" / "pod-logs"
    kept.mkdir(parents=True)
    (kept / "mnist-worker-0.log").write_text("step 1\nstep 2\n")
    heard: list[str] = []
    assert list(sched.logs("mnist", replica="worker-0", say=heard.append)) == ["step 1", "step 2"]
    assert heard == [
        f"mnist has no pod worker-0 now: the log worker-0 kept in its run directory ({kept}/mnist-worker-0.log)"
    ]
    with pytest.raises(UserError, match=r"mnist has no replica 'worker-7': use one of worker-1$"):
        sched.logs("mnist", replica="worker-7")
