"""Issue 40 item 4 on the real local Slurm cluster: with slurmctld stopped (SIGSTOP), `status`, `status JOB`,
`cluster`, `submit` and `cancel` each end with one line naming the fix, at the deadline HPCTRAIN_SLURM_TIMEOUT
sets (the test never asserts on a duration: it reads the deadline in the line, and a command that hung would
outlive the guard that run_hpctrain puts on it).

The cluster is shared with other tests: the controller is stopped once, for the few seconds the commands take
together (they run at once), a timer continues it after 25 s whatever happens, and it is continued in `finally`;
the test then waits until `scontrol ping` answers again.

There is no slurmdbd on this cluster (AccountingStorageType=none), so the slurmdbd case uses a stand-in: a `sacct`
on PATH that never answers, as one behind a stuck slurmdbd would not.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from slurm_fixtures import slurm_cluster  # noqa: F401  (the shared session fixture)
from training_helpers import run_hpctrain

pytestmark = pytest.mark.slurm

DEADLINE_S = "4"
GUARD_S = 60  # run_hpctrain's timeout: only a command that ignores the deadline gets near it
SLURM = ("--scheduler", "slurm")


def slurmctld_pid() -> int:
    """The controller's pid, from the pid file its configuration names (scripts/local-slurm.sh writes it)."""
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    (path,) = [line.split("=", 1)[1].strip() for line in config.splitlines() if line.startswith("SlurmctldPidFile")]
    pid = int(Path(path).read_text().strip())
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "slurmctld"
    return pid


def controller_answers() -> bool:
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, check=False, timeout=60)
    return ping.returncode == 0 and "is UP" in ping.stdout


def one_line(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if ": note: " not in line]  # submit's notes
    assert len(lines) == 1 and lines[0].startswith("hpctrain "), proc.stderr
    for word in words:
        assert word in lines[0], proc.stderr
    return lines[0]


def test_a_stopped_controller_ends_each_command_with_one_line(slurm_cluster, tmp_path: Path) -> None:
    name = f"unreachable-{secrets.token_hex(4)}"
    job = slurm_cluster.sbatch("--hold", "-J", name, "--wrap", "true", cwd=tmp_path)  # held: it holds no node
    env = {**os.environ, "HPCTRAIN_SLURM_TIMEOUT": DEADLINE_S}
    submit = ("submit", *SLURM, "--job-name", name, "--", "true")
    commands = {
        "status": ("status", *SLURM),
        "status JOB": ("status", job, *SLURM),
        "cluster": ("cluster", *SLURM),
        "submit": submit,
        "submit --no-check": (submit[0], "--no-check", *submit[1:]),
        "cancel": ("cancel", job, *SLURM),
    }
    pid = slurmctld_pid()
    assert controller_answers()
    # Answered while the controller runs; this also starts the harness's warm process before the commands below
    # ask it at once (tests/warm_start.py), so that they start fast while the controller is stopped.
    up = run_hpctrain("status", job, *SLURM, cwd=tmp_path, env=env, timeout=GUARD_S)
    assert up.returncode == 0 and "PENDING" in up.stdout, up
    results: dict[str, subprocess.CompletedProcess[str]] = {}
    safety = threading.Timer(25, os.kill, (pid, signal.SIGCONT))
    try:
        os.kill(pid, signal.SIGSTOP)
        safety.start()
        with ThreadPoolExecutor(len(commands)) as pool:
            futures = {
                key: pool.submit(run_hpctrain, *args, cwd=tmp_path, env=env, timeout=GUARD_S)
                for key, args in commands.items()
            }
            results = {key: future.result() for key, future in futures.items()}
    finally:
        os.kill(pid, signal.SIGCONT)
        safety.cancel()
        for _ in range(60):
            if controller_answers():
                break
            time.sleep(1)
        else:
            pytest.fail("slurmctld does not answer `scontrol ping` after SIGCONT")
        # sbatch that got no answer may have been queued when the controller went on: this test's jobs only
        queued = subprocess.run(
            ["squeue", "--noheader", f"--name={name}", "--format=%i"], capture_output=True, text=True, check=False
        ).stdout.split()
        for job_id in {job, *queued}:
            slurm_cluster.cancel_quietly(job_id)

    for key, proc in results.items():
        line = one_line(proc, "scontrol ping")
        assert f"got no answer from the Slurm controller within {DEADLINE_S} s" in line, (key, line)
    assert "the job may have been queued anyway" in results["submit --no-check"].stderr
    if not queued:  # a job sbatch queued after all may have started and made its run directory before its cancel
        assert not (tmp_path / "runs").exists()  # nothing half-written by the refused submits


def test_a_sacct_that_never_answers_ends_status_at_the_deadline(slurm_cluster, tmp_path: Path) -> None:
    """A job the controller does not know is asked of sacct; a stuck slurmdbd (here: a stand-in sacct that sleeps)
    must not hang `status JOB`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sacct"
    fake.write_text("#!/bin/sh\n# stands in for sacct behind a slurmdbd that never answers\nexec sleep 300\n")
    fake.chmod(0o755)
    env = {**os.environ, "HPCTRAIN_SLURM_TIMEOUT": DEADLINE_S, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = run_hpctrain("status", "67000000", *SLURM, cwd=tmp_path, env=env, timeout=GUARD_S)
    one_line(
        proc,
        f"`sacct --noheader --parsable2` got no answer from Slurm's accounting daemon (slurmdbd) within {DEADLINE_S} s",
        "sacctmgr show cluster",
        "HPCTRAIN_SLURM_TIMEOUT",
    )
