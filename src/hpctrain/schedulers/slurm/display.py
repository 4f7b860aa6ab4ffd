"""Rich tables for `hpctrain cluster` and `hpctrain status`: pure functions from parsed data to a Table."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

from hpctrain.schedulers.slurm.jobs import JobInfo
from hpctrain.schedulers.slurm.query import ClusterInfo, NodeInfo
from hpctrain.schedulers.slurm.records import format_duration


def console() -> Console:
    """stdout console; when piped or captured, wide enough that no cell is cut (logs and CI read it whole)."""
    if sys.stdout.isatty():
        return Console()
    return Console(width=200, no_color=True, soft_wrap=False)


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


def nodes_table(info: ClusterInfo) -> Table:
    table = Table(title="nodes (used/total)", title_justify="left")
    for col in ("node", "state", "partitions", "CPUs", "memory", "GPUs", "shards"):
        table.add_column(col, overflow="fold")
    for n in info.nodes:
        table.add_row(
            n.name,
            n.state,
            ",".join(n.partitions),
            f"{n.cpus_alloc}/{n.cpus_total}",
            f"{_mem(n.mem_mb_alloc)}/{_mem(n.mem_mb_total)}",
            gpus_cell(n),
            shards_cell(n),
        )
    return table


def partitions_table(info: ClusterInfo) -> Table:
    table = Table(title="partitions", title_justify="left")
    for col in ("partition", "state", "max time", "nodes"):
        table.add_column(col, overflow="fold")
    for p in info.partitions:
        table.add_row(
            p.name + (" (default)" if p.default else ""),
            p.state,
            "no limit" if p.max_time_s is None else format_duration(p.max_time_s),
            str(len(p.nodes)),
        )
    return table


def jobs_table(jobs: list[JobInfo]) -> Table:
    table = Table()
    for col in ("job", "name", "state", "reason", "nodes", "elapsed", "restarts"):
        table.add_column(col, overflow="fold")
    for j in jobs:
        nodes = j.nodes or (f"({j.num_nodes} wanted)" if j.num_nodes else "")
        table.add_row(
            j.job_id,
            j.name,
            j.state,
            j.reason or "",  # why it waits, or why it failed (NonZeroExitCode, TimeLimit, ...)
            nodes,
            "" if j.elapsed_s is None else format_duration(j.elapsed_s),
            str(j.restarts),
        )
    return table
