"""What the cluster has: partitions and nodes (CPUs, memory, GPUs and shards, in total and in use).

Parsing is pure (`parse_partitions`, `parse_nodes`, `parse_shard_use`); `query_cluster` runs
`scontrol show partition -o`, `scontrol -d show node -o` and, only where this Slurm does not print shards in use
per GPU (before 23.11) and the caller shows them (`hpctrain cluster`, not the checks: they need only the totals),
`held_shards`: squeue for the running jobs that asked for shards, then those jobs' `scontrol -d show job` records
to count them per GPU. The forms each Slurm release prints, 20.11 to 25.11, are in tests/data/slurm/ with their
sources.

At scale (10,000 nodes, 100,000 queued jobs: benchmarks/scale_views.py) each parser is one pass over its text, and
of the jobs only the running shard jobs' records are read (the whole dump was 130 MB at 100,000 jobs).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, fields, replace
from typing import Any

from hpctrain.errors import UserError
from hpctrain.schedulers.slurm.commands import Runner, run_bounded, command_error, slurm
from hpctrain.schedulers.slurm.queries.gres import even_split, job_shards_by_gpu, node_usage
from hpctrain.schedulers.slurm.queries.records import (
    Fields,
    new_token,
    field_groups,
    null,
    parse_int,
    parse_records,
    printed_duration,
    printed_mem_mb,
)
from hpctrain.distributed.hostlist import expand_hostlist


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    default: bool
    max_time_s: int | None  # None: no limit
    nodes: tuple[str, ...]
    state: str  # UP, DOWN, DRAIN, INACTIVE
    max_nodes: int | None = None  # per job; None: no limit


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # as Slurm says it, lower case: idle, mixed, allocated, down*, idle+drain, ...
    partitions: tuple[str, ...]
    cpus_total: int
    cpus_alloc: int
    mem_mb_total: int
    mem_mb_alloc: int
    gpu_type: str | None
    gpus_total: int
    gpus_used: int
    shards_total: int
    shards_used: int | None  # None when Slurm does not tell and no job list was available
    shards_per_gpu: tuple[tuple[int, int], ...] | None  # (used, total) per GPU index

    @property
    def usable(self) -> bool:
        """Can take new work now (not down, drained, failing or powered off)."""
        bad = ("down", "drain", "fail", "maint", "future", "power", "inval", "reboot", "not_responding", "blocked")
        return not any(b in self.state for b in bad) and not self.state.endswith("*")


@dataclass(frozen=True)
class ClusterInfo:
    partitions: tuple[PartitionInfo, ...]
    nodes: tuple[NodeInfo, ...]

    def partition(self, name: str) -> PartitionInfo | None:
        return next((p for p in self.partitions if p.name == name), None)

    @property
    def default_partition(self) -> PartitionInfo | None:
        return next((p for p in self.partitions if p.default), None)

    def nodes_in(self, partition: PartitionInfo) -> list[NodeInfo]:
        names = set(partition.nodes)
        return [n for n in self.nodes if n.name in names or partition.name in n.partitions]

    def to_dict(self) -> dict[str, Any]:
        """Plain data for `--json` (tuples become lists)."""
        return {
            "partitions": [_shallow(p) for p in self.partitions],
            "nodes": [{**_shallow(n), "usable": n.usable} for n in self.nodes],
        }


def _shallow(record: PartitionInfo | NodeInfo) -> dict[str, Any]:
    """A record's fields as a dict; its values are already plain (dataclasses.asdict deep-copies each one, several
    times slower for 10,000 nodes)."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


def _expand(nodes: str | None) -> tuple[str, ...]:
    value = null(nodes)
    if value is None:
        return ()
    try:
        return tuple(expand_hostlist(value))
    except ValueError:
        return ()  # an odd list: nodes_in() falls back to each node's Partitions=


def parse_partitions(text: str) -> list[PartitionInfo]:
    """Output of `scontrol show partition -o`."""
    out = []
    for rec in parse_records(text):
        if "PartitionName" not in rec:
            continue
        max_nodes = rec.get("MaxNodes", "UNLIMITED")
        out.append(
            PartitionInfo(
                name=rec["PartitionName"],
                default=rec.get("Default", "NO").upper() == "YES",
                max_time_s=printed_duration(rec.get("MaxTime")),
                nodes=_expand(rec.get("Nodes")),
                state=rec.get("State", "UNKNOWN").upper(),
                max_nodes=int(max_nodes) if max_nodes.isdigit() else None,
            )
        )
    return out


# The fields of a node record that parse_nodes reads besides its name, in _node_values' order.
_NODE_FIELDS = ("State", "Partitions", "CPUEfctv", "CPUTot", "CPUAlloc", "RealMemory", "AllocMem", "Gres", "GresUsed")
_NODE_KEYS = frozenset(("NodeName", *_NODE_FIELDS))


