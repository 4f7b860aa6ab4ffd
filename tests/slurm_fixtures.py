"""The `slurm_cluster` fixture: the local two-node Slurm cluster of scripts/local-slurm.sh, started once per session.

Register in conftest.py with `pytest_plugins = ["slurm_fixtures"]`. The fixture runs `scripts/local-slurm.sh up`
(idempotent: a running cluster is left as it is, so other test sessions sharing it are not disturbed) and fails
with the script's output when the cluster cannot come up. It never stops the cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "local-slurm.sh"


@dataclass(frozen=True)
class LocalSlurm:
    """The running local cluster: nodes node1 and node2 (each gpu:2, shard:128), partitions debug (default,
    no time limit) and short (30 min)."""

    script: Path
    nodes: tuple[str, ...] = ("node1", "node2")

    def sbatch(self, *args: str, cwd: Path) -> str:
        """Submit with `sbatch --parsable ARGS` in cwd and return the job id."""
        result = subprocess.run(["sbatch", "--parsable", *args], cwd=cwd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            pytest.fail(f"sbatch {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout.strip().split(";")[0]

    def state(self, job_id: str) -> str:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False).stdout
        for field in out.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "GONE"

    def wait_state(self, job_id: str, states: set[str], timeout_s: float = 240.0) -> str:
        """Wait until the job is in one of `states` (other tests may hold the CPUs for a while); fail after timeout."""
        deadline = time.monotonic() + timeout_s
        state = self.state(job_id)
        while state not in states:
            if time.monotonic() > deadline:
                pytest.fail(f"job {job_id} still {state} after {timeout_s:.0f} s (wanted {sorted(states)}); see `squeue`")
            time.sleep(0.5)
            state = self.state(job_id)
        return state

    def cancel_quietly(self, job_id: str) -> None:
        subprocess.run(["scancel", job_id], capture_output=True, check=False)


@pytest.fixture(scope="session")
def slurm_cluster() -> LocalSlurm:
    """Start (or reuse) the local Slurm cluster; fail with the reason when that is impossible."""
    if not SCRIPT.is_file():
        pytest.fail(f"{SCRIPT} is missing")
    status = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True, check=False)
    if status.returncode != 0:
        if os.geteuid() != 0:
            pytest.fail("the local Slurm cluster is not running and starting it needs root: run `sudo scripts/local-slurm.sh up`")
        up = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, check=False, timeout=900)
        if up.returncode != 0:
            pytest.fail(f"`scripts/local-slurm.sh up` failed (exit {up.returncode}):\n{up.stdout}\n{up.stderr}")
    for tool in ("sbatch", "squeue", "scontrol", "scancel", "sinfo"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not on PATH although the cluster is up: install slurm-client")
    return LocalSlurm(script=SCRIPT)
