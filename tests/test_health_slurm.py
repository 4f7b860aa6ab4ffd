"""Sick ranks and nodes in Slurm jobs, on the real local cluster.

A hung rank: the job's hang watchdog names the rank that never arrived, ends the attempt as hung, the batch script
requeues the job (within --max-hang-restarts), and the next attempt resumes from the newest checkpoint and ends
with the weights of an uninterrupted run. A sick node: the preflight names it, and the batch script requeues the
job with the node excluded.

The hang: one rank of a 2-process torchrun job is stopped with SIGSTOP (alive and silent, as a rank stuck on a dead
NIC or a swapped-out node). The nodes of the local cluster are this host, so its pid is the one in the rank's
progress record.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hpctrain.health import read_progress
from slurm_fixtures import Job, attempts, in_queue
from test_preemption_slurm import _RESUMED, TRAIN, reference_run
from training_helpers import assert_bitwise_equal, final_weights, hpctrain, ok

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

EPOCHS = 2


@pytest.mark.fresh_steps(processes=6)  # 2 attempts of a torchrun agent and its 2 ranks, fresh
def test_a_hung_rank_is_named_and_the_job_requeued_resumes_exactly(
    slurm_cluster, tmp_path: Path, fashion_data_dir: Path
) -> None:
    result = hpctrain(
        "submit",
        "--output",
        "job-%j.out",
        "--launcher",
        "torchrun",
        "--nproc-per-node",
        "2",
        "--time",
        "20",
        "--max-hang-restarts",
        "1",
        "train",
        "mnist",
        *TRAIN,
        "--data-dir",
        str(fashion_data_dir),
        "--epochs",
        str(EPOCHS),
        "--checkpoint-every",
        "16",
        "--hang-timeout",
        "5",
        cwd=tmp_path,
    )
    job_id = ok(result).stdout.strip()
    job = Job(job_id, tmp_path, tmp_path / "runs" / f"mnist-fashion-mnist-classic-{job_id}")
    # Rank 1 stopped in training, past the first periodic checkpoint (step 16), which the next attempt resumes from.
    deadline = time.monotonic() + 600
    while not (
        records := [r for r in read_progress(job.run_dir) if r.rank == 1 and r.phase == "training" and r.step > 16]
    ):
        assert time.monotonic() < deadline and in_queue(job_id), f"rank 1 never trained past step 16:\n{job.log}"
        time.sleep(0.1)
    os.kill(records[0].pid, signal.SIGSTOP)
    # The uninterrupted local run the job must end equal to takes the CPU while the job waits out its hang timeout
    # and Slurm's requeue hold, not before the job starts (its result is not read before the job has ended).
    with ThreadPoolExecutor(1) as pool:
        reference = pool.submit(reference_run, tmp_path / "reference", fashion_data_dir, EPOCHS, nproc=2)
        job.follow()
        reference_weights = reference.result()

    log = job.log
    first, *later = attempts(log)
    host = records[0].host  # the node as Slurm names it (SLURMD_NODENAME: what --exclude-nodes takes)
    assert host in ("node1", "node2"), records
    assert f"hpctrain: culprit: rank 1 on {host} never arrived in " in first, log
    assert f"requeueing job {job_id} (hang restart 1 of 1)" in first, log
    assert later and "step finished with exit status 0" in later[-1], log
    resumed = _RESUMED.search(later[0])  # from the newest periodic checkpoint (every 16 steps) of the first
    assert resumed and int(resumed.group(4)) % 16 == 0, log
    assert (job.run_dir / "hang" / "report.txt").read_text().count("culprit: rank 1") == 1
    assert (job.run_dir / "hang_restarts").read_text().strip() == "1"
    assert (job.run_dir / "stop_reason").read_text().strip() == "completed"
    assert_bitwise_equal(final_weights(job.run_dir), reference_weights)
    status = ok(hpctrain("status", job_id, "--scheduler", "slurm")).stdout  # the controller still knows the job
    assert "run dir:" in status and str(job.run_dir.name) in status
    # The requeued attempt may have landed on the other node: the rows name the node each rank ran on last.
    rows = [
        line.split()
        for line in status.splitlines()
        if line.split()[:1] in (["0"], ["1"]) and line.split()[1:2] in (["node1"], ["node2"])
    ]
    assert [row[2] for row in rows] == ["finished", "finished"], status


def test_a_sick_node_found_by_the_preflight_is_left_out_of_the_requeued_job(
    slurm_cluster, tmp_path: Path, fashion_data_dir: Path
) -> None:
    # Whatever node the first attempt lands on is "sick": one of its devices is slow (tests/ailing_rank.py: rank 1's
    # preflight GEMM reports a twentieth of its rate, in the first attempt only). The local cluster has two nodes,
    # so the requeued attempt has one left.
    wrapper = Path(__file__).with_name("ailing_rank.py")
    env = {"HPCTRAIN_TEST_AILING_RANK": "1", "HPCTRAIN_TEST_AILING": "sick-gemm", "HPCTRAIN_TEST_AILING_ONCE": "1"}
    result = hpctrain(
        "submit",
        "--output",
        "job-%j.out",
        "--launcher",
        "torchrun",
        "--nproc-per-node",
        "2",
        "--time",
        "20",
        "--run-dir",
        "runs/sick-%j",
        "--",
        sys.executable,
        str(wrapper),
        "train",
        "mnist",
        *TRAIN,
        "--data-dir",
        str(fashion_data_dir),
        "--epochs",
        "1",
        "--preflight",
        cwd=tmp_path,
        env=env,
    )
    job_id = ok(result).stdout.strip()
    job = Job(job_id, tmp_path, tmp_path / "runs" / f"sick-{job_id}")
    job.follow()

    log = job.log
    first, *later = attempts(log)
    sick = re.search(r"hpctrain: preflight: node (node\d) is sick: rank \d's GEMM runs at", first)
    assert sick, log
    node = sick.group(1)
    assert f"requeueing job {job_id} without {node} (restart 1 of 2)" in first, log
    assert later and f"attempt 2 on {node}" not in later[0] and "attempt 2 on node" in later[0], log
    assert "preflight: 2 rank(s) on 1 node(s) passed" in later[0] and "step finished with exit status 0" in later[-1]
    assert (job.run_dir / "excluded_nodes").read_text() == f"{node}\n"
    assert not (job.run_dir / "bad_nodes").exists()  # the passing preflight removed the first attempt's finding
    assert (job.run_dir / "stop_reason").read_text().strip() == "completed"


def test_check_preflight_runs_the_check_as_a_job_of_its_own(
    slurm_cluster, tmp_path: Path, fashion_data_dir: Path
) -> None:
    result = hpctrain(
        "check",
        "--preflight",
        "--launcher",
        "torchrun",
        "--nodes",
        "2",
        "--nproc-per-node",
        "1",
        "--time",
        "20",
        "train",
        "mnist",
        *TRAIN,
        "--data-dir",
        str(fashion_data_dir),
        cwd=tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok: ") and "preflight: job " in result.stdout
    assert "preflight: 2 rank(s) on 2 node(s) passed (" in result.stdout, result.stdout
    [record] = list((tmp_path / "runs").glob("*-preflight/preflight.json"))
    assert sorted(c["node"] for c in json.loads(record.read_text())["checks"]) == ["node1", "node2"]
    assert not list((tmp_path / "runs").glob("*-preflight/metrics.jsonl"))  # nothing was trained


def test_exclude_nodes_keeps_the_job_off_them(slurm_cluster, tmp_path: Path) -> None:
    # Both nodes of the local cluster are free; excluded, node1 is never used, whichever Slurm would pick first.
    for excluded, expected in (("node1", "node2"), ("node2", "node1")):
        result = hpctrain(
            "submit",
            "--launcher",
            "single",
            "--time",
            "5",
            "--output",
            f"job-{excluded}.out",
            "--exclude-nodes",
            excluded,
            "--wait",
            "--",
            "sh",
            "-c",
            'echo "ran on $SLURMD_NODENAME"',
            cwd=tmp_path,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"ran on {expected}\n" in (tmp_path / f"job-{excluded}.out").read_text()
