"""Pre-submit checks: can this cluster ever run the job as asked? One line per problem, each naming the fix.

Only what is known for sure is reported: a partition that does not exist, a time limit above its MaxTime,
more nodes than it has, a per-node request no node can hold, a process count that does not match the GPUs,
paths the job will read that are missing. Whether resources are free right now is not a problem (the job waits).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hpctrain.schedulers.slurm.queries.cluster_state import ClusterInfo, NodeInfo, PartitionInfo
from hpctrain.fsutil import format_bytes
from hpctrain.jobs.values import format_duration
from hpctrain.schedulers.slurm.grammar import slurm_mem


@dataclass(frozen=True)
class Requirements:
    """What one job asks for, per node unless said otherwise (built by `hpctrain submit/check`)."""

    partition: str | None
    nodes: int
    tasks_per_node: int  # processes per node
    cpus_per_task: int
    gpus_per_node: int
    gpu_type: str | None
    shards_per_node: int
    mem_mb_per_node: int | None
    time_limit_s: int | None
    paths: tuple[str, ...] = ()

    @property
    def cpus_per_node(self) -> int:
        return self.tasks_per_node * self.cpus_per_task


def _names(items: Iterable[str]) -> str:
    return ", ".join(sorted(items)) or "(none)"


def check_job(req: Requirements, cluster: ClusterInfo) -> list[str]:
    """Problems that would keep the job from ever running on `cluster`; empty when it fits."""
    return _check_process_layout(req) + check_cluster(req, cluster) + _check_paths(req.paths)


def check_here(req: Requirements) -> list[str]:
    """The checks that need no cluster: the process layout, and the paths the job reads (the submit host shares
    the file system with the nodes). `submit --dry-run` and `--no-check` run these too."""
    return _check_process_layout(req) + _check_paths(req.paths)


def check_cluster(req: Requirements, cluster: ClusterInfo) -> list[str]:
    """The checks against the live cluster: the partition, its time limit, its nodes and what they hold."""
    problems: list[str] = []
    partition = _pick_partition(req, cluster, problems)
    if partition is not None:
        problems += _check_time(req, partition, cluster)
        problems += _check_nodes(req, partition, cluster.nodes_in(partition))
    return problems


def _pick_partition(req: Requirements, cluster: ClusterInfo, problems: list[str]) -> PartitionInfo | None:
    names = [p.name for p in cluster.partitions]
    if req.partition is None:
        partition = cluster.default_partition
        if partition is None:
            problems.append(f"the cluster has no default partition: choose one with --partition ({_names(names)})")
        return partition
    partition = cluster.partition(req.partition)
    if partition is None:
        problems.append(f"--partition {req.partition}: no such partition; choose one of: {_names(names)}")
        return None
    if partition.state != "UP":
        others = [p.name for p in cluster.partitions if p.state == "UP"]
        problems.append(
            f"--partition {partition.name}: the partition is {partition.state} and starts no jobs; "
            f"choose one that is up: {_names(others)}"
        )
    return partition


def _check_time(req: Requirements, partition: PartitionInfo, cluster: ClusterInfo) -> list[str]:
    limit = partition.max_time_s
    if req.time_limit_s is None or limit is None or req.time_limit_s <= limit:
        return []
    longer = [
        f"{p.name} ({'no limit' if p.max_time_s is None else format_duration(p.max_time_s)})"
        for p in cluster.partitions
        if p.max_time_s is None or p.max_time_s >= req.time_limit_s
    ]
    hint = f", or use a partition that allows it: {', '.join(longer)}" if longer else ""
    return [
        f"--time {format_duration(req.time_limit_s)}: partition {partition.name} allows at most "
        f"{format_duration(limit)}; ask for --time {format_duration(limit)} or less (checkpoint and resubmit "
        f"to go on){hint}"
    ]


def _check_process_layout(req: Requirements) -> list[str]:
    # One process per GPU (DDP), or a single process driving all of a node's GPUs (DataParallel).
    if req.gpus_per_node > 0 and req.tasks_per_node not in (1, req.gpus_per_node):
        return [
            f"--nproc-per-node {req.tasks_per_node} with --gpus-per-node {req.gpus_per_node}: run one process per "
            f"GPU (--nproc-per-node {req.gpus_per_node}), or ask for {req.tasks_per_node} GPU(s) per node "
            f"(--gpus-per-node {req.tasks_per_node}), or run one process that drives all of them (--launcher single)"
        ]
    return []


def _shards_one_job(node: NodeInfo) -> int:
    """The most shards one job can hold on the node: Slurm takes them from a single GPU (seen on 22.05 both with
    shards bound to GPU files and with a plain `Name=shard Count=N`, which it splits evenly over the GPUs)."""
    if node.shards_per_gpu:
        return max(total for _, total in node.shards_per_gpu)
    if node.gpus_total > 0 and node.shards_total % node.gpus_total == 0:
        return node.shards_total // node.gpus_total
    return node.shards_total


def _fits(req: Requirements, node: NodeInfo) -> bool:
    return (
        node.cpus_total >= req.cpus_per_node
        and node.gpus_total >= req.gpus_per_node
        and (req.gpu_type is None or req.gpus_per_node == 0 or node.gpu_type == req.gpu_type)
        and _shards_one_job(node) >= req.shards_per_node
        and (req.mem_mb_per_node is None or node.mem_mb_total >= req.mem_mb_per_node)
    )


def _check_nodes(req: Requirements, partition: PartitionInfo, nodes: list[NodeInfo]) -> list[str]:
    where = f"partition {partition.name}"
    if not nodes:
        return [f"{where} has no nodes: choose another partition with --partition"]
    problems: list[str] = []
    if req.nodes > len(nodes):
        problems.append(
            f"--nodes {req.nodes}: {where} has only {len(nodes)} node(s); ask for at most {len(nodes)} "
            f"(--nodes {len(nodes)}) and more processes per node, or choose a bigger partition"
        )
    elif partition.max_nodes is not None and req.nodes > partition.max_nodes:
        problems.append(
            f"--nodes {req.nodes}: {where} allows at most {partition.max_nodes} node(s) per job; "
            f"ask for --nodes {partition.max_nodes} or fewer"
        )

    per_resource = []  # one line per resource that no node has enough of
    if req.gpus_per_node > 0:
        if req.gpu_type is not None:
            typed = [n for n in nodes if n.gpu_type == req.gpu_type]
            if not typed:
                types = {n.gpu_type for n in nodes if n.gpu_type}
                choice = f"use one of its types ({_names(types)}) or leave" if types else "its GPUs have no type: leave"
                per_resource.append(
                    f"GPU type {req.gpu_type}: no node in {where} has it; {choice} the type out "
                    f"(--gpus-per-node {req.gpus_per_node})"
                )
            pool = typed or nodes
        else:
            pool = nodes
        most = max(n.gpus_total for n in pool)
        if req.gpus_per_node > most:
            kind = f" {req.gpu_type}" if req.gpu_type else ""
            fix = (
                f"ask for at most {most} per node and use more nodes (--nodes)"
                if most
                else "choose a partition with GPUs"
            )
            per_resource.append(
                f"--gpus-per-node {req.gpus_per_node}: no node in {where} has more than {most}{kind} GPU(s); {fix}"
            )
    if req.shards_per_node > 0:
        most = max(_shards_one_job(n) for n in nodes)
        if req.shards_per_node > most:
            if most:
                per_resource.append(
                    f"--gres shard:{req.shards_per_node}: a job's shards on a node all come from one GPU, and no GPU "
                    f"in {where} has more than {most}; ask for at most shard:{most}, or whole GPUs (--gpus-per-node)"
                )
            else:
                per_resource.append(
                    f"--gres shard:{req.shards_per_node}: no node in {where} has shards; choose a partition whose "
                    f"GPUs are shared (shard GRES) or ask for whole GPUs (--gpus-per-node)"
                )
    most_cpus = max(n.cpus_total for n in nodes)
    if req.cpus_per_node > most_cpus:
        per_resource.append(
            f"--nproc-per-node {req.tasks_per_node} x --cpus-per-task {req.cpus_per_task} = {req.cpus_per_node} CPUs "
            f"per node: no node in {where} has more than {most_cpus}; lower --cpus-per-task or --nproc-per-node, "
            f"and use more nodes (--nodes)"
        )
    if req.mem_mb_per_node is not None:
        most_mem = max(n.mem_mb_total for n in nodes)
        if req.mem_mb_per_node > most_mem:
            per_resource.append(
                f"--mem {slurm_mem(req.mem_mb_per_node)}: no node in {where} has more than "
                f"{format_bytes(most_mem << 20)} of memory; "
                f"ask for --mem {slurm_mem(most_mem)} or less per node"
            )
    problems += per_resource
    if per_resource:
        return problems

    # Each resource exists somewhere; the job needs them together, on req.nodes nodes.
    fitting = [n for n in nodes if _fits(req, n)]
    if not fitting:
        problems.append(
            f"no single node in {where} has all of {_describe(req)} per node; ask for less per node and use "
            f"more nodes (--nodes)"
        )
    elif req.nodes > len(fitting) and req.nodes <= len(nodes):
        problems.append(
            f"--nodes {req.nodes}: only {len(fitting)} node(s) in {where} can hold {_describe(req)} each "
            f"({_names(n.name for n in fitting)}); ask for --nodes {len(fitting)} or less per node"
        )
    return problems


def _describe(req: Requirements) -> str:
    parts = [f"{req.cpus_per_node} CPUs"]
    if req.gpus_per_node:
        parts.append(f"{req.gpus_per_node} {req.gpu_type + ' ' if req.gpu_type else ''}GPU(s)")
    if req.shards_per_node:
        parts.append(f"{req.shards_per_node} shards")
    if req.mem_mb_per_node is not None:
        parts.append(f"{format_bytes(req.mem_mb_per_node << 20)} memory")
    return ", ".join(parts)


def _check_paths(paths: Iterable[str]) -> list[str]:
    return [
        f"{p}: not found; the job runs this program or script, so it must exist at that path (relative to the "
        f"directory you submit from, which the job starts in): fix the path, or write or copy it there first"
        for p in paths
        if p and not os.path.exists(os.path.expanduser(p))
    ]


def missing_tools(tools: list[tuple[str, str]], environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The tools (name, the option that needs it) this host's batch shell would not find: `module` as bash started
    by sbatch sees it (a function it exports, or a command), the others on the PATH that sbatch passes on."""
    missing = []
    for name, option in tools:
        if name == "module":
            try:
                found = (
                    subprocess.run(
                        ["bash", "-c", "type module"], env=dict(environ), capture_output=True, timeout=30, check=False
                    ).returncode
                    == 0
                )
            except (OSError, subprocess.TimeoutExpired):
                found = True  # cannot tell: say nothing
        else:
            found = shutil.which(name, path=environ.get("PATH", os.defpath)) is not None
        if not found:
            missing.append((name, option))
    return missing


