"""`hpctrain top JOB`: is a running job using what it holds? Per node: GPU utilization and memory (nvidia-smi on
the job's own nodes), CPU load, and the run's latest step and images/s from its metrics.jsonl.

On Slurm one probe step runs beside the job's own (`srun --jobid=JOB --overlap`, one task per node, `--label`d so
each line names its task); on Kubernetes the same probe runs in each pod through the API server's exec stream
(what `kubectl exec` does).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError

NVIDIA_SMI = ("nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used,memory.total", "--format=csv,noheader,nounits")
IDLE_UTIL = 5
"""A GPU below this utilization (percent) counts as idle."""
PROBE_TIMEOUT_S = 60
"""How long the probe may take in one pod (exec on Kubernetes)."""
PROBE = (
    'printf "@node %s\\n" "${SLURMD_NODENAME:-$(hostname)}"; '
    'printf "@cpus %s\\n" "$(getconf _NPROCESSORS_ONLN)"; '
    'printf "@load %s\\n" "$(cat /proc/loadavg)"; '
    f"if command -v nvidia-smi >/dev/null 2>&1; then {shlex.join(NVIDIA_SMI)} | sed 's/^/@gpu /'; "
    'else echo "@nogpu"; fi'
)


@dataclass(frozen=True)
class GpuSample:
    index: int
    util: int
    """percent"""
    mem_used_mib: int
    mem_total_mib: int

    @property
    def idle(self) -> bool:
        return self.util < IDLE_UTIL


@dataclass
class NodeSample:
    node: str
    cpus: int | None = None
    load1: float | None = None
    gpus: list[GpuSample] = field(default_factory=list)
    nvidia_smi: bool = True


def probe_argv(job_id: str, nodes: int) -> list[str]:
    return ["srun", f"--jobid={job_id}", "--overlap", f"--nodes={nodes}", "--ntasks-per-node=1", "--label",
            "bash", "-c", PROBE]


def parse_probe(text: str, labelled: bool = True) -> list[NodeSample]:
    """Lines `TASK: @kind value` (srun --label) or `@kind value` (one pod) -> one sample per task."""
    by_task: dict[str, NodeSample] = {}
    for raw in text.splitlines():
        task, line = ("0", raw.strip())
        if labelled:
            task, sep, line = raw.partition(":")
            if not sep:
                continue
            task, line = task.strip(), line.strip()
        kind, _, value = line.partition(" ")
        sample = by_task.setdefault(task, NodeSample(node=f"task {task}"))
        if kind == "@node":
            sample.node = value.strip()
        elif kind == "@cpus" and value.strip().isdigit():
            sample.cpus = int(value)
        elif kind == "@load":
            try:
                sample.load1 = float(value.split()[0])
            except (ValueError, IndexError):
                pass
        elif kind == "@nogpu":
            sample.nvidia_smi = False
        elif kind == "@gpu":
            gpu = _parse_gpu(value)
            if gpu is not None:
                sample.gpus.append(gpu)
    return sorted(by_task.values(), key=lambda s: s.node)


def _parse_gpu(line: str) -> GpuSample | None:
    """One line of nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits,
    e.g. `0, 87, 30512, 81559`; `[N/A]` (e.g. MIG) becomes 0."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 4:
        return None
    nums = [int(float(p)) if p.replace(".", "", 1).isdigit() else 0 for p in parts]
    return GpuSample(*nums)


def sample_slurm(job_id: str) -> tuple[Any, list[NodeSample]]:
    from hpctrain.schedulers.slurm.commands import slurm
    from hpctrain.schedulers.slurm.jobs import get_job

    info = get_job(job_id)
    if info is None:
        raise UserError(f"job {job_id} not found: check the id with `hpctrain status`")
    if info.state != "RUNNING":
        raise UserError(f"job {job_id} is {info.state}, not running: `hpctrain top` looks at running jobs only")
    result = slurm(probe_argv(info.job_id, info.num_nodes or 1), check=False)
    samples = parse_probe(result.stdout)
    if not samples:
        err = " ".join((result.stderr or "").split()) or f"exit status {result.returncode}"
        raise UserError(f"could not run the probe step in job {job_id} ({err}); the job may be ending")
    return info, samples


def sample_pods(core: Any, pods: Iterable[Any], container: str | None = None) -> list[NodeSample]:
    """The probe in each running pod through the API server's exec stream (what `kubectl exec` does), in
    `container` (None: the training container hpctrain renders, or the pod's only one)."""
    out = []
    for pod in pods:
        if (pod.status.phase if pod.status else None) != "Running":
            continue
        name, namespace = pod.metadata.name, pod.metadata.namespace
        stdout, status = _exec_probe(core, namespace, name, container or training_container(pod))
        samples = parse_probe(stdout, labelled=False)
        if not samples:
            raise UserError(f"the probe failed in pod {name}: {exec_failure(status) or 'it printed nothing'}. "
                            "`hpctrain top` runs `sh -c` with getconf, cat and nvidia-smi in the pod's training "
                            f"container: its image needs a POSIX shell (try `kubectl exec -n {namespace} {name} -- sh -c true`)")
        for sample in samples:
            sample.node = f"{pod.spec.node_name or '?'} ({name})"
            out.append(sample)
    return out


