"""The services around the jobs on Kubernetes (hpctrain.schedulers.service_api.Services), what `dev`, `tensorboard
--on-cluster`, `top` and `debug stacks` ask of this backend: KubernetesServices, reached through
KubernetesScheduler.services().

Each service is a server in a pod: render the Pod (and the Secret holding its token) as plain dicts (pure), create it
(pods.py: create, find and delete through the official client) and reach it with `kubectl port-forward`. Dev sessions
(JupyterLab) and TensorBoard are such pods; `top`'s probe and `debug stacks` run in the job's own pods through the API
server's exec stream (pods.py). Volumes and /dev/shm come from KubernetesOptions exactly as for training jobs. The
Kubernetes client is imported on first use only.
"""

from __future__ import annotations

import datetime as dt
import secrets
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.jobs.spec import Resources
from hpctrain.jobs.values import parse_time_limit
from hpctrain.schedulers.kubernetes.api.answers import guarded
from hpctrain.schedulers.kubernetes.api.kubeconfig import kubectl
from hpctrain.schedulers.kubernetes.manifests.options import APIS, KubernetesOptions, memory_quantity
from hpctrain.schedulers.kubernetes.manifests.pod_template import pod_placement, pod_volumes
from hpctrain.schedulers.kubernetes.services.pods import SERVICE_LABEL
from hpctrain.schedulers.kubernetes.manifests.ranges import check_integers
from hpctrain.schedulers.kubernetes.manifests.render import render_yaml
from hpctrain.schedulers.service_api import OnStep, Placement, RemoteStacks, ServiceAccess, Step
from hpctrain.servers import jupyter
from hpctrain.servers import tensorboard as tbserver
from hpctrain.servers.common import write_private
from hpctrain.servers.sessions import (
    CONNECTION_FILE,
    TOKEN_FILE,
    DevConfig,
    SaveOutcome,
    SessionView,
    forget,
    make_session_dir,
    now,
)
from hpctrain.servers.top import PROGRESS_PROBE, JobNotRunning, TopSample, parse_probe, ranks_of
from hpctrain.schedulers.kubernetes.services import pods, image_build

MANAGED_BY = {"app.kubernetes.io/managed-by": "hpctrain"}
NAME_LABEL = "hpctrain.io/name"
TENSORBOARD_PORT = 6006


@dataclass(frozen=True)
class ServicePod:
    name: str
    kind: str
    """dev or tensorboard: the value of SERVICE_LABEL."""
    command: tuple[str, ...]
    port: int
    resources: Resources = field(default_factory=Resources)
    time: str | None = None
    """The time limit as typed (hpctrain.jobs.values), rendered as activeDeadlineSeconds: the pod stops then."""
    secret_env: tuple[tuple[str, str], ...] = ()
    """(variable, key) pairs read from the pod's Secret `name` (e.g. the Jupyter token)."""
    env: tuple[tuple[str, str], ...] = ()
    ready_path: str | None = None
    """An HTTP path that answers 200 once the server is up: the container's readinessProbe."""


def resources_of(r: Resources) -> dict[str, str]:
    out = {"cpu": str(r.cpus_per_task)}
    if r.mem_bytes:
        out["memory"] = memory_quantity(r.mem_bytes)
    if r.gpus_per_node:
        out["nvidia.com/gpu"] = str(r.gpus_per_node)
    return out