def parse_nodes(text: str) -> list[NodeInfo]:
    """Output of `scontrol -d show node -o` (`-d` adds GresUsed=)."""
    out = []
    for rec in parse_records(text, _NODE_KEYS):
        name = rec.get("NodeName")
        if name is not None:
            out.append(NodeInfo(name, *_node_values(*map(rec.get, _NODE_FIELDS))))
    return out


@functools.lru_cache(maxsize=4096)  # a big cluster's nodes are of a few kinds, and idle or full alike
def _node_values(
    state: str | None,
    partitions: str | None,
    cpus_efctv: str | None,
    cpus_tot: str | None,
    cpus_alloc: str | None,
    real_memory: str | None,
    alloc_mem: str | None,
    gres: str | None,
    gres_used: str | None,
) -> tuple[Any, ...]:
    """A node's NodeInfo fields after its name, from its record's _NODE_FIELDS (pure: the result is immutable)."""
    usage = node_usage(gres, gres_used)
    return (
        ("UNKNOWN" if state is None else state).lower(),
        tuple(p for p in (null(partitions) or "").split(",") if p),
        # CPUEfctv (22.05+): CPUTot less the cores kept for the system (CoreSpecCount); 20.11 and 21.08 lack it.
        parse_int(cpus_efctv, parse_int(cpus_tot)),
        parse_int(cpus_alloc),
        printed_mem_mb(real_memory) or 0,
        printed_mem_mb(alloc_mem) or 0,
        usage.gpu_type,
        usage.gpus_total,
        usage.gpus_used,
        usage.shards_total,
        usage.shards_used,
        usage.shards_per_gpu,
    )


_HOLDING_STATE_RE = re.compile(r"(?:^|\s)JobState=(?:RUNNING|COMPLETING|SUSPENDED)(?:\s|$)")


def record_shard_use(text: str, name: str, use: dict[str, dict[int, int]]) -> None:
    """Add the shards held by the job whose `scontrol -d show job -o` record is the first in `text`, its name being
    `name`, to `use` (per node and GPU index). A record that names no shard, or whose job holds nothing (pending,
    ended), is passed over without being split into fields.

    The record is read where its own name puts it: from the end of `JobName=NAME UserId=` (the first such text: only
    the controller's `JobId=...` comes before it) to the first ` MinCPUsNode=`. Between them scontrol prints only
    what the controller or the administrators wrote (ids, users, account, state, counts, node lists, TRES and the
    per-node GRES lines); what a user writes besides the name (comment, command, directories, output paths) comes
    after (scontrol_print_job in src/scontrol/info_job.c, _sprint_job_info in src/api/job_info.c, 20.11 to 25.11)."""
    anchor = f"JobName={name} UserId="
    start = text.find(anchor)
    if start < 0:
        return
    start += len(anchor)
    end = text.find(" MinCPUsNode=", start)
    fields = text[start:end] if end >= 0 else ""
    if "shard" not in fields or not _HOLDING_STATE_RE.search(fields):
        return
    for group in field_groups(fields[_first_key(fields, "Nodes") :], "Nodes", ("CPU_IDs", "Mem", "GRES")):
        by_gpu = job_shards_by_gpu(group.get("GRES"))
        if not by_gpu:
            continue
        for node in _expand(group["Nodes"]):
            per_node = use.setdefault(node, {})
            for idx, count in by_gpu.items():
                per_node[idx] = per_node.get(idx, 0) + count


def _first_key(text: str, key: str) -> int:
    """Where the first `key=` that starts a field (parse_record's: after whitespace, or at the start) is in `text`;
    its length if none. field_groups reads nothing before the first of its groups' key: the per-node lines come last
    of a job's fields, and one search finds them rather than a split of every field before them."""
    at = text.find(key + "=")
    while at > 0 and not text[at - 1].isspace():
        at = text.find(key + "=", at + 1)
    return len(text) if at < 0 else at


def session_input(ids: list[str], marker: str) -> str:
    """scontrol's stdin for the records of `ids`: `show job ID`, then `show hostnames MARKER<i>` (a host list of
    one name, printed back as it is), so that each job's output ends with a text no job can hold."""
    return "".join(f"show job {job_id}\nshow hostnames {marker}{i}\n" for i, job_id in enumerate(ids))


def parse_shard_use(text: str, names: list[str], marker: str) -> dict[str, dict[int, int]]:
    """scontrol's stdout for session_input(ids, marker) -> shards held per node and GPU index. The text splits at
    the marker (random: records.new_token's digits) into each command's output: what follows `MARKER<i>` up to the
    next marker belongs to job i + 1 (the prompt and echo of a readline build among it), what comes before the first
    marker to job 0."""
    texts = [""] * len(names)
    first, *rest = text.split(marker)
    texts[0] = first
    for piece in rest:
        index, newline, after = piece.partition("\n")
        if index.isdigit() and newline and int(index) + 1 < len(names):
            texts[int(index) + 1] += after
    use: dict[str, dict[int, int]] = {}
    for job_text, name in zip(texts, names):
        record_shard_use(job_text, name, use)
    return use


