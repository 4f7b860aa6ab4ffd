"""The commands around the job on Kubernetes (hpctrain.around.base.Services): dev sessions and TensorBoard as
pods reached through `kubectl port-forward`, and `top`'s probe run in each pod of the job through the API server's
exec stream (what `kubectl exec` does). The Kubernetes client is imported on first use only."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from hpctrain.servers import tensorboard as tbserver
from hpctrain.schedulers.services import Placement, RemoteStacks
from hpctrain.errors import UserError
from hpctrain.jobs.spec import EnvironmentSpec, Resources
from hpctrain.schedulers.kubernetes.answers import guarded
from hpctrain.schedulers.kubernetes.options import APIS, KubernetesOptions
from hpctrain.schedulers.kubernetes import services as k8s
from hpctrain.schedulers.kubernetes import dev as sessions
from hpctrain.servers.sessions import DevConfig, SessionView
from hpctrain.health.stacks import ANSWER_PREFIX, REQUEST_FILE, STACKS_DIR
from hpctrain.servers.top import PROBE, PROGRESS_PROBE, JobNotRunning, NodeSample, TopSample, parse_probe, ranks_of

TENSORBOARD_PORT = 6006
PROBE_TIMEOUT_S = 60
"""How long the probe may take in one pod."""


def create(scheduler: Any) -> KubernetesServices:
    return KubernetesServices(scheduler)


@guarded  # an answer of the wrong shape, read in any of its methods, is one line
class KubernetesServices:
    name = "kubernetes"

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        """A KubernetesScheduler: its namespace, context and (lazily loaded) client."""

    def options(self, placement: Placement) -> KubernetesOptions:
        return KubernetesOptions(namespace=self.scheduler.namespace, image=placement.image, shm=placement.shm,
                                 volumes=tuple(placement.volumes))

    def environment(self, placement: Placement) -> EnvironmentSpec:
        if placement.conda_env or placement.venv or placement.modules or placement.mounts:
            raise UserError("--conda-env/--venv/--module/--mount apply to Slurm: on Kubernetes the --image is the "
                            "environment and --volume mounts storage")
        return EnvironmentSpec()

    def dev_render(self, cfg: DevConfig, placement: Placement) -> str:
        from hpctrain.schedulers.kubernetes.render import render_yaml

        return render_yaml(sessions.render_dev_pod(cfg, self.options(placement)))

    def dev_start(self, cfg: DevConfig, placement: Placement, wait_s: float, local_port: int | None) -> list[str]:
        sched = self.scheduler
        conn = sessions.start(cfg, self.options(placement), sched.core, None, wait_s, local_port,
                              context=sched.context, stop=sched.command("dev stop", cfg.name))
        return sessions.instructions(cfg, conn)

    def dev_view(self, state_dir: Path, conn: dict[str, Any], probe: bool) -> SessionView:
        return sessions.view(state_dir, conn, self._core_of(conn))

    def dev_stop(self, state_dir: Path, conn: dict[str, Any]) -> str:
        return sessions.stop(state_dir, conn, self._core_of(conn))

    def _core_of(self, conn: dict[str, Any]) -> Any:
        """The API of the cluster the session was started on: the kubeconfig context recorded then, whatever the
        current one is now (a `dev stop` through another cluster found no pod and forgot a session still running)."""
        from hpctrain.schedulers import get_scheduler

        context = conn.get("context")
        if not context or context == self.scheduler.context:
            return self.scheduler.core
        return get_scheduler("kubernetes", options=self.scheduler.options, context=context).core

    def tensorboard(self, run_dirs: list[str], time: str, placement: Placement, wait_s: float,
                    port: int | None) -> list[str]:
        self.environment(placement)  # the Slurm flags are refused, as for `dev start`
        options = self.options(placement)
        pod = tensorboard_pod(tbserver.logdir_spec(run_dirs, check_exists=False), time)
        k8s.create(self.scheduler.core, k8s.render_pod(pod, options))
        local = port or TENSORBOARD_PORT
        forward = k8s.port_forward_command(options.namespace, pod.name, local, TENSORBOARD_PORT, self.scheduler.context)
        return [f"TensorBoard pod {pod.name} created in namespace {options.namespace}. On your machine:",
                f"  {forward}",
                f"then open:\n  http://localhost:{local}/",
                f"Stop it with: {self.scheduler.command('cancel', pod.name)}"]

    def top(self, job: str, find_run_dir: bool) -> TopSample:
        core, pods = self._pods(job)
        samples = sample_pods(core, pods)
        if not samples:
            raise JobNotRunning(f"job {job} has no running pod: `hpctrain top` looks at running jobs only "
                                f"(`{self.scheduler.command('status', job)}` says where it is)")
        return TopSample(f"job {job}", samples)

    def stacks(self, job: str, wait_s: float) -> RemoteStacks:
        core, pods = self._pods(job)
        pod = next((p for p in pods if p.status and p.status.phase == "Running"), None)
        if pod is None:
            raise JobNotRunning(f"job {job} has no running pod to ask (`{self.scheduler.command('status', job)}` "
                                "says where it is)")
        name, container = pod.metadata.name, training_container(pod)
        stdout, status = _exec_probe(core, pod.metadata.namespace, name, container, PROGRESS_PROBE)
        ranks = ranks_of(parse_probe(stdout, labelled=False))
        if not ranks:
            raise UserError(f"pod {name} sees no rank records (RUN/progress/ under its HPCTRAIN_RUN_DIR): the run "
                            "has not started training (ask again once `hpctrain logs` shows steps), or it is not an "
                            "hpctrain run (use its own tools)"
                            + (f" ({exec_failure(status)})" if exec_failure(status) else ""))
        script = stacks_request(ranks[0].world_size, min(wait_s, PROBE_TIMEOUT_S - 10))
        stdout, status = _exec_probe(core, pod.metadata.namespace, name, container, script)
        return RemoteStacks(f"pod {name}", parse_stacks(stdout), ranks)

    def _pods(self, job: str) -> tuple[Any, list[Any]]:
        """The API client and the pods of `job`, a PyTorchJob or a TrainJob (a job name is one job, of either kind)."""
        from hpctrain.schedulers import get_scheduler
        from hpctrain.schedulers.base import JobNotFound

        sched = self.scheduler
        for api in sorted(APIS, key=lambda a: a != sched.options.api):
            found = sched if api == sched.options.api else get_scheduler(
                "kubernetes", options=replace(sched.options, api=api), context=sched.context)
            try:
                found.get_object(job)
            except JobNotFound:
                continue
            return found.core, found.pods_of(job)
        raise UserError(f"no PyTorchJob or TrainJob named {job!r} in namespace {sched.namespace}: check the name "
                        f"and --namespace (`{sched.command('status')}` lists the jobs)")

    def run_dir(self, job: str) -> Path | None:
        return None  # the pods' run directory lies on their volume, which this machine need not see

    def stop(self, name: str) -> str | None:
        sched = self.scheduler
        pod = k8s.find(sched.core, sched.namespace, name)
        if pod is None:
            return None
        k8s.delete(sched.core, sched.namespace, name)
        kind = pod.metadata.labels.get(k8s.SERVICE_LABEL)
        return f"{kind} pod {sched.namespace}/{name} and its secret deleted"


def tensorboard_pod(spec: str, time_limit: str | None) -> k8s.ServicePod:
    command = ("tensorboard", f"--logdir_spec={spec}", "--host", "0.0.0.0", "--port", str(TENSORBOARD_PORT))  # -x: no option
    return k8s.ServicePod(name=f"tensorboard-{secrets.token_hex(3)}", kind="tensorboard", command=command,
                          port=TENSORBOARD_PORT, resources=Resources(cpus_per_task=1, mem="2G"), time=time_limit,
                          ready_path="/")


# ---- top: the probe in each pod, through the exec stream -------------------------------------------------------


def sample_pods(core: Any, pods: Iterable[Any], container: str | None = None) -> list[NodeSample]:
    """The probe in each running pod through the API server's exec stream (what `kubectl exec` does), in
    `container` (None: the training container hpctrain renders, or the pod's only one)."""
    out: list[NodeSample] = []
    for pod in pods:
        if (pod.status.phase if pod.status else None) != "Running":
            continue
        name, namespace = pod.metadata.name, pod.metadata.namespace
        probe = PROBE if out else f"{PROBE}; {PROGRESS_PROBE}"  # the first pod also reads the ranks' records
        stdout, status = _exec_probe(core, namespace, name, container or training_container(pod), probe)
        samples = parse_probe(stdout, labelled=False)
        if not samples:
            raise UserError(f"the probe failed in pod {name}: {exec_failure(status) or 'it printed nothing'}. "
                            "`hpctrain top` runs `sh -c` with getconf, cat and nvidia-smi in the pod's training "
                            f"container: its image needs a POSIX shell (try `kubectl exec -n {namespace} {name} -- sh -c true`)")
        for sample in samples:
            sample.node = f"{pod.spec.node_name or '?'} ({name})"
            out.append(sample)
    return out


def stacks_request(world_size: int, wait_s: float) -> str:
    """Shell run in a pod: ask every rank for its stacks (a fresh token in RUN/stacks/request, written and renamed
    as `request_stacks` does; a linked stacks/ is refused), wait until `world_size` answers name the token or
    `wait_s` passed, then print each answer after a line `@stacks rank-N.txt`. No file times are compared."""
    answered = (f'[ -f "$f" ] && [ ! -L "$f" ] && IFS= read -r l < "$f" && case "$l" in *"{ANSWER_PREFIX}$t") '
                'true;; *) false;; esac')  # shell builtins only: an image may lack grep; `od` missing leaves time+pid
    return (f'[ -n "${{HPCTRAIN_RUN_DIR:-}}" ] || exit 3; d="$HPCTRAIN_RUN_DIR"/{STACKS_DIR}; '
            '[ -L "$d" ] && exit 3; mkdir -p "$d" || exit 3; [ -L "$d/request" ] && rm -f "$d/request"; '
            '[ -d "$d/request" ] && exit 3; '
            't="$(date +%s)-$$-$(od -An -N8 -tx1 /dev/urandom | tr -d \' \\n\')"; set -C; '
            f'printf "%s\\n" "$t" > "$d/.{REQUEST_FILE}.$t.tmp" && mv -f "$d/.{REQUEST_FILE}.$t.tmp" '
            f'"$d/{REQUEST_FILE}" || exit 3; n=0; '
            f'while [ "$n" -lt {max(1, int(wait_s))} ]; do sleep 1; n=$((n + 1)); c=0; '
            f'for f in "$d"/rank-*.txt; do {answered} && c=$((c + 1)); done; '
            f'[ "$c" -ge {world_size} ] && break; done; '
            f'for f in "$d"/rank-*.txt; do {answered} && '
            '{ printf "@stacks %s\\n" "${f##*/}"; cat "$f"; }; done; exit 0')


def parse_stacks(text: str) -> dict[int, str]:
    """`@stacks rank-N.txt` lines, each followed by that rank's answer -> {N: answer}."""
    answers: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = re.fullmatch(r"@stacks rank-(\d+)\.txt", line)
        if match:
            current = answers.setdefault(int(match.group(1)), [])
        elif current is not None:
            current.append(line)
    return {rank: "\n".join(lines).rstrip("\n") + "\n" for rank, lines in answers.items()}


def training_container(pod: Any) -> str | None:
    """The container hpctrain's jobs train in (Kubeflow v1's `pytorch`, Trainer v2's `node`), so that sidecars
    (a service mesh's proxy, a log shipper) do not make exec ask which one; None leaves the choice to the API server."""
    from hpctrain.schedulers.kubernetes.render import CONTAINER_PYTORCHJOB, CONTAINER_TRAINJOB

    names = [c.name for c in (pod.spec.containers or [])] if pod.spec else []
    return next((n for n in (CONTAINER_PYTORCHJOB, CONTAINER_TRAINJOB) if n in names), None)


def _exec_probe(core: Any, namespace: str, pod: str, container: str | None, probe: str) -> tuple[str, str]:
    """Run `probe` in the pod; its stdout and the final Status JSON of the exec stream (channel 3)."""
    from kubernetes.stream import stream
    from kubernetes.stream.ws_client import ERROR_CHANNEL

    kwargs = {"container": container} if container else {}
    try:
        ws = stream(core.connect_get_namespaced_pod_exec, pod, namespace, command=["sh", "-c", probe], stderr=True,
                    stdin=False, stdout=True, tty=False, _preload_content=False, **kwargs)
        try:
            ws.run_forever(timeout=PROBE_TIMEOUT_S)
            if ws.is_open():
                raise UserError(f"the probe in pod {pod} did not finish within {PROBE_TIMEOUT_S} s (nvidia-smi can "
                                f"hang on a failing GPU): try `kubectl exec -n {namespace} {pod} -- nvidia-smi`")
            return ws.read_stdout(), ws.read_channel(ERROR_CHANNEL)
        finally:
            ws.close()
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - the client raises ApiException or websocket/socket errors here
        raise UserError(exec_failed_message(namespace, pod, err)) from None


def exec_failure(status: str) -> str | None:
    """The reason in the Status that ends an exec stream (remote command protocol v4: `{"status": "Success"}`, or
    Failure with a message and, for a non-zero exit, an ExitCode cause); None on success or when absent."""
    try:
        parsed = json.loads(status) if status.strip() else {}
    except ValueError:
        return " ".join(status.split())[:300] or None
    if not isinstance(parsed, dict) or parsed.get("status", "Success") == "Success":
        return None
    return " ".join(str(parsed.get("message") or parsed.get("reason") or "exec failed").split())[:300]


def exec_failed_message(namespace: str, pod: str, err: BaseException) -> str:
    """What to tell the user when exec into a pod fails (no kubelet answering, no pods/exec permission, ...)."""
    status = getattr(err, "status", None)
    detail = " ".join(str(getattr(err, "reason", None) or getattr(err, "body", None) or err or type(err).__name__).split())
    # A failed websocket handshake carries the API server's Status object: its message says why.
    found = re.search(r'\{"kind":\s*"Status".*\}', detail)
    if found:
        try:
            detail = str(json.loads(found.group(0)).get("message") or detail)
        except ValueError:
            pass
    if status == 403:
        detail = f"forbidden: your account may not use pods/exec in namespace {namespace} ({detail})"
    return (f"cannot run the probe in pod {pod} through the API server's exec (what `kubectl exec` does): "
            f"{detail[:300] or type(err).__name__}. `hpctrain top` needs exec on Kubernetes: check that "
            f"`kubectl exec -n {namespace} {pod} -- true` works (the node's kubelet must answer, and you need the "
            "pods/exec permission)")