def render_pod(pod: ServicePod, options: KubernetesOptions) -> dict[str, Any]:
    """The Pod manifest. Pure."""
    if not options.image:
        raise UserError(
            f"a {pod.kind} pod needs a container image: add --image (e.g. --image quay.io/jupyter/pytorch-notebook)"
        )
    volumes, mounts = pod_volumes(options)
    env = [{"name": k, "value": v} for k, v in pod.env]
    env += [{"name": var, "valueFrom": {"secretKeyRef": {"name": pod.name, "key": key}}} for var, key in pod.secret_env]
    requests = resources_of(pod.resources)
    container: dict[str, Any] = {
        "name": pod.kind,
        "image": options.image,
        "command": list(pod.command),
        "ports": [{"name": "http", "containerPort": pod.port}],
        "resources": {"requests": requests, "limits": requests},
    }
    if pod.ready_path is not None:
        container["readinessProbe"] = {"httpGet": {"path": pod.ready_path, "port": "http"}, "periodSeconds": 2}
    if env:
        container["env"] = env
    if mounts:
        container["volumeMounts"] = mounts
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if volumes:
        spec["volumes"] = volumes
    if pod.time is not None:
        spec["activeDeadlineSeconds"] = parse_time_limit(pod.time)
    spec.update(pod_placement(options))
    labels = {**MANAGED_BY, **options.label_map, SERVICE_LABEL: pod.kind, NAME_LABEL: pod.name}
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": options.namespace, "labels": labels},
        "spec": spec,
    }
    check_integers(manifest)  # --time past what the API server takes for a pod (ranges.py), before anything is made
    return manifest


def render_secret(pod: ServicePod, options: KubernetesOptions, data: dict[str, str]) -> dict[str, Any]:
    labels = {**MANAGED_BY, SERVICE_LABEL: pod.kind, NAME_LABEL: pod.name}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": pod.name, "namespace": options.namespace, "labels": labels},
        "stringData": data,
    }


def port_forward_command(namespace: str, pod_name: str, local_port: int, port: int, context: str | None = None) -> str:
    """The `kubectl port-forward` that reaches the pod, with the kubeconfig context it was created through."""
    return kubectl(context, "port-forward", "-n", namespace, f"pod/{pod_name}", f"{local_port}:{port}")


# ---- what `dev`, `tensorboard --on-cluster`, `top` and `debug stacks` ask of Kubernetes ---------------------------