def tool_problems(missing: list[tuple[str, str]], cluster: ClusterInfo, partition: str | None) -> list[str]:
    """What the missing tools mean: a problem when the job's nodes are this host (each of the partition's node
    names resolves to an address of this host, as on a one-machine cluster: the batch shell would stop at once),
    else a warning (the nodes may have what this host lacks)."""
    if not missing:
        return []
    part = cluster.partition(partition) if partition else cluster.default_partition
    nodes = [n.name for n in cluster.nodes_in(part)] if part is not None else []
    here = bool(nodes) and all(_is_this_host(name) for name in nodes)
    problems = []
    for name, option in missing:
        if here:
            problems.append(
                f"{option}: the job's batch shell needs `{name}`, and its nodes ({_names(nodes)}) are this host, "
                f"where bash finds no `{name}`: the job would stop at once; install it, make it available to "
                f"non-interactive shells, or drop {option}"
            )
        else:
            problems.append(
                f"warning: {option}: the job's batch shell needs `{name}`, which this host does not have; the job "
                "stops at once unless its nodes have it"
            )
    return problems


def _is_this_host(name: str) -> bool:
    """Whether every address `name` resolves to is a loopback address or one of this host's own."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(name, None)}
        own = set(socket.gethostbyname_ex(socket.gethostname())[2])
    except (OSError, UnicodeError):
        return False
    return bool(addresses) and all(a in own or a.startswith("127.") or a == "::1" for a in addresses)
