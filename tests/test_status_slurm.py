"""`hpctrain status`, `logs` and `cancel`, and an ended job read back, on real sbatch jobs of local Slurm."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.schedulers.slurm.queries.job_states import TERMINAL_STATES, get_job
from slurm_fixtures import slurm_cluster  # noqa: F401  (the shared session fixture)
from training_helpers import run_hpctrain

pytestmark = pytest.mark.slurm


def hpctrain(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_hpctrain(*args, cwd=cwd, timeout=timeout)


def test_logs_follow_returns_when_the_job_ends(slurm_cluster, tmp_path: Path) -> None:
    script = "for i in 1 2 3 4; do echo tick $i; echo warn $i >&2; sleep 1; done"
    job = slurm_cluster.sbatch(
        "-J", "h4 logs 'quoted' $(x)", "-o", "out-%j.txt", "-e", "err-%j.txt", "--wrap", script, cwd=tmp_path
    )
    try:
        follow = hpctrain("logs", job, "-f", cwd=tmp_path, timeout=400)  # waits while other tests hold the CPUs
        assert follow.returncode == 0, follow.stderr
        assert follow.stdout == "tick 1\ntick 2\ntick 3\ntick 4\n"
        assert f"job {job} ended: COMPLETED" in follow.stderr
        assert slurm_cluster.state(job) == "COMPLETED"

        err = hpctrain("logs", job, "--err", cwd=tmp_path)
        assert (err.returncode, err.stdout) == (0, "warn 1\nwarn 2\nwarn 3\nwarn 4\n")
        again = hpctrain("logs", job, cwd=tmp_path)
        assert (again.stdout, again.stderr) == (follow.stdout, "")
        late = hpctrain("logs", job, "-f", cwd=tmp_path)  # -f on a job that ended before it looked: the same
        assert (late.returncode, late.stdout, late.stderr) == (
            0,
            follow.stdout,
            f"hpctrain logs: job {job} ended: COMPLETED\n",
        )

        status = hpctrain("status", job, "--json")
        assert status.returncode == 0, status.stderr
        info = json.loads(status.stdout)
        assert (info["state"], info["exit_code"], info["restarts"], info["finished"]) == ("COMPLETED", 0, 0, True)
        assert info["name"] == "h4 logs 'quoted' $(x)"
        assert info["stdout"] == str(tmp_path / f"out-{job}.txt")
        assert info["elapsed_s"] >= 3

        listing = hpctrain("status", "--json")
        assert listing.returncode == 0, listing.stderr
        assert job in [j["job_id"] for j in json.loads(listing.stdout)]
        table = hpctrain("status")
        assert any(line.split("│")[1].strip() == job for line in table.stdout.splitlines() if line.count("│") > 2)
    finally:
        slurm_cluster.cancel_quietly(job)


def test_cancel_leaves_the_job_cancelled(slurm_cluster, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch("-J", "h4-cancel", "-o", "out-%j.txt", "--wrap", "echo started; sleep 300", cwd=tmp_path)
    try:
        slurm_cluster.wait_state(job, {"RUNNING"})
        running = json.loads(hpctrain("status", job, "--json").stdout)
        assert running["state"] == "RUNNING" and running["nodes"] in slurm_cluster.nodes
        result = hpctrain("cancel", job)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"job {job}: RUNNING -> CANCELLED"
        assert slurm_cluster.state(job) == "CANCELLED"
        again = hpctrain("cancel", job)
        assert (again.returncode, again.stdout.strip()) == (
            0,
            f"job {job} already ended (CANCELLED); nothing to cancel",
        )
    finally:
        slurm_cluster.cancel_quietly(job)


def test_pending_job_shows_its_reason_and_cancel_works_on_it(slurm_cluster, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch("-J", "h4-held", "--hold", "-o", "out-%j.txt", "--wrap", "true", cwd=tmp_path)
    try:
        info = json.loads(hpctrain("status", job, "--json").stdout)
        assert (info["state"], info["reason"], info["nodes"]) == ("PENDING", "JobHeldUser", None)
        table = hpctrain("status", job).stdout
        assert "JobHeldUser" in table
        logs = hpctrain("logs", job, cwd=tmp_path)
        assert logs.returncode == 2 and "is PENDING and has written no output yet" in logs.stderr
        cancelled = hpctrain("cancel", job)
        assert cancelled.stdout.strip() == f"job {job}: PENDING -> CANCELLED"
    finally:
        slurm_cluster.cancel_quietly(job)


def test_an_ended_job_reads_back_with_its_exit_status(slurm_cluster, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch("-J", "h4-exit3", "-o", "out-%j.txt", "--wrap", "exit 3", cwd=tmp_path)
    slurm_cluster.wait_state(job, set(TERMINAL_STATES), timeout_s=400)
    info = get_job(job)
    assert info is not None and (info.state, info.exit_code, info.finished) == ("FAILED", 3, True)


def test_signal_is_delivered_without_ending_the_job(slurm_cluster, tmp_path: Path) -> None:
    script = "trap 'echo got USR1' USR1; echo ready; for i in $(seq 60); do sleep 1; done"
    job = slurm_cluster.sbatch("-J", "h4-signal", "-o", "out-%j.txt", "--wrap", script, cwd=tmp_path)
    try:
        slurm_cluster.wait_state(job, {"RUNNING"})
        out = tmp_path / f"out-{job}.txt"
        deadline = time.monotonic() + 60
        while "ready" not in (out.read_text() if out.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.1)
        result = hpctrain("cancel", job, "--signal", "USR1", "--full")
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"sent USR1 to job {job} (its steps and batch shell; it was RUNNING)"
        deadline = time.monotonic() + 60
        while "got USR1" not in out.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "got USR1" in out.read_text()
        assert slurm_cluster.state(job) == "RUNNING"
    finally:
        slurm_cluster.cancel_quietly(job)


def test_logs_of_a_job_slurm_forgot_come_from_the_submit_dir(slurm_cluster, tmp_path: Path) -> None:
    # 2**31-2: an id the controller does not know, like a job past MinJobAge without accounting.
    gone = "2147483646"
    (tmp_path / f"slurm-{gone}.out").write_text("old output\n")
    result = hpctrain("logs", gone, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, "old output\n")
    status = hpctrain("status", gone)
    assert status.returncode == 2 and f"job {gone} not found" in status.stderr
    missing = hpctrain("logs", "2147483645", cwd=tmp_path)
    assert missing.returncode == 2 and "no output file for job 2147483645" in missing.stderr


def test_cancel_delivers_sigterm_to_the_jobs_python(slurm_cluster, tmp_path: Path) -> None:
    """hpctrain's training loop checkpoints on SIGTERM; `hpctrain cancel` must deliver it to the job's processes
    (here a python process started by the batch script, as with --launcher single)."""
    (tmp_path / "stop.py").write_text(
        "import signal, sys, time\n"
        "def stop(signum, frame):\n"
        "    print('got SIGTERM', flush=True)\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)\n"
    )
    job = slurm_cluster.sbatch("-J", "h4-term", "-o", "out-%j.txt", "--wrap", f"{sys.executable} stop.py", cwd=tmp_path)
    try:
        slurm_cluster.wait_state(job, {"RUNNING"})
        out = tmp_path / f"out-{job}.txt"
        deadline = time.monotonic() + 60
        while "ready" not in (out.read_text() if out.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.1)
        result = hpctrain("cancel", job)
        assert result.stdout.strip() == f"job {job}: RUNNING -> CANCELLED", result.stderr
        deadline = time.monotonic() + 60  # a bound for a broken test only: a busy machine may be slow to answer
        while "got SIGTERM" not in out.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        lines = out.read_text().splitlines()
        assert lines[0] == "ready" and "got SIGTERM" in lines  # slurmstepd's CANCELLED line may come first
    finally:
        slurm_cluster.cancel_quietly(job)


def test_status_counts_restarts_of_a_requeued_job(slurm_cluster, tmp_path: Path) -> None:
    job = slurm_cluster.sbatch("-J", "h4-requeue", "--requeue", "-o", "out-%j.txt", "--wrap", "sleep 120", cwd=tmp_path)
    try:
        slurm_cluster.wait_state(job, {"RUNNING"})
        subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True)
        deadline = time.monotonic() + 30
        info = json.loads(hpctrain("status", job, "--json").stdout)
        while info["restarts"] < 1 and time.monotonic() < deadline:
            time.sleep(0.5)
            info = json.loads(hpctrain("status", job, "--json").stdout)
        assert info["restarts"] == 1
        assert info["state"] in {"PENDING", "REQUEUED", "COMPLETING", "RUNNING"}
        listed = {j["job_id"]: j for j in json.loads(hpctrain("status", "--json").stdout)}
        assert listed[job]["restarts"] == 1
    finally:
        slurm_cluster.cancel_quietly(job)
