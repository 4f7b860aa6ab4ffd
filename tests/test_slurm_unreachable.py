"""Issue 40 item 4 with the real Slurm commands: when the controller does not answer, `status`, `status JOB`,
`cluster`, `submit` and `cancel` each end with one line naming the fix, at the deadline HPCTRAIN_SLURM_TIMEOUT
sets (the test never asserts on a duration: it reads the deadline in the line, and a command that hung would
outlive the guard that run_hpctrain puts on it).

The controller that never answers is a socket that takes connections and reads nothing, named by a copy of the
local cluster's slurm.conf (SLURM_CONF) as its SlurmctldHost and SlurmctldPort: to Slurm's own client commands it
is what a hung slurmctld is (they connect, send, and wait for an answer), and the shared cluster the other tests
use goes on undisturbed. (Stopping the shared slurmctld with SIGSTOP, as this test once did, stalled every test
running at the same time, and a fixture that found it not answering started the cluster afresh.)

There is no slurmdbd on this cluster (AccountingStorageType=none), so the slurmdbd case uses a stand-in: a `sacct`
on PATH that never answers, as one behind a stuck slurmdbd would not.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from slurm_fixtures import slurm_cluster  # noqa: F401  (the shared session fixture)
from training_helpers import run_hpctrain

pytestmark = pytest.mark.slurm

DEADLINE_S = "4"
GUARD_S = 60  # run_hpctrain's timeout: only a command that ignores the deadline gets near it
SLURM = ("--scheduler", "slurm")


def one_line(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if ": note: " not in line]  # submit's notes
    assert len(lines) == 1 and lines[0].startswith("hpctrain "), proc.stderr
    for word in words:
        assert word in lines[0], proc.stderr
    return lines[0]


@pytest.fixture
def silent_controller(slurm_cluster, tmp_path: Path) -> Iterator[Path]:
    """A slurm.conf like the cluster's whose controller takes connections and never answers."""
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    (path,) = [line.split("=", 1)[1].strip() for line in config.splitlines() if line.startswith("SLURM_CONF ")]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)  # never accepted: the kernel completes the connections, nobody reads them
        port = listener.getsockname()[1]
        text, found = re.subn(
            r"^SlurmctldHost=.*$",
            f"SlurmctldHost=silent(127.0.0.1)\nSlurmctldPort={port}",
            Path(path).read_text(),
            flags=re.M,
        )
        assert found == 1, path
        silent = tmp_path / "slurm.conf"
        silent.write_text(text)
        yield silent


def test_a_controller_that_never_answers_ends_each_command_with_one_line(
    silent_controller: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "HPCTRAIN_SLURM_TIMEOUT": DEADLINE_S, "SLURM_CONF": str(silent_controller)}
    submit = ("submit", *SLURM, "--job-name", "unreachable", "--", "true")
    commands = {
        "status": ("status", *SLURM),
        "status JOB": ("status", "4242", *SLURM),
        "cluster": ("cluster", *SLURM),
        "submit": submit,
        "submit --no-check": (submit[0], "--no-check", *submit[1:]),
        "cancel": ("cancel", "4242", *SLURM),
    }
    with ThreadPoolExecutor(len(commands)) as pool:
        futures = {
            key: pool.submit(run_hpctrain, *args, cwd=tmp_path, env=env, timeout=GUARD_S)
            for key, args in commands.items()
        }
        results = {key: future.result() for key, future in futures.items()}

    for key, proc in results.items():
        line = one_line(proc, "scontrol ping")
        assert f"got no answer from the Slurm controller within {DEADLINE_S} s" in line, (key, line)
    assert "the job may have been queued anyway" in results["submit --no-check"].stderr
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
