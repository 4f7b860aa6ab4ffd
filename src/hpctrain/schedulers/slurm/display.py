"""What `hpctrain status` and `hpctrain cluster` print for Slurm: Slurm's own records as tables (pure functions
from parsed data to rows; rich lays out a short table, a long one is printed plain: hpctrain.schedulers.tables) or
JSON, and the details of one job. SlurmScheduler.report_status and report_cluster call the print_* functions here.

Every cell and line is a rich Text, never a markup string: job names, node names, paths and the run directory's
records are anyone's text (`exp[bs=64]` is a job name, not a style), and with `--all-users` one user's job name
must not change or break what another user sees."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from hpctrain.errors import UserError
from hpctrain.schedulers.tables import json_text, print_table, rich_table
from hpctrain.schedulers.slurm.jobs import JobInfo
from hpctrain.schedulers.slurm.query import ClusterInfo, NodeInfo
from hpctrain.jobs.values import format_duration


def console() -> Console:
    """stdout console; when piped or captured, wide enough that no cell is cut (logs and CI read it whole)."""
    if sys.stdout.isatty():
        return Console()
    return Console(width=200, no_color=True, soft_wrap=False)


def _row(*cells: str) -> list[Text]:
    """Cells as plain text: brackets and all, printed as they are."""
    return [Text(cell) for cell in cells]


def _mem(mb: int) -> str:
    return f"{mb / 1024:.1f}G"


def shards_cell(node: NodeInfo) -> str:
    if not node.shards_total:
        return "-"
    used = "?" if node.shards_used is None else str(node.shards_used)
    text = f"{used}/{node.shards_total}"
    if node.shards_per_gpu:
        text += " (" + ", ".join(f"gpu{i}: {u}/{t}" for i, (u, t) in enumerate(node.shards_per_gpu)) + ")"
    return text


def gpus_cell(node: NodeInfo) -> str:
    if not node.gpus_total:
        return "-"
    kind = f" {node.gpu_type}" if node.gpu_type else ""
    return f"{node.gpus_used}/{node.gpus_total}{kind}"


NODE_COLUMNS = ("node", "state", "partitions", "CPUs", "memory", "GPUs", "shards")
JOB_COLUMNS = ("job", "name", "state", "reason", "nodes", "elapsed", "restarts")


def node_rows(info: ClusterInfo) -> list[tuple[str, ...]]:
    return [(n.name, n.state, ",".join(n.partitions), f"{n.cpus_alloc}/{n.cpus_total}",
             f"{_mem(n.mem_mb_alloc)}/{_mem(n.mem_mb_total)}", gpus_cell(n), shards_cell(n)) for n in info.nodes]


def nodes_table(info: ClusterInfo) -> Table:
    return rich_table(NODE_COLUMNS, node_rows(info), title="nodes (used/total)")


def partitions_table(info: ClusterInfo) -> Table:
    table = Table(title="partitions", title_justify="left")
    for col in ("partition", "state", "max time", "nodes"):
        table.add_column(col, overflow="fold")
    for p in info.partitions:
        table.add_row(*_row(
            p.name + (" (default)" if p.default else ""),
            p.state,
            "no limit" if p.max_time_s is None else format_duration(p.max_time_s),
            str(len(p.nodes)),
        ))
    return table


def job_rows(jobs: list[JobInfo]) -> list[tuple[str, ...]]:
    return [(j.job_id, j.name, j.state,
             j.reason or "",  # why it waits, or why it failed (NonZeroExitCode, TimeLimit, ...)
             j.nodes or (f"({j.num_nodes} wanted)" if j.num_nodes else ""),
             "" if j.elapsed_s is None else format_duration(j.elapsed_s), str(j.restarts)) for j in jobs]


def jobs_table(jobs: list[JobInfo]) -> Table:
    return rich_table(JOB_COLUMNS, job_rows(jobs))


def print_jobs(jobs: list[JobInfo], as_json: bool) -> None:
    if as_json:
        print(json_text([j.to_dict() for j in jobs]))
    elif not jobs:
        print("no jobs (Slurm forgets ended jobs after a few minutes; `hpctrain logs JOB` still finds their output)")
    else:
        print_table(JOB_COLUMNS, job_rows(jobs), console())  # thousands of rows: plain


def not_found(job_id: str) -> UserError:
    """Neither the controller nor accounting knows the job: say where its traces may still be."""
    records = sorted(str(p) for p in Path.cwd().glob(f"runs/*-{job_id}/job.yaml"))
    seen = f"; its submission record is {records[0]}" if records else ""
    return UserError(
        f"job {job_id} not found: Slurm forgets ended jobs after a few minutes and accounting (sacct) does not "
        f"know it either{seen}; `hpctrain logs {job_id}` still looks for its output"
    )


def print_job(job: JobInfo, as_json: bool, run_dir: Path | None = None) -> None:
    """One job in full: its table row, then partition, exit status, times and output files; with the run directory
    of a job hpctrain submitted, each rank's live progress and how a hung attempt ended (hpctrain.health)."""
    from hpctrain.health import read_progress
    from hpctrain.health.view import hang_lines, rank_lines

    ranks = read_progress(run_dir) if run_dir is not None else []
    if as_json:
        extra = {"run_dir": str(run_dir), "ranks": [asdict(r) for r in ranks]} if run_dir is not None else {}
        print(json.dumps({**job.to_dict(), **extra}, indent=2))
        return
    out = console()
    out.print(jobs_table([job]))
    details = [
        ("partition", job.partition),
        ("exit status", None if job.exit_code is None else str(job.exit_code)),
        ("time limit", format_duration(job.time_limit_s) if job.source == "scontrol" else None),
        ("submitted", job.submit_time),
        ("started", job.start_time),
        ("ended", job.end_time),
        ("stdout", job.stdout),
        ("stderr", job.stderr if job.stderr != job.stdout else None),
    ]
    for key, value in details:
        if value:
            out.print(Text(f"{key + ':':12} {value}"), soft_wrap=True)
    if run_dir is not None:
        out.print(Text(f"{'run dir:':12} {run_dir}"), soft_wrap=True)
        for line in hang_lines(run_dir) + rank_lines(ranks, time.time()):
            out.print(Text(line), soft_wrap=True)


def print_cluster(info: ClusterInfo, as_json: bool, partition: str | None = None) -> None:
    """The nodes and partitions (only those of `partition` when given)."""
    if partition:
        part = info.partition(partition)
        if part is None:
            names = ", ".join(p.name for p in info.partitions)
            raise UserError(f"--partition {partition}: no such partition; choose one of: {names}")
        info = ClusterInfo(partitions=(part,), nodes=tuple(info.nodes_in(part)))
    if as_json:
        print(json_text(info.to_dict()))
        return
    out = console()
    print_table(NODE_COLUMNS, node_rows(info), out, title="nodes (used/total)")  # thousands of nodes: plain
    out.print(partitions_table(info))
