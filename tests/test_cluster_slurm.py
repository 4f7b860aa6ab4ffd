"""`hpctrain cluster` and check_job against the real local Slurm cluster (scripts/local-slurm.sh)."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from hpctrain.schedulers.slurm.checks.live import Requirements, check_job
from hpctrain.schedulers.slurm.queries.cluster_state import query_cluster
from slurm_fixtures import slurm_cluster  # noqa: F401  (the shared session fixture)
from training_helpers import run_hpctrain

pytestmark = pytest.mark.slurm


def hpctrain(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_hpctrain(*args, cwd=cwd, timeout=120)


def test_cluster_json_shows_both_nodes_and_partitions(slurm_cluster) -> None:
    result = hpctrain("cluster", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    nodes = {n["name"]: n for n in data["nodes"]}
    assert set(nodes) == {"node1", "node2"}
    for n in nodes.values():
        assert (n["gpus_total"], n["shards_total"], n["cpus_total"]) == (2, 128, n["cpus_total"])
        assert n["cpus_total"] >= 1 and n["mem_mb_total"] > 0
        assert n["partitions"] == ["debug", "short"]
        assert n["shards_used"] is not None and len(n["shards_per_gpu"]) == 2
    parts = {p["name"]: p for p in data["partitions"]}
    assert parts["short"]["max_time_s"] == 1800 and parts["debug"]["default"] is True


def test_cluster_shows_shards_in_use_while_a_shard_job_runs(slurm_cluster, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch(
        "--gres=shard:16", "-J", "h4-shard", "-o", str(tmp_path / "out-%j"), "--wrap", "sleep 30", cwd=tmp_path
    )
    try:
        slurm_cluster.wait_state(job, {"RUNNING"})
        node = subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True).stdout.strip()
        result = hpctrain("cluster", "--json")
        assert result.returncode == 0, result.stderr
        info = {n["name"]: n for n in json.loads(result.stdout)["nodes"]}[node]
        assert info["shards_used"] >= 16  # other tests may hold shards too
        assert sum(u for u, _ in info["shards_per_gpu"]) == info["shards_used"]
        assert any(u >= 16 for u, _ in info["shards_per_gpu"])  # all 16 on one GPU
        table = hpctrain("cluster")
        assert table.returncode == 0, table.stderr
        row = next(line for line in table.stdout.splitlines() if f" {node} " in line)
        assert f"{info['shards_used']}/128" in row
    finally:
        slurm_cluster.cancel_quietly(job)


BASE = Requirements(
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


def test_check_job_against_the_live_cluster(slurm_cluster) -> None:
    info = query_cluster()
    assert (
        check_job(replace(BASE, nodes=2, tasks_per_node=1, gpus_per_node=1, partition="short", time_limit_s=600), info)
        == []
    )
    assert check_job(replace(BASE, gpus_per_node=3, tasks_per_node=3), info)[0] == (
        "--gpus-per-node 3: no node in partition debug has more than 2 GPU(s); ask for at most 2 per node and use "
        "more nodes (--nodes)"
    )
    assert check_job(replace(BASE, nodes=3), info) == [
        "--nodes 3: partition debug has only 2 node(s); ask for at most 2 (--nodes 2) and more processes per node, "
        "or choose a bigger partition"
    ]
    assert check_job(replace(BASE, partition="short", time_limit_s=45 * 60), info) == [
        "--time 00:45:00: partition short allows at most 00:30:00; ask for --time 00:30:00 or less (checkpoint and "
        "resubmit to go on), or use a partition that allows it: debug (no limit)"
    ]
    assert check_job(replace(BASE, partition="gpu"), info) == [
        "--partition gpu: no such partition; choose one of: debug, short"
    ]


def test_sbatch_agrees_with_the_checks(slurm_cluster, tmp_path: Path) -> None:
    """What check_job rejects, Slurm refuses too, and what it accepts at the limits, Slurm accepts; a time above
    MaxTime is the exception: Slurm takes the job and leaves it pending for ever, which is why it is checked."""
    info = query_cluster()
    mem = max(n.mem_mb_total for n in info.nodes)
    cpus = max(n.cpus_total for n in info.nodes)
    cases = [  # (requirements, sbatch options, fits)
        (replace(BASE, gpus_per_node=3, tasks_per_node=1), ["--gres=gpu:3"], False),
        (replace(BASE, nodes=3), ["--nodes=3"], False),
        (replace(BASE, partition="gpu"), ["--partition=gpu"], False),
        (replace(BASE, shards_per_node=65), ["--gres=shard:65"], False),
        (replace(BASE, mem_mb_per_node=mem + 1), [f"--mem={mem + 1}"], False),
        (replace(BASE, tasks_per_node=cpus + 1), [f"--ntasks-per-node={cpus + 1}"], False),
        (replace(BASE, cpus_per_task=cpus + 1), [f"--cpus-per-task={cpus + 1}"], False),
        (replace(BASE, shards_per_node=64, mem_mb_per_node=mem), ["--gres=shard:64", f"--mem={mem}"], True),
        (
            replace(BASE, nodes=2, tasks_per_node=2, gpus_per_node=2),
            ["--nodes=2", "--ntasks-per-node=2", "--gres=gpu:2"],
            True,
        ),
    ]
    for req, args, fits in cases:
        assert (check_job(req, info) == []) == fits, (args, check_job(req, info))
        result = subprocess.run(
            ["sbatch", "--parsable", "--test-only", *args, "--wrap", "true"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert (result.returncode == 0) == fits, (args, result.stderr)
    job = slurm_cluster.sbatch("--partition=short", "--time=00:45:00", "-o", "out-%j", "--wrap", "true", cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while True:  # the first answer is PartitionConfig; the scheduler's next pass names the limit
            reason = subprocess.run(
                ["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True
            ).stdout.split()
            if reason != ["PENDING", "PartitionConfig"] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert reason == ["PENDING", "PartitionTimeLimit"]
    finally:
        slurm_cluster.cancel_quietly(job)


def test_check_without_a_command_checks_the_resources_as_the_docs_show(slurm_cluster, tmp_path: Path) -> None:
    """docs/slurm.md shows `hpctrain check` with job options only; it used to fail with "no command"."""
    ok = hpctrain(
        "check",
        "--partition",
        "short",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--nproc-per-node",
        "2",
        "--time",
        "20:00",
        cwd=tmp_path,
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == (
        "ok: hpctrain: 2 node(s) x 2 process(es), launcher torchrun, partition short, gres gpu:2, "
        "time 20:00 (the resources only: add `-- COMMAND ...` or `train WORKLOAD ...` to check the "
        "program too)\n"
    )
    assert ok.stderr == ""
    too_long = hpctrain("check", "--partition", "short", "--time", "1-00:00:00", cwd=tmp_path)
    assert too_long.returncode == 2 and "partition short allows at most 00:30:00" in too_long.stderr
    assert not list(tmp_path.iterdir())  # nothing written