@guarded  # an answer of the wrong shape, read in any of its methods, is one line
class KubernetesServices:
    """Kubernetes' hpctrain.schedulers.service_api.Services, on the KubernetesScheduler that made it."""

    name = "kubernetes"

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        """A KubernetesScheduler: its namespace, context and (lazily loaded) client."""

    def options(self, placement: Placement) -> KubernetesOptions:
        """The pod's options from the placement's; the Slurm flags are refused with the Kubernetes way."""
        own = placement.options
        if any(own.get(k) for k in ("conda_env", "venv", "modules", "mounts")):
            raise UserError(
                "--conda-env/--venv/--module/--mount apply to Slurm: on Kubernetes the --image is the "
                "environment and --volume mounts storage"
            )
        if own.get("gres"):
            raise UserError("--gres shard:N is a Slurm resource: on Kubernetes ask for whole GPUs (--gpus-per-node N)")
        if own.get("gpu_type"):
            raise UserError(
                "--gpu-type is Slurm's: on Kubernetes the GPU model is a node label, e.g. "
                "nvidia.com/gpu.product, which the pod's node selector picks"
            )
        return KubernetesOptions(
            namespace=self.scheduler.namespace,
            image=placement.image,
            shm=own.get("shm"),
            volumes=tuple(own.get("volumes", ())),
        )

    def dev_render(self, cfg: DevConfig, placement: Placement) -> str:
        return render_yaml(render_dev_pod(cfg, self.options(placement)))

    def dev_start(
        self, cfg: DevConfig, placement: Placement, wait_s: float, local_port: int | None, on_step: OnStep
    ) -> list[str]:
        sched = self.scheduler
        conn = start(
            cfg,
            self.options(placement),
            sched.core,
            None,
            wait_s,
            local_port,
            on_step,
            context=sched.context,
            stop=sched.command("dev stop", cfg.name),
        )
        return instructions(cfg, conn)

    def dev_view(self, state_dir: Path, conn: dict[str, Any], probe: bool) -> SessionView:
        return view(state_dir, conn, self._core_of(conn))

    def dev_stop(self, state_dir: Path, conn: dict[str, Any]) -> str:
        return stop(state_dir, conn, self._core_of(conn))

    def dev_save(self, state_dir: Path, conn: dict[str, Any], image: str, dry_run: bool) -> SaveOutcome:
        from kubernetes import client

        from hpctrain.schedulers.kubernetes.api.client import translating

        sched = self._scheduler_of(conn)
        batch = translating(client.BatchV1Api(sched.api_client))
        session = str(conn.get("name", state_dir.name))
        return image_build.save(session, conn, image, dry_run, sched.raw, sched.core, batch)

    def _core_of(self, conn: dict[str, Any]) -> Any:
        return self._scheduler_of(conn).core

    def _scheduler_of(self, conn: dict[str, Any]) -> Any:
        """The cluster the session was started on: the kubeconfig context recorded then, whatever the current one
        is now (a `dev stop` through another cluster found no pod and forgot a session still running)."""
        from hpctrain.schedulers.kubernetes import create

        context = conn.get("context")
        if not context or context == self.scheduler.context:
            return self.scheduler
        return create(options=self.scheduler.options, context=context)

    def tensorboard(
        self, run_dirs: list[str], time: str, placement: Placement, wait_s: float, port: int | None, on_step: OnStep
    ) -> ServiceAccess:
        options = self.options(placement)  # the Slurm flags are refused, as for `dev start`
        pod = tensorboard_pod(tbserver.logdir_spec(run_dirs, check_exists=False), time)
        pods.create(self.scheduler.core, render_pod(pod, options))
        local = port or TENSORBOARD_PORT
        return ServiceAccess(
            service="TensorBoard",
            job=pod.name,
            forward=port_forward_command(options.namespace, pod.name, local, TENSORBOARD_PORT, self.scheduler.context),
            url=f"http://localhost:{local}/",
            stop=self.scheduler.command("cancel", pod.name),
            namespace=options.namespace,
        )

    def top(self, job: str, find_run_dir: bool) -> TopSample:
        raw, job_pods = self._pods(job)
        samples = pods.sample_pods(raw, job_pods)
        if not samples:
            raise JobNotRunning(
                f"job {job} has no running pod: `hpctrain top` looks at running jobs only "
                f"(`{self.scheduler.command('status', job)}` says where it is)"
            )
        return TopSample(f"job {job}", samples)

    def stacks(self, job: str, wait_s: float) -> RemoteStacks:
        raw, job_pods = self._pods(job)
        pod = next((p for p in job_pods if (p.get("status") or {}).get("phase") == "Running"), None)
        if pod is None:
            raise JobNotRunning(
                f"job {job} has no running pod to ask (`{self.scheduler.command('status', job)}` says where it is)"
            )
        name, namespace, container = pod["metadata"]["name"], self.scheduler.namespace, pods.training_container(pod)
        stdout, status = pods.exec_probe(raw, namespace, name, container, PROGRESS_PROBE)
        ranks = ranks_of(parse_probe(stdout, labelled=False))
        if not ranks:
            raise UserError(
                f"pod {name} sees no rank records (RUN/progress/ under its HPCTRAIN_RUN_DIR): the run "
                "has not started training (ask again once `hpctrain logs` shows steps), or it is not an "
                "hpctrain run (use its own tools)"
                + (f" ({pods.exec_failure(status)})" if pods.exec_failure(status) else "")
            )
        script = pods.stacks_request(ranks[0].world_size, min(wait_s, pods.PROBE_TIMEOUT_S - 10))
        stdout, status = pods.exec_probe(raw, namespace, name, container, script)
        return RemoteStacks(f"pod {name}", pods.parse_stacks(stdout), ranks)

    def _pods(self, job: str) -> tuple[Any, list[Any]]:
        """The raw API (rest.RawApi) and the pods (JSON) of `job`, a PyTorchJob or a TrainJob (a job name is one job,
        of either kind)."""
        from hpctrain.schedulers.base import JobNotFound
        from hpctrain.schedulers.kubernetes import create

        sched = self.scheduler
        for api in sorted(APIS, key=lambda a: a != sched.options.api):
            found = (
                sched
                if api == sched.options.api
                else create(options=replace(sched.options, api=api), context=sched.context)
            )
            try:
                found.get_object(job)
            except JobNotFound:
                continue
            return found.raw, found.pods_of(job)
        raise UserError(
            f"no PyTorchJob or TrainJob named {job!r} in namespace {sched.namespace}: check the name "
            f"and --namespace (`{sched.command('status')}` lists the jobs)"
        )

    def run_dir(self, job: str) -> Path | None:
        """The job's run directory as this machine sees it through the pods' volumes (a host path on a node that is
        this machine, an NFS or PVC volume mounted here at the same path), else None: the volume is not seen here
        (a job that no longer exists is JobNotFound: a cancelled job's object is deleted)."""
        return self.scheduler.run_dir_here(job)

    def stop(self, name: str) -> str | None:
        sched = self.scheduler
        pod = pods.find(sched.core, sched.namespace, name)
        if pod is None:
            return None
        pods.delete(sched.core, sched.namespace, name)
        kind = pod.metadata.labels.get(SERVICE_LABEL)
        return f"{kind} pod {sched.namespace}/{name} and its secret deleted"


