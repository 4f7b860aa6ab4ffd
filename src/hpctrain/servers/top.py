"""`hpctrain top JOB`: is a running job using what it holds? Per node: GPU utilization and memory (nvidia-smi on
the job's own nodes), CPU load, and the run's latest step and images/s from its metrics.jsonl.

Here: the probe script and what it prints, parsed, and the screen made of it. How the probe reaches the job's
nodes is the backend's (schedulers/slurm/services/top_probe.py, schedulers/kubernetes/services/service_pods.py): on
Slurm one probe
step runs beside the job's own (`srun --jobid=JOB --overlap`, one task per node, `--label`d so each line names its
task); on Kubernetes the same probe runs in each pod through the API server's exec stream (what `kubectl exec`
does).
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain import program_text
from hpctrain.errors import UserError
from hpctrain.fsutil import format_bytes
from hpctrain.health import RankProgress
from hpctrain.health.progress import MAX_RECORD_BYTES, PROGRESS_DIR, parse_progress
from hpctrain.health.view import rank_lines

NVIDIA_SMI = (
    "nvidia-smi",
    "--query-gpu=index,utilization.gpu,memory.used,memory.total",
    "--format=csv,noheader,nounits",
)
IDLE_UTIL = 5
"""A GPU below this utilization (percent) counts as idle."""
PROBE = (
    'printf "@node %s\\n" "${SLURMD_NODENAME:-$(hostname)}"; '
    'printf "@cpus %s\\n" "$(getconf _NPROCESSORS_ONLN)"; '
    'printf "@load %s\\n" "$(cat /proc/loadavg)"; '
    f"if command -v nvidia-smi >/dev/null 2>&1; then {shlex.join(NVIDIA_SMI)} | sed 's/^/@gpu /'; "
    'else echo "@nogpu"; fi'
)
# Added to the probe of one of a job's pods: the ranks' live records, one `@progress JSON` line each, bounded per
# record (programs/progress_probe.sh and programs/join_records.awk, which say how; linted as programs).
_JOIN_RECORDS = program_text.without_comments(
    program_text.fill(__package__, "join_records.awk", MAX_RECORD_BYTES=MAX_RECORD_BYTES)
)
PROGRESS_PROBE = program_text.without_comments(
    program_text.fill(
        __package__,
        "progress_probe.sh",
        PROGRESS_DIR=PROGRESS_DIR,
        FIND_SIZE=MAX_RECORD_BYTES + 1,
        JOIN_RECORDS=shlex.quote(_JOIN_RECORDS),
        MAX_RECORD_BYTES=MAX_RECORD_BYTES,
    )
).rstrip("\n")


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
    progress: list[str] = field(default_factory=list)  # the run's rank records this node can read (JSON texts)


@dataclass(frozen=True)
class TopSample:
    """One look at a job: what `top` calls it, a sample per node (or pod), and its run directory when known."""

    label: str
    nodes: list[NodeSample]
    run_dir: Path | None = None


def parse_probe(text: str, labelled: bool = True) -> list[NodeSample]:
    """Lines `TASK: @kind value` (srun --label) or `@kind value` (one pod) -> one sample per task. Lines end at
    `\n` only (what the probe's printf and awk end them with): a `\r`, U+2028 or another character that
    str.splitlines also splits at, inside a record that a rank (or anyone who can write the run directory) wrote,
    stays inside its line and cannot forge one. A record over MAX_RECORD_BYTES is dropped, as the local reader
    drops it."""
    by_task: dict[str, NodeSample] = {}
    for raw in text.split("\n"):
        if not raw.strip():  # the end of the last line, or a probe that printed nothing: no sample
            continue
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
        elif kind == "@progress" and len(value.encode("utf-8", "surrogatepass")) <= MAX_RECORD_BYTES:
            sample.progress.append(value)
    return sorted(by_task.values(), key=lambda s: s.node)


def _parse_gpu(line: str) -> GpuSample | None:
    """One line of nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits,
    e.g. `0, 87, 30512, 81559`; `[N/A]` (e.g. MIG) becomes 0."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 4:
        return None
    nums = [int(float(p)) if p.replace(".", "", 1).isdigit() else 0 for p in parts]
    return GpuSample(*nums)


def ranks_of(samples: list[NodeSample]) -> list[RankProgress]:
    """The run's rank records as the job's own nodes read them (a pod sees the run directory on its volume; every
    pod sees every rank's record, and the newest of each counts)."""
    return parse_progress(text for s in samples for text in s.progress)


class JobNotRunning(UserError):
    """The job is not (or no longer) running: nothing to sample. `top --watch` ends on it once it has shown one."""


def latest_metrics(run_dir: Path | None) -> dict[str, Any] | None:
    if run_dir is None:
        return None
    from hpctrain.readback import BadRunFile
    from hpctrain.training.metrics import read_metrics

    try:
        records = read_metrics(run_dir)  # lines that are not records skipped
    except (OSError, BadRunFile):
        return None
    return records[-1] if records else None


def report(
    samples: list[NodeSample],
    metrics: dict[str, Any] | None,
    job_label: str,
    ranks: list[RankProgress] | None = None,
    now: float | None = None,
) -> list[str]:
    """The screen: a line per GPU, a line per node, the run's progress (the ranks' live records when there are
    any, else the latest metrics.jsonl record), and a plain verdict on idle GPUs."""
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
            mem = f"{format_bytes(g.mem_used_mib << 20)}/{format_bytes(g.mem_total_mib << 20)}"
            lines.append(
                f"{s.node:{width}s} {g.index:>3d} {g.util:>4d}% {mem:>17s}   {load}{'   IDLE' if g.idle else ''}"
            )
    if ranks:
        lines += rank_lines(ranks, time.time() if now is None else now)
    elif metrics:
        rate = metrics.get("images_per_s")
        lines.append(
            f"run: step {metrics.get('step')}, epoch {metrics.get('epoch')}"
            + (f", {rate:,.0f} images/s" if isinstance(rate, (int, float)) else "")
            + " (latest metrics.jsonl record)"
        )
    if held and idle == held:
        lines.append(
            f"warning: {job_label} holds {held} GPU(s) and none is working (all below {IDLE_UTIL}% utilization): "
            "it may be loading data, stuck, or finished its work; if so, cancel it to free them"
        )
    elif idle:
        lines.append(
            f"warning: {idle} of the {held} GPUs held by {job_label} sit idle (below {IDLE_UTIL}% utilization)"
        )
    return lines
