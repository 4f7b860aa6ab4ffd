"""check_job against the recorded local cluster (2 nodes x 2 CPUs, gpu:2, shard:128; debug and short=30 min)
and a made-up mixed cluster for what the local one cannot show (typed GPUs, uneven nodes, a down partition)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hpctrain.schedulers.slurm.checks.live import Requirements, check_job
from hpctrain.schedulers.slurm.queries.cluster_state import (
    ClusterInfo,
    NodeInfo,
    PartitionInfo,
    parse_nodes,
    parse_partitions,
)

DATA = Path(__file__).parent / "data" / "slurm"


@pytest.fixture(scope="module")
def local() -> ClusterInfo:
    return ClusterInfo(
        partitions=tuple(parse_partitions((DATA / "partitions_22.05.txt").read_text())),
        nodes=tuple(parse_nodes((DATA / "nodes_22.05_busy.txt").read_text())),
    )


def req(**changes) -> Requirements:
    base = Requirements(
        partition=None,
        nodes=1,
        tasks_per_node=1,
        cpus_per_task=1,
        gpus_per_node=0,
        gpu_type=None,
        shards_per_node=0,
        mem_mb_per_node=None,
        time_limit_s=None,
        paths=(),
    )
    return replace(base, **changes)


def test_a_job_that_fits_has_no_problems(local: ClusterInfo, tmp_path: Path) -> None:
    ok = req(
        partition="short",
        nodes=2,
        tasks_per_node=2,
        gpus_per_node=2,
        shards_per_node=0,
        mem_mb_per_node=4096,
        time_limit_s=1800,
        paths=(str(tmp_path),),
    )
    assert check_job(ok, local) == []
    assert check_job(req(shards_per_node=16), local) == []  # a busy cluster is no problem: the job waits


def test_too_many_gpus_per_node(local: ClusterInfo) -> None:
    assert check_job(req(gpus_per_node=8, tasks_per_node=8), local) == [
        "--gpus-per-node 8: no node in partition debug has more than 2 GPU(s); ask for at most 2 per node and use "
        "more nodes (--nodes)",
        "--nproc-per-node 8 x --cpus-per-task 1 = 8 CPUs per node: no node in partition debug has more than 2; "
        "lower --cpus-per-task or --nproc-per-node, and use more nodes (--nodes)",
    ]


def test_too_many_nodes(local: ClusterInfo) -> None:
    problems = check_job(req(nodes=3), local)
    assert problems == [
        "--nodes 3: partition debug has only 2 node(s); ask for at most 2 (--nodes 2) and more processes per node, "
        "or choose a bigger partition"
    ]


def test_time_above_partition_limit(local: ClusterInfo) -> None:
    problems = check_job(req(partition="short", time_limit_s=3600), local)
    assert problems == [
        "--time 01:00:00: partition short allows at most 00:30:00; ask for --time 00:30:00 or less (checkpoint and "
        "resubmit to go on), or use a partition that allows it: debug (no limit)"
    ]
    assert check_job(req(partition="debug", time_limit_s=10 * 86400), local) == []


def test_unknown_partition_lists_the_real_ones(local: ClusterInfo) -> None:
    assert check_job(req(partition="gpu-large"), local) == [
        "--partition gpu-large: no such partition; choose one of: debug, short"
    ]


def test_processes_must_match_gpus(local: ClusterInfo) -> None:
    assert check_job(req(gpus_per_node=2, tasks_per_node=2, partition="short"), local) == []
    assert check_job(req(gpus_per_node=2, tasks_per_node=1), local) == []  # one process, DataParallel
    assert check_job(req(gpus_per_node=1, tasks_per_node=2), local) == [
        "--nproc-per-node 2 with --gpus-per-node 1: run one process per GPU (--nproc-per-node 1), or ask for 2 GPU(s) "
        "per node (--gpus-per-node 2), or run one process that drives all of them (--launcher single)"
    ]


def test_shards_memory_and_missing_paths(local: ClusterInfo, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-dataset")
    assert check_job(req(shards_per_node=64), local) == []
    # 128 shards per node, but 64 per GPU, and one job's shards come from one GPU
    problems = check_job(req(shards_per_node=100, mem_mb_per_node=64 * 1024, paths=(str(tmp_path), missing)), local)
    assert problems == [
        "--gres shard:100: a job's shards on a node all come from one GPU, and no GPU in partition debug has more "
        "than 64; ask for at most shard:64, or whole GPUs (--gpus-per-node)",
        "--mem 64G: no node in partition debug has more than 9.42 GiB of memory; ask for --mem 9642M or less per node",
        f"{missing}: not found; the job runs this program or script, so it must exist at that path (relative to the "
        "directory you submit from, which the job starts in): fix the path, or write or copy it there first",
    ]


def _node(name: str, cpus: int, gpus: int, gpu_type: str | None, mem_mb: int, partitions=("mixed",)) -> NodeInfo:
    return NodeInfo(
        name=name,
        state="idle",
        partitions=partitions,
        cpus_total=cpus,
        cpus_alloc=0,
        mem_mb_total=mem_mb,
        mem_mb_alloc=0,
        gpu_type=gpu_type,
        gpus_total=gpus,
        gpus_used=0,
        shards_total=0,
        shards_used=0,
        shards_per_gpu=None,
    )


@pytest.fixture(scope="module")
def mixed() -> ClusterInfo:
    nodes = (
        _node("a1", 64, 8, "a100", 512_000),
        _node("v1", 32, 4, "v100", 256_000),
        _node("v2", 32, 4, "v100", 256_000),
        _node("c1", 128, 0, None, 1_000_000),
    )
    parts = (
        PartitionInfo("mixed", True, None, ("a1", "v1", "v2", "c1"), "UP"),
        PartitionInfo("closed", False, None, ("c1",), "DOWN"),
    )
    return ClusterInfo(partitions=parts, nodes=nodes)


def test_gpu_type_missing_lists_the_types(mixed: ClusterInfo) -> None:
    assert check_job(req(gpus_per_node=2, tasks_per_node=2, gpu_type="h100"), mixed) == [
        "GPU type h100: no node in partition mixed has it; use one of its types (a100, v100) or leave the type out "
        "(--gpus-per-node 2)"
    ]


def test_typed_gpus_counted_per_type(mixed: ClusterInfo) -> None:
    assert check_job(req(gpus_per_node=8, tasks_per_node=8, gpu_type="a100"), mixed) == []
    assert check_job(req(gpus_per_node=8, tasks_per_node=8, gpu_type="v100"), mixed) == [
        "--gpus-per-node 8: no node in partition mixed has more than 4 v100 GPU(s); ask for at most 4 per node and "
        "use more nodes (--nodes)"
    ]


def test_resources_must_be_on_the_same_nodes(mixed: ClusterInfo) -> None:
    # 8 GPUs exist (a1) and 100 CPUs exist (c1), but not on one node.
    assert check_job(req(gpus_per_node=8, tasks_per_node=8, cpus_per_task=12), mixed) == [
        "no single node in partition mixed has all of 96 CPUs, 8 GPU(s) per node; ask for less per node and use "
        "more nodes (--nodes)"
    ]
    # 4 GPUs per node: three nodes can, four cannot.
    assert check_job(req(nodes=4, gpus_per_node=4, tasks_per_node=4), mixed) == [
        "--nodes 4: only 3 node(s) in partition mixed can hold 4 CPUs, 4 GPU(s) each (a1, v1, v2); ask for --nodes 3 "
        "or less per node"
    ]


def test_shards_where_there_are_none(mixed: ClusterInfo) -> None:
    assert check_job(req(shards_per_node=1), mixed) == [
        "--gres shard:1: no node in partition mixed has shards; choose a partition whose GPUs are shared (shard GRES) "
        "or ask for whole GPUs (--gpus-per-node)"
    ]


def test_down_partition(mixed: ClusterInfo) -> None:
    assert check_job(req(partition="closed"), mixed) == [
        "--partition closed: the partition is DOWN and starts no jobs; choose one that is up: mixed"
    ]


def test_no_default_partition(mixed: ClusterInfo) -> None:
    no_default = ClusterInfo(partitions=tuple(replace(p, default=False) for p in mixed.partitions), nodes=mixed.nodes)
    assert check_job(req(), no_default) == [
        "the cluster has no default partition: choose one with --partition (closed, mixed)"
    ]


def test_slurm_errors_do_not_send_users_to_a_script_only_a_checkout_has() -> None:
    """scripts/local-slurm.sh exists in a checkout of hpctrain, not in an installed one: never the advice."""
    import subprocess

    from hpctrain.schedulers.slurm.commands import slurm
    from hpctrain.errors import UserError

    def missing(argv, **kw):
        raise FileNotFoundError(argv[0])

    with pytest.raises(UserError) as err:
        slurm(["squeue"], run=missing)
    assert "login node" in str(err.value) and "local-slurm.sh" not in str(err.value)

    def down(argv, **kw):
        return subprocess.CompletedProcess(
            argv, 1, stdout="", stderr="slurm_load_jobs error: Unable to contact slurm controller"
        )

    with pytest.raises(UserError) as err:
        slurm(["squeue"], run=down, timeout=0.5)  # asked again after 1 s only while the deadline allows: not here
    assert "scontrol ping" in str(err.value) and "local-slurm.sh" not in str(err.value)


def test_a_missing_environment_tool_is_a_problem_only_when_the_nodes_are_this_host() -> None:
    """Issue 39 §17: nodes that are this host (names resolving to loopback) cannot have what it lacks; nodes
    elsewhere may (a warning). `.invalid` names never resolve (RFC 6761)."""
    from hpctrain.schedulers.slurm.checks.live import tool_problems
    from hpctrain.schedulers.slurm.queries.cluster_state import ClusterInfo, NodeInfo, PartitionInfo

    def cluster(*names: str) -> ClusterInfo:
        nodes = tuple(NodeInfo(n, "idle", ("p",), 2, 0, 1000, 0, None, 0, 0, 0, 0, None) for n in names)
        return ClusterInfo(partitions=(PartitionInfo("p", True, None, names, "UP"),), nodes=nodes)

    missing = [("conda", "--conda-env")]
    [here] = tool_problems(missing, cluster("localhost"), None)
    assert here.startswith("--conda-env: the job's batch shell needs `conda`, and its nodes (localhost) are this host")
    [elsewhere] = tool_problems(missing, cluster("localhost", "gpu07.invalid"), "p")
    assert elsewhere.startswith("warning: --conda-env: the job's batch shell needs `conda`, which this host does not")
    assert tool_problems([], cluster("localhost"), None) == []