def training_container(pod: Any) -> str | None:
    """The container hpctrain's jobs train in (Kubeflow v1's `pytorch`, Trainer v2's `node`), so that sidecars
    (a service mesh's proxy, a log shipper) do not make exec ask which one; None leaves the choice to the API server."""
    from hpctrain.schedulers.kubernetes.render import CONTAINER_PYTORCHJOB, CONTAINER_TRAINJOB

    names = [c.name for c in (pod.spec.containers or [])] if pod.spec else []
    return next((n for n in (CONTAINER_PYTORCHJOB, CONTAINER_TRAINJOB) if n in names), None)


def _exec_probe(core: Any, namespace: str, pod: str, container: str | None) -> tuple[str, str]:
    """Run PROBE in the pod; its stdout and the final Status JSON of the exec stream (channel 3)."""
    from kubernetes.stream import stream
    from kubernetes.stream.ws_client import ERROR_CHANNEL

    kwargs = {"container": container} if container else {}
    try:
        ws = stream(core.connect_get_namespaced_pod_exec, pod, namespace, command=["sh", "-c", PROBE], stderr=True,
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


def latest_metrics(run_dir: Path | None) -> dict[str, Any] | None:
    if run_dir is None:
        return None
    from hpctrain.training.metrics import read_metrics

    try:
        records = read_metrics(run_dir)
    except (OSError, ValueError):
        return None
    return records[-1] if records else None


def run_dir_of(job_id: str, work_dir: str | None) -> Path | None:
    """The run directory an `hpctrain submit` job exports, read from its batch script (`scontrol write
    batch_script`); None when the job was not submitted by hpctrain or the script is unreadable."""
    result = subprocess.run(["scontrol", "write", "batch_script", job_id, "-"], capture_output=True, text=True, check=False)
    return parse_run_dir(result.stdout, job_id, work_dir) if result.returncode == 0 else None


def parse_run_dir(script: str, job_id: str, work_dir: str | None, home: str | None = None) -> Path | None:
    """The `run_dir=...` line hpctrain.schedulers.slurm.render renders (%j as "${SLURM_JOB_ID}", ~ as "$HOME")."""
    for line in script.splitlines():
        if line.startswith("run_dir="):
            text = line[len("run_dir="):].replace("${SLURM_JOB_ID}", job_id).replace("$HOME", home or str(Path.home()))
            try:
                words = shlex.split(text)
            except ValueError:
                return None
            if len(words) == 1:
                path = Path(words[0])
                return path if path.is_absolute() or work_dir is None else Path(work_dir) / path
    return None


def report(samples: list[NodeSample], metrics: dict[str, Any] | None, job_label: str) -> list[str]:
    """The screen: a line per GPU, a line per node, the run's progress, and a plain verdict on idle GPUs."""
    width = max([24] + [len(s.node) for s in samples])  # pods show as `NODE (POD)`
    lines = [f"{'NODE':{width}s} {'GPU':>3s} {'UTIL':>5s} {'MEMORY':>17s}   CPU LOAD"]
    held = idle = 0
    for s in samples:
        load = f"{s.load1:.2f}" + (f" / {s.cpus} CPUs" if s.cpus else "") if s.load1 is not None else "-"
        if not s.nvidia_smi:
            lines.append(f"{s.node:{width}s} {'-':>3s} {'-':>5s} {'no nvidia-smi':>17s}   {load}")
        elif not s.gpus:  # nvidia-smi is there but listed nothing (it failed, or the node has no usable GPU)
            lines.append(f"{s.node:{width}s} {'-':>3s} {'-':>5s} {'nvidia-smi: none':>17s}   {load}")
        for g in s.gpus:
            held += 1
            idle += g.idle
            mem = f"{g.mem_used_mib:,}/{g.mem_total_mib:,} MiB"
            lines.append(f"{s.node:{width}s} {g.index:>3d} {g.util:>4d}% {mem:>17s}   {load}{'   IDLE' if g.idle else ''}")
    if metrics:
        rate = metrics.get("images_per_s")
        lines.append(f"run: step {metrics.get('step')}, epoch {metrics.get('epoch')}"
                     + (f", {rate:,.0f} images/s" if isinstance(rate, (int, float)) else "") + " (latest metrics.jsonl record)")
    if held and idle == held:
        lines.append(f"warning: {job_label} holds {held} GPU(s) and none is working (all below {IDLE_UTIL}% utilization): "
                     "it may be loading data, stuck, or finished its work; if so, cancel it to free them")
    elif idle:
        lines.append(f"warning: {idle} of the {held} GPUs held by {job_label} sit idle (below {IDLE_UTIL}% utilization)")
    return lines