def tensorboard_pod(spec: str, time_limit: str | None) -> ServicePod:
    command = (
        "tensorboard",
        f"--logdir_spec={spec}",
        "--host",
        "0.0.0.0",
        "--port",
        str(TENSORBOARD_PORT),
    )  # -x: no option
    return ServicePod(
        name=f"tensorboard-{secrets.token_hex(3)}",
        kind="tensorboard",
        command=command,
        port=TENSORBOARD_PORT,
        resources=Resources(cpus_per_task=1, mem_bytes=2 << 30),
        time=time_limit,
        ready_path="/",
    )


# ---- dev sessions as pods (JupyterLab) ----------------------------------------------------------------------------


def service_pod(cfg: DevConfig) -> ServicePod:
    if cfg.service != "jupyter":
        raise UserError(
            f"--service {cfg.service} runs on Slurm only: on Kubernetes use --service jupyter, or "
            "`kubectl exec -it POD -- bash` in a pod of yours"
        )
    port = cfg.port or jupyter.POD_PORT
    # The command of Slurm sessions: --allow-root where the image runs as root (many PyTorch images do).
    # /api answers without the token: the kubelet's readiness probe needs none.
    return ServicePod(
        name=cfg.job_name,
        kind="dev",
        # the image's packages recorded first, for `dev save` (image_build): bash -c's script, prefixed
        command=(*jupyter.COMMAND[:2], image_build.RECORD_BASE + jupyter.COMMAND[2]),
        port=port,
        resources=cfg.resources,
        time=cfg.time,
        secret_env=(("JUPYTER_TOKEN", "token"),),
        env=(("HPCTRAIN_PORT", str(port)),),
        ready_path="/api",
    )


def render_dev_pod(cfg: DevConfig, options: KubernetesOptions) -> dict[str, Any]:
    """The session's Pod manifest (its token comes from the Secret of the same name). Pure."""
    return render_pod(service_pod(cfg), options)


