"""What `hpctrain status` and `hpctrain cluster` show for Slurm, as data: Slurm's own records (JobInfo, ClusterInfo)
made into a View (hpctrain.schedulers.base): their dicts for --json, Tables of text cells and lines for people.
Pure functions from parsed data to rows; the CLI lays them out (hpctrain.cli.views: rich for a short table, plain
text for a long one) and prints. SlurmScheduler.status_view and cluster_view call the *_view functions here.

Every cell and line is text, never markup: job names, node names, paths and the run directory's records are
anyone's text (`exp[bs=64]` is a job name, not a style), and with `--all-users` one user's job name must not change
or break what another user sees."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from hpctrain.errors import UserError
from hpctrain.fsutil import format_bytes
from hpctrain.schedulers.base import JobNotFound, Table, View
from hpctrain.schedulers.slurm.queries.job_states import JobInfo
from hpctrain.schedulers.slurm.queries.cluster_state import ClusterInfo, NodeInfo
from hpctrain.jobs.values import format_duration

NO_JOBS = "no jobs (Slurm forgets ended jobs after a few minutes; `hpctrain logs JOB` still finds their output)"


def shards_cell(node: NodeInfo) -> str:
    return _shards_text(node.shards_used, node.shards_total, node.shards_per_gpu)


# The cells of 10,000 nodes repeat a few hundred texts: each is made once (pure functions of plain values).
@functools.lru_cache(maxsize=4096)
def _shards_text(shards_used: int | None, shards_total: int, per_gpu: tuple[tuple[int, int], ...] | None) -> str:
    if not shards_total:
        return "-"
    used = "?" if shards_used is None else str(shards_used)
    text = f"{used}/{shards_total}"
    if per_gpu:
        text += " (" + ", ".join(f"gpu{i}: {u}/{t}" for i, (u, t) in enumerate(per_gpu)) + ")"
    return text


@functools.lru_cache(maxsize=4096)
def _memory_text(alloc_mb: int, total_mb: int) -> str:
    return f"{format_bytes(alloc_mb << 20)}/{format_bytes(total_mb << 20)}"


def gpus_cell(node: NodeInfo) -> str:
    if not node.gpus_total:
        return "-"
    kind = f" {node.gpu_type}" if node.gpu_type else ""
    return f"{node.gpus_used}/{node.gpus_total}{kind}"


NODE_COLUMNS = ("node", "state", "partitions", "CPUs", "memory", "GPUs", "shards")
JOB_COLUMNS = ("job", "name", "state", "reason", "nodes", "elapsed", "restarts")
PARTITION_COLUMNS = ("partition", "state", "max time", "nodes")


def node_rows(info: ClusterInfo) -> list[tuple[str, ...]]:
    return [
        (
            n.name,
            n.state,
            ",".join(n.partitions),
            f"{n.cpus_alloc}/{n.cpus_total}",
            _memory_text(n.mem_mb_alloc, n.mem_mb_total),
            gpus_cell(n),
            shards_cell(n),
        )
        for n in info.nodes
    ]


def partition_rows(info: ClusterInfo) -> list[tuple[str, ...]]:
    return [
        (
            p.name + (" (default)" if p.default else ""),
            p.state,
            "no limit" if p.max_time_s is None else format_duration(p.max_time_s),
            str(len(p.nodes)),
        )
        for p in info.partitions
    ]


def wanted(num_nodes: int | None, max_nodes: int | None) -> str:
    """The nodes cell of a job without nodes: what it asks for, "(2 wanted)", or a node range's "(1:2 wanted)"
    (squeue's NumNodes is a pending job's minimum and MaxNodes its maximum; once the job runs both are the
    allocated count: Slurm keeps no range then, seen on 22.05)."""
    if not num_nodes:
        return ""
    return f"({num_nodes}:{max_nodes} wanted)" if max_nodes and max_nodes > num_nodes else f"({num_nodes} wanted)"


def job_rows(jobs: list[JobInfo]) -> list[tuple[str, ...]]:
    return [
        (
            j.job_id,
            j.name,
            j.state,
            j.reason or "",  # why it waits, or why it failed (NonZeroExitCode, TimeLimit, ...)
            j.nodes or wanted(j.num_nodes, j.max_nodes),
            "" if j.elapsed_s is None else format_duration(j.elapsed_s),
            str(j.restarts),
        )
        for j in jobs
    ]


def jobs_table(jobs: list[JobInfo]) -> Table:
    return Table(JOB_COLUMNS, job_rows(jobs))


def jobs_view(jobs: list[JobInfo]) -> View:
    """The job list: a row a job (thousands of rows: the CLI prints them plain)."""
    return View(records=lambda: [j.to_dict() for j in jobs], parts=lambda: (jobs_table(jobs),) if jobs else (NO_JOBS,))


def job_list_view(jobs: Callable[[], list[JobInfo]], cells: Callable[[], Sequence[Sequence[str]]]) -> View:
    """The job list as jobs_view shows it, each form from a query of its own, made only when shown: `jobs` the
    records (--json), `cells` the table's rows, job_rows' cells (job_table asks squeue only for those)."""

    def parts() -> tuple[Table | str, ...]:
        rows = cells()
        return (Table(JOB_COLUMNS, rows),) if len(rows) else (NO_JOBS,)

    return View(records=lambda: [j.to_dict() for j in jobs()], parts=parts)


def not_found(job_id: str) -> JobNotFound:
    """Neither the controller nor accounting knows the job: say where its traces may still be."""
    records = sorted(str(p) for p in Path.cwd().glob(f"runs/*-{job_id}/job.yaml"))
    seen = f"; its submission record is {records[0]}" if records else ""
    return JobNotFound(
        f"job {job_id} not found: Slurm forgets ended jobs after a few minutes and accounting (sacct) does not "
        f"know it either{seen}; `hpctrain logs {job_id}` still looks for its output"
    )


def job_view(job: JobInfo, run_dir: Path | None = None) -> View:
    """One job in full: its table row, then partition, exit status, times and output files; with the run directory
    of a job hpctrain submitted, each rank's live progress and how a hung attempt ended (hpctrain.health)."""
    from hpctrain.health import read_progress
    from hpctrain.health.view import elastic_lines, hang_lines, rank_lines

    ranks = read_progress(run_dir) if run_dir is not None else []
    extra = {"run_dir": str(run_dir), "ranks": [asdict(r) for r in ranks]} if run_dir is not None else {}
    details = [
        ("partition", job.partition),
        ("exit status", None if job.exit_code is None else str(job.exit_code)),
        ("time limit", format_duration(job.time_limit_s) if job.source != "sacct" else None),
        ("submitted", job.submit_time),
        ("started", job.start_time),
        ("ended" if job.finished else "ends by", job.end_time),  # a live job's EndTime: its time limit
        ("stdout", job.stdout),
        ("stderr", job.stderr if job.stderr != job.stdout else None),
    ]
    lines = [f"{key + ':':12} {value}" for key, value in details if value]
    if run_dir is not None:
        lines += [f"{'run dir:':12} {run_dir}", *elastic_lines(run_dir), *hang_lines(run_dir)]
        lines += rank_lines(ranks, time.time())
    return View(records={**job.to_dict(), **extra}, parts=(jobs_table([job]), *lines), ended=job.finished)


def cluster_view(info: ClusterInfo, partition: str | None = None) -> View:
    """The nodes and partitions (only those of `partition` when given)."""
    if partition:
        part = info.partition(partition)
        if part is None:
            names = ", ".join(p.name for p in info.partitions)
            raise UserError(f"--partition {partition}: no such partition; choose one of: {names}")
        info = ClusterInfo(partitions=(part,), nodes=tuple(info.nodes_in(part)))
    return View(
        records=info.to_dict,
        parts=lambda: (
            Table(NODE_COLUMNS, node_rows(info), title="nodes (used/total)"),
            Table(PARTITION_COLUMNS, partition_rows(info), title="partitions"),
        ),
    )
