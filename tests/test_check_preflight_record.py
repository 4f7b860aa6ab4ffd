"""`hpctrain check --preflight` believes only its own preflight job's record: the run directory may hold an earlier
check's preflight.json (a run directory without %j is the same for every check), and a damaged record is one line.

On the real local Slurm cluster. The preflight job here ends before its preflight (its --resume names no
checkpoint), so whatever preflight.json is in its run directory is not its own."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_fixtures import in_queue
from test_preemption_slurm import TRAIN
from training_helpers import hpctrain

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STALE = {
    "checks": [
        {"rank": 0, "node": "node9", "gemm_gflops": 1.0, "error": None, "links": {}},
        {"rank": 1, "node": "node1", "gemm_gflops": 100.0, "error": None, "links": {}},
    ],
    "median_gflops": 50.5,
    "allreduce_gbps": 1.0,
    "links_gbps": {},
    "slow_share": 0.5,
    "bad_nodes": {"node9": ["rank 0's GEMM runs at 1.0 GFLOP/s"]},
}


@pytest.mark.parametrize("record", ["stale", "damaged"])
def test_check_preflight_never_prints_a_record_that_is_not_its_own(
    slurm_cluster, tmp_path: Path, fashion_data_dir: Path, record: str
) -> None:
    old = tmp_path / "runs" / "fixed-preflight" / "preflight.json"
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps(STALE) if record == "stale" else '{"checks": [{"rank": "zero"')
    result = hpctrain(
        "check",
        "--preflight",
        "--launcher",
        "single",
        "--time",
        "10",
        "train",
        "mnist",
        "--run-dir",
        "runs/fixed",
        *TRAIN,
        "--data-dir",
        str(fashion_data_dir),
        "--resume",
        str(tmp_path / "no-such-checkpoint.pt"),
        cwd=tmp_path,
        timeout=600,
    )
    assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr, result
    assert "node9" not in result.stdout and "passed" not in result.stdout, result.stdout
    lines = [line for line in result.stdout.splitlines() if "runs/fixed-preflight/preflight.json" in line]
    assert len(lines) == 1, result
    line = lines[0]
    why = "is unusable: an earlier run's, not this check's" if record == "stale" else "is unusable: not valid JSON"
    assert line.startswith("preflight: job ") and why in line and line.endswith("no verdict (see the job's output)")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_check_preflight_cancels_the_job_it_submitted(
    slurm_cluster, tmp_path: Path, fashion_data_dir: Path, signum: int
) -> None:
    """Issue 39 §12: `check --preflight` interrupted left its probe queued, to hold a node for its time limit later.
    The probe here waits (--begin an hour away); the command, a fresh interpreter, is interrupted once it said the
    job's id, and that job must be gone."""
    argv = ["check", "--preflight", "--launcher", "single", "--time", "10", "--sbatch=--begin=now+3600"]
    argv += ["train", "mnist", "--run-dir", "runs/held", *TRAIN, "--data-dir", str(fashion_data_dir)]
    process = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", *argv],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    job_id = None
    try:
        for line in process.stdout:
            found = re.match(r"preflight: job (\d+) checks", line)
            if found:
                job_id = found.group(1)
                break
        assert job_id is not None and in_queue(job_id), process.stderr.read()
        process.send_signal(signum)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
        if job_id is not None and in_queue(job_id):
            subprocess.run(["scancel", job_id], check=False)
            pytest.fail(f"job {job_id} is still queued after the command was interrupted")
    assert process.returncode == 128 + signum, err
    assert f"interrupted ({signal.Signals(signum).name}): cancelled job {job_id}, which it had submitted" in err
    assert "Traceback" not in err