def start(
    cfg: DevConfig,
    options: KubernetesOptions,
    core: Any,
    root: Path | None,
    wait_s: float,
    local_port: int | None,
    on_step: OnStep,
    context: str | None = None,
    stop: str | None = None,
) -> dict[str, Any]:
    """Create the session's Secret and Pod, wait until JupyterLab is ready (up to wait_s; 0: do not wait; each step
    told to `on_step`), record and return its connection details: with the kubeconfig `context` it was created
    through and `stop`, the `hpctrain dev stop` command with every flag that found the cluster (the caller's)."""
    stop = stop or f"hpctrain dev stop {cfg.name} --scheduler kubernetes --namespace {options.namespace}"
    state_dir = make_session_dir(cfg.name, root)
    spec = service_pod(cfg)
    pod = render_pod(spec, options)
    token = secrets.token_urlsafe(32)
    pods.create(core, pod, render_secret(spec, options, {"token": token}))
    write_private(state_dir / TOKEN_FILE, token + "\n")
    local = local_port or spec.port
    conn: dict[str, Any] = {
        "name": cfg.name,
        "scheduler": "kubernetes",
        "service": cfg.service,
        "namespace": options.namespace,
        "pod": spec.name,
        "created": now(),
        "local_port": local,
        "context": context,
        "image": options.image,
        "gpus": cfg.resources.gpus_per_node,
        "stop": stop,
        "port_forward": port_forward_command(options.namespace, spec.name, local, spec.port, context),
        "url": jupyter.url(local, token),
    }
    write_private(state_dir / CONNECTION_FILE, conn)
    created = f"dev session {cfg.name}: pod {spec.name} created in namespace {options.namespace}"
    on_step(Step("submitted", f"{created}; waiting until JupyterLab is ready (up to {wait_s:g} s)", spec.name))
    deadline = time.monotonic() + wait_s
    while wait_s > 0:
        live = core.read_namespaced_pod(spec.name, options.namespace)
        state = pods.pod_state(live)
        if state == "Running" and pods.pod_ready(live):
            conn["pod_ip"] = live.status.pod_ip
            write_private(state_dir / CONNECTION_FILE, conn)
            break
        if state in ("Succeeded", "Failed", "Terminating"):
            logs = kubectl(context, "logs", "-n", options.namespace, spec.name)
            raise UserError(
                f"pod {spec.name} is {state} before JupyterLab was ready: see `{logs}`; forget it with `{stop}`"
            )
        if time.monotonic() >= deadline:
            describe = kubectl(context, "describe", "pod", "-n", options.namespace, spec.name)
            raise UserError(
                f"pod {spec.name} is {state} and not ready after {wait_s:g} s; it is left in place: wait "
                f"longer with --wait, see `{describe}`, or stop "
                f"it with `{stop}`"
            )
        time.sleep(1.0)
    return conn


def instructions(cfg: DevConfig, conn: dict[str, Any]) -> list[str]:
    """How to reach the session, as `dev start` prints it."""
    return [
        "\nOn your machine, forward the port (keep it running):",
        f"  {conn['port_forward']}",
        f"then open:\n  {conn['url']}",
        f"Stop it when done: {conn['stop']}",
    ]


def view(state_dir: Path, conn: dict[str, Any], core: Any) -> SessionView:
    """The session's row in `dev list`: the pod's state and age."""
    from kubernetes.client.rest import ApiException

    try:
        pod = core.read_namespaced_pod(conn["pod"], conn["namespace"])
        state = pods.pod_state(pod).upper()
        created = pod.metadata.creation_timestamp
        age = int((dt.datetime.now(dt.timezone.utc) - created).total_seconds()) if created else None
    except ApiException as err:
        state, age = ("GONE" if err.status == 404 else f"UNKNOWN ({err.status})"), None
    where = f"{conn.get('namespace')}/{conn.get('pod')}"
    return SessionView(
        str(conn.get("name", state_dir.name)),
        "kubernetes",
        where,
        state,
        age,
        None,
        None,
        conn,
        ended=state in ("GONE", "SUCCEEDED", "FAILED"),
    )  # a pod's phases, upper-cased


def stop(state_dir: Path, conn: dict[str, Any], core: Any) -> str:
    """Delete the pod and its secret and forget the session's token; returns what happened."""
    found = pods.delete(core, conn["namespace"], conn["pod"])
    forget(state_dir)
    return f"pod {conn['namespace']}/{conn['pod']} deleted" if found else f"pod {conn['pod']} was already gone"
