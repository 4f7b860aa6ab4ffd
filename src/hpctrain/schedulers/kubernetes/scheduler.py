"""The live side of the Kubernetes backend: check, submit, status, list, logs, cancel and the cluster view
(what the CLI shows of them, as data: display.py; the checks on the submit host: local.py; reading the objects it
fetches: objects.py; the checks against the cluster: checks.py; status, list, logs and cancel: jobs.py).

Through the official `kubernetes` client, configured from the kubeconfig (its current context, or `context`)
or from the in-cluster service account. The client is imported on first live use, so rendering (`--dry-run`)
and the rest of hpctrain never load it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from hpctrain.errors import UserError
from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers import base
from hpctrain.schedulers.base import ClusterView, JobStatus, Outcome, Rendered, View
from hpctrain.schedulers.kubernetes.api.answers import guarded
from hpctrain.schedulers.kubernetes.checks.live import LiveChecks, _api_error
from hpctrain.schedulers.kubernetes.queries.live_jobs import LiveJobs
from hpctrain.schedulers.kubernetes.queries.kubeflow_objects import node_views, requests_by_node
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
from hpctrain.schedulers.kubernetes.api.rest import NODES, PODS, RawApi, path
from hpctrain.schedulers.kubernetes.manifests import render as r
from hpctrain.schedulers.kubernetes.queries import display

REPLACE_WAIT_S = 120
"""How long `submit --replace` waits for the old job of the name (and its pods) to be gone."""
DRY_RUN_NOTE = (
    "--dry-run checked the job here and skipped the checks that need the live cluster "
    "(namespace, node room, quota, volumes, CRD); `hpctrain check --scheduler kubernetes` with the "
    "same options runs them"
)


@guarded  # an answer of the wrong shape, read in any of its methods, is one line (answers.py)
class KubernetesScheduler(LiveChecks, LiveJobs):
    name = "kubernetes"
    dry_run_note = DRY_RUN_NOTE
    progress = staticmethod(base.progress)

    def __init__(self, options: KubernetesOptions, context: str | None = None, api_client: Any = None) -> None:
        self.options = options
        self.context = context
        self._given_client = api_client
        self.replaced: JobStatus | None = None
        """The job of the same name that `submit` deleted first (--replace), as it was then."""
        self.group, self.version, self.plural, self.kind = r.api_of(options)

    # ---- the client, loaded on first use ---------------------------------------------------------------------

    @functools.cached_property
    def api_client(self) -> Any:
        """The given client as is (tests), else one from the kubeconfig with timeouts and a size cap
        (schedulers.kubernetes.client)."""
        if self._given_client is not None:
            return self._given_client
        from hpctrain.schedulers.kubernetes.api.client import load_api_client

        return load_api_client(self.context)

    @functools.cached_property
    def raw(self) -> RawApi:
        """What the views and checks read: the API server's JSON as dicts, without the client's generated APIs and
        models (rest.py)."""
        return RawApi(self.api_client)

    @functools.cached_property
    def core(self) -> Any:
        from kubernetes import client

        from hpctrain.schedulers.kubernetes.api.client import translating

        return translating(client.CoreV1Api(self.api_client))

    @functools.cached_property
    def custom(self) -> Any:
        from kubernetes import client

        from hpctrain.schedulers.kubernetes.api.client import translating

        return translating(client.CustomObjectsApi(self.api_client))

    @functools.cached_property
    def scheduling(self) -> Any:
        from kubernetes import client

        from hpctrain.schedulers.kubernetes.api.client import translating

        return translating(client.SchedulingV1Api(self.api_client))

    @property
    def namespace(self) -> str:
        return self.options.namespace

    def command(self, name: str, *words: str) -> str:
        """`hpctrain NAME ... WORDS` with the flags that find this job again (scheduler, namespace, context, API):
        every command this backend suggests works when pasted, wherever the defaults point. NAME may be two words
        (`dev stop`); --k8s-api is left out where it is the default, which the commands around the job use."""
        import shlex

        flags = ["--scheduler", "kubernetes", "--namespace", self.namespace]
        if self.context:
            flags += ["--context", self.context]
        if self.options.api != "pytorchjob":
            flags += ["--k8s-api", self.options.api]
        return shlex.join(["hpctrain", *name.split(), *flags, *words])

    def kubectl(self, *words: str) -> str:
        """`kubectl --context CONTEXT WORDS` (no --context where none was given: the current one)."""
        from hpctrain.schedulers.kubernetes.api.kubeconfig import kubectl

        return kubectl(self.context, *words)

    def services(self) -> Any:
        """What `dev`, `tensorboard --on-cluster`, `top` and `debug stacks` ask of Kubernetes (schedulers.services)."""
        from hpctrain.schedulers.kubernetes.services.service_pods import KubernetesServices

        return KubernetesServices(self)

    # ---- render, check, submit -------------------------------------------------------------------------------

    def render(self, job: JobSpec) -> Rendered:
        return r.rendered(job, self.options)

    def local_check(
        self, job: JobSpec, recipe: Any = None, check_data: Callable[[Any], None] | None = None
    ) -> list[str]:
        """What can be checked on the submit host (schedulers.kubernetes.local), as Slurm's local checks: `check`,
        `submit` and `submit --dry-run` run it besides `check` (the checks against the live cluster)."""
        from hpctrain.schedulers.kubernetes.checks.submit_host import local_problems

        return local_problems(job, self.options, recipe, check_data)

    def uses_gpus(self, job: JobSpec) -> bool:
        return bool(job.resources.gpus_per_node)

    def missing_prerequisites(self, job: JobSpec) -> list[str]:
        return []  # the image is pulled by the cluster, the volumes are there: nothing is made here first

    def summary(self, job: JobSpec, rendered: Rendered) -> str:
        r = job.resources
        payload = rendered.payload if isinstance(rendered.payload, dict) else {}
        namespace = payload.get("metadata", {}).get("namespace")
        return (
            f"{job.name}: {payload.get('kind', 'job')}, {r.nodes} pod(s) x {r.nproc_per_node} process(es)"
            + (f", namespace {namespace}" if namespace else "")
            + (f", {r.gpus_per_node} GPU(s) per pod" if r.gpus_per_node else "")
            + (f", time {job.time}" if job.time else "")
        )

    def record(self, job: JobSpec, rendered: Rendered, job_id: str, description: dict[str, Any]) -> list[str]:
        from hpctrain.schedulers.kubernetes.queries.display import record

        return record(self, job, rendered, job_id, description)

    def follow_note(self, job_id: str) -> str | None:
        """A job just created has no pods to read a log from: `submit --follow` waits like --wait."""
        return (
            f"--follow prints Slurm jobs' output; here it waits like --wait (the log: "
            f"`{self.command('logs', job_id)} -f`)"
        )

    def path_here(self, pod_path: str) -> tuple[str | None, str]:
        """(where this machine sees what the pods see at `pod_path`, or None; why not): see local.path_here."""
        from hpctrain.schedulers.kubernetes.checks.submit_host import path_here

        return path_here(pod_path, self.options.parsed_volumes)

    def submit(self, job: JobSpec, rendered: Rendered) -> str:
        from hpctrain.schedulers.kubernetes.manifests.runtime import own_runtime, submit_with

        runtime = own_runtime(job, self.options)  # a TrainJob's restart budget: its own TrainingRuntime (runtime.py)
        if runtime is not None:
            return submit_with(self, job, runtime, rendered.payload)
        return self._create(job, rendered.payload)["metadata"]["name"]

    def _create(self, job: JobSpec, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create the job object; the object the API server made."""
        from kubernetes.client.rest import ApiException

        # Strict: a server that knows fieldValidation (Kubernetes 1.25+) refuses a field the cluster's CRD lacks
        # instead of dropping it; an older one ignores the parameter, and `check` compares the served schema.
        create = functools.partial(
            self.custom.create_namespaced_custom_object,
            self.group,
            self.version,
            self.namespace,
            self.plural,
            manifest,
            field_validation="Strict",
        )
        try:
            try:
                created = create()
            except ApiException as err:
                if err.status != 409 or not self.options.replace:
                    raise
                self.replaced = self._delete_and_wait(job.name)
                created = create()
        except ApiException as err:
            if err.status == 409:
                raise UserError(
                    f"a {self.kind} named {job.name!r} already exists in namespace {self.namespace}: pick "
                    f"another --job-name, cancel the old one (`{self.command('cancel', job.name)}`), or "
                    "pass --replace"
                ) from None
            if err.status == 404:
                raise self._missing_on_create() from None
            raise _api_error(err, f"creating {self.kind} {job.name}") from None
        return created

    def _delete_and_wait(self, name: str) -> JobStatus | None:
        """--replace: delete the job of this name, running or ended, with its pods (their grace period to
        checkpoint), and wait until it is gone; its status as it was (None: it went meanwhile)."""
        import time

        try:
            old = self.status(name)
        except base.JobNotFound:  # gone meanwhile
            return None
        self.cancel(name)
        deadline = time.monotonic() + REPLACE_WAIT_S
        while time.monotonic() < deadline:
            try:
                self.get_object(name)
            except base.JobNotFound:
                return old
            time.sleep(0.5)
        raise UserError(
            f"--replace: the old {self.kind} {name} ({old.state}) is still being deleted after "
            f"{REPLACE_WAIT_S} s (its pods stopping, or the cluster's garbage collector has not removed it); "
            f"nothing new was created: `{self.command('status', name)}` shows when it is gone"
        )

    def _missing_on_create(self) -> UserError:
        """The API server answers 404 to a create when the CRD or the namespace is missing: say which."""
        from kubernetes.client.rest import ApiException

        problems: list[str] = []
        try:
            problems += self._crd_problems()
            self._namespace_problems(problems)
        except ApiException:
            pass
        if problems:
            return UserError(problems[0])
        return UserError(
            f"cannot create the {self.kind}: namespace {self.namespace!r} or the CRD is missing; "
            f"run `{self.command('check')}` with the job's options to see which"
        )

    # ---- what the CLI shows (display.py makes it a View or an Outcome) ------------------------------------------

    def status_view(self, job_id: str | None, all_users: bool = False) -> View:
        """Without a job: the namespace's PyTorchJobs (or TrainJobs); with one: its conditions, each replica's pod
        phase, node and restarts, and why it waits (scheduler events)."""

        if job_id is None:
            return display.jobs_view(self.summaries(restarts=False), self.namespace)
        return display.job_view(self.status(job_id))

    def cluster_view(self, partition: str | None = None) -> View:

        return display.cluster_view(self.cluster())

    def cancel_and_wait(
        self,
        job_id: str,
        wait_s: float,
        signal: str | None = None,
        full: bool = False,
        say: Callable[[str], None] | None = None,
    ) -> Outcome:
        """The job object is deleted (foreground); its pods get SIGTERM and their grace period (--signal-grace at
        submit) to write a checkpoint before SIGKILL."""

        return display.cancel(self, job_id, wait_s, say or (lambda line: None))

    def preempt(
        self,
        job_id: str,
        signal: str | None = None,
        steps: bool = False,
        follow: bool = False,
        timeout_s: float = 600.0,
        say: Callable[[str], None] | None = None,
    ) -> Outcome:
        raise UserError(
            "a Kubernetes job's time-limit warning comes from its own timer in the pods (--time), "
            "not from outside: `hpctrain cancel` (its pods get SIGTERM and --signal-grace to checkpoint) "
            "or deleting one pod (`kubectl delete pod`) rehearses a restart"
        )

    # ---- cluster view ----------------------------------------------------------------------------------------

    def cluster(self) -> ClusterView:
        """Every node against what its running pods request. The pods are summed a page at a time and the nodes
        made views a page at a time, so that what is kept grows with the nodes, not the pods (40,000 running pods
        kept as JSON were 400 MB). Its time grows with the pods: Kubernetes keeps no per-node total of the
        requests, so each running pod is read, as `kubectl describe nodes` does (docs/benchmarks.md)."""
        used = requests_by_node(self.running_pods())
        nodes = [view for page in self.raw.pages(NODES, "listing the nodes") for view in node_views(page, used)]
        lines: list[str] = []
        for q in self.quotas():
            status = q.get("status") or {}
            hard = status.get("hard") or (q.get("spec") or {}).get("hard") or {}
            use = status.get("used") or {}
            for key in sorted(hard):
                lines.append(f"{self.namespace}/{q['metadata']['name']} {key}: {use.get(key, '0')} of {hard[key]} used")
        return ClusterView(nodes=tuple(sorted(nodes, key=lambda n: n.name)), quota=tuple(lines))

    def running_pods(self, node: str | None = None) -> Iterator[dict[str, Any]]:
        """The pods bound to a node (to `node`) and not ended, which take from it, as they arrive (a page at a
        time; the API server filters them). One node's are asked of the API server's cache (resourceVersion 0):
        a field selector read from etcd makes the server decode every pod of the cluster for each node asked."""
        bound = f"spec.nodeName={node}" if node else "spec.nodeName!="
        cached = {"resourceVersion": "0"} if node else {}
        selector = f"{bound},status.phase!=Succeeded,status.phase!=Failed"
        for page in self.raw.pages(PODS, "listing the pods", fieldSelector=selector, **cached):
            yield from page

    def quotas(self) -> list[dict[str, Any]]:
        """The namespace's ResourceQuotas, as JSON."""
        return self.raw.list(path("api", "v1", "namespaces", self.namespace, "resourcequotas"), "listing the quotas")