def fill_shard_use(nodes: list[NodeInfo], use: dict[str, dict[int, int]]) -> list[NodeInfo]:
    """Nodes whose shards in use Slurm did not print, completed from the running jobs."""
    out = []
    for n in nodes:
        if n.shards_total and n.shards_used is None:
            by_gpu = use.get(n.name, {})
            n = replace(
                n, shards_used=sum(by_gpu.values()), shards_per_gpu=even_split(n.shards_total, n.gpus_total, by_gpu)
            )
        out.append(n)
    return out


# squeue -O fields that name every GRES a job asked for (--gres/--gpus* and the --tres-per-* options end up in
# these four; Slurm allocates GRES from them): all exist in 22.05 and 23.02 (_parse_long_format in src/squeue/opts.c,
# _print_job_tres_per_* in src/squeue/print.c, which print N/A when unset, at slurm-22-05-0-1 and slurm-23-02-0-1).
HOLDER_FIELDS = ("JobID", "tres-per-node", "tres-per-job", "tres-per-socket", "tres-per-task", "Name")
HOLDING_STATES = ("RUNNING", "COMPLETING", "SUSPENDED")  # the states in which a job holds its GRES


def shard_holders_argv(fields: Fields | None = None) -> list[str]:
    option = (fields or Fields(HOLDER_FIELDS)).squeue_option()
    return ["squeue", "--noheader", "--states=" + ",".join(HOLDING_STATES), option]


_JOB_ID_RE = re.compile(r"[0-9]+(?:[_+][0-9]+)?")  # 41, an array task 41_3, a het component 41+1


def parse_shard_holders(text: str, fields: Fields) -> list[tuple[str, str]]:
    """Output of shard_holders_argv(fields) -> the ids and names of the jobs that asked for shards (only what reads
    as a job id: each goes to scontrol as a command line)."""
    job_ids, *tres, names = fields.columns(text)
    # " ".join: no "shard" spans two fields (a space is none of its letters), one search a job
    holders = ((i, name) for i, *asked, name in zip(job_ids, *tres, names) if "shard" in " ".join(asked))
    return [(i, name) for i, name in holders if _JOB_ID_RE.fullmatch(i)]


def held_shards(run: Runner = run_bounded) -> dict[str, dict[int, int]]:
    """Shards held per node and GPU index, from the jobs that hold shards only (Slurm 22.05 and 23.02 print shards
    in use per node, not per GPU). Those releases have no query that prints a job's GRES indexes but `scontrol -d
    show job`, of one job or of every job (scontrol_print_job in src/scontrol/info_job.c at slurm-22-05-0-1 and
    slurm-23-02-0-1: one id per command; squeue has no GRES detail field); every job's record is 1.3 KB, 130 MB
    for 100,000 jobs. So squeue names the running jobs that asked for shards, and one scontrol reads their records,
    its commands on stdin (`show job ID` a line: scontrol without a command on its command line reads commands until
    EOF, main() in src/scontrol/scontrol.c at the same tags), each job's output ended by a random marker
    (session_input) and its record read where its name, from squeue, puts it (record_shard_use). A job that ended
    in between is not found: skipped."""
    fields = Fields(HOLDER_FIELDS)
    holders = parse_shard_holders(slurm(shard_holders_argv(fields), run=run).stdout, fields)
    if not holders:
        return {}
    argv = ["scontrol", "-d", "-o"]
    marker = "x" + new_token()[1:]  # a host name: letters and digits
    ids, names = [i for i, _ in holders], [name for _, name in holders]
    result = slurm(argv, run=run, check=False, input=session_input(ids, marker))
    errors = [line for line in result.stderr.splitlines() if line.strip() and "invalid job id" not in line.lower()]
    if result.returncode != 0 and errors:
        raise UserError(command_error(argv, result))
    return parse_shard_use(result.stdout, names, marker)


def query_cluster(run: Runner = run_bounded, shard_use: bool = True) -> ClusterInfo:
    """Ask the live cluster. Raises UserError when the Slurm client is missing or the controller is down.
    shard_use=False leaves the shards in use unknown (None) where this Slurm does not print them, and so never lists
    the jobs: the checks need only each node's totals."""
    partitions = parse_partitions(slurm(["scontrol", "show", "partition", "-o"], run=run).stdout)
    nodes = parse_nodes(slurm(["scontrol", "-d", "show", "node", "-o"], run=run).stdout)
    if shard_use and any(n.shards_total and n.shards_used is None for n in nodes):
        nodes = fill_shard_use(nodes, held_shards(run=run))
    return ClusterInfo(partitions=tuple(partitions), nodes=tuple(nodes))
