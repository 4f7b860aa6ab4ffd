"""scripts/local-slurm.sh: lint, status, an idempotent `up` that leaves a running cluster alone, usage errors.
`down` is not run here: other tests of the same session share the cluster."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from slurm_fixtures import slurm_cluster  # noqa: F401  (the shared session fixture)

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "local-slurm.sh"


def script(*args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
    prefix = ["runuser", "-u", user, "--"] if user else []
    return subprocess.run([*prefix, "bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed: apt-get install shellcheck")
    result = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_usage_error() -> None:
    result = script("sideways")
    assert result.returncode == 2
    assert "usage:" in result.stderr and "up|down|status" in result.stderr


def _pids(name: str) -> set[str]:
    return set(subprocess.run(["pgrep", "-x", name], capture_output=True, text=True).stdout.split())


@pytest.mark.slurm
def test_status_and_idempotent_up(slurm_cluster) -> None:
    # Exit 0 once both nodes are usable: a test running meanwhile may hold one down for a while (test_elastic_slurm).
    for _ in range(120):
        status = script("status")
        if status.returncode == 0:
            break
        time.sleep(1)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "debug*" in status.stdout and "short" in status.stdout

    before = (_pids("slurmctld"), _pids("slurmd"), _pids("munged"))
    up = script("up")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "already up" in up.stdout
    assert (_pids("slurmctld"), _pids("slurmd"), _pids("munged")) == before  # nothing was restarted

    # The daemons must not hold the script's lock (a second `up` once waited for it until it gave up).
    lock = next(line.split("=", 1)[1] for line in SCRIPT.read_text().splitlines() if line.startswith("LOCK_FILE="))
    for pid in set().union(*before):
        fds = Path(f"/proc/{pid}/fd")
        targets = {str(p.readlink()) for p in fds.iterdir()} if fds.exists() else set()
        assert lock not in targets, pid


@pytest.mark.slurm
def test_up_leaves_a_node_a_test_took_out_as_it_is(slurm_cluster) -> None:
    """`up` resumes nodes left down or drained, but not one a test took out on purpose (reason "hpctrain test..."),
    and over running daemons it never starts afresh. Drained, not DOWN: a drained node keeps its running jobs, so the
    tests running meanwhile lose nothing; it takes no new ones for the few seconds this test takes."""
    before = (_pids("slurmctld"), _pids("slurmd"), _pids("munged"))
    # node1: test_elastic_slurm takes node2 out (and resumes it) itself
    drain = ["scontrol", "update", "nodename=node1", "state=drain", "reason=hpctrain test_local_slurm: held out"]
    try:
        subprocess.run(drain, check=True, capture_output=True, text=True)
        up = subprocess.run(
            ["bash", str(SCRIPT), "up"],
            env={**os.environ, "HPCTRAIN_SLURM_WAIT": "3"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        state = subprocess.run(["sinfo", "-h", "-n", "node1", "-o", "%T"], capture_output=True, text=True).stdout
    finally:
        subprocess.run(["scontrol", "update", "nodename=node1", "state=resume"], capture_output=True, text=True)
    assert up.returncode == 1 and "nodes not ready after 3 s" in up.stderr, up.stdout + up.stderr
    assert "resuming node1" not in up.stdout and state.strip().startswith("drain"), (up.stdout, state)
    assert (_pids("slurmctld"), _pids("slurmd"), _pids("munged")) == before  # nothing was restarted


@pytest.mark.slurm
def test_up_and_down_need_root(slurm_cluster) -> None:
    if shutil.which("runuser") is None:
        pytest.fail("runuser (util-linux) is missing")
    for cmd in ("up", "down"):
        result = script(cmd, user="nobody")
        assert result.returncode == 1
        assert f"'{cmd}' must run as root" in result.stderr
