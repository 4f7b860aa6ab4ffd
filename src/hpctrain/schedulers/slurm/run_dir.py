"""Where an `hpctrain submit` job keeps its run: the `run_dir=` line of its own batch script, read back from Slurm."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from hpctrain.schedulers.slurm.commands import run_text

__all__ = ["parse_run_dir", "run_dir_of"]


def run_dir_of(job_id: str, work_dir: str | None) -> Path | None:
    """The run directory an `hpctrain submit` job exports, read from its batch script (`scontrol write
    batch_script`); None when the job was not submitted by hpctrain or the script is unreadable."""
    try:
        result = run_text(subprocess.run, ["scontrol", "write", "batch_script", job_id, "-"], check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_run_dir(result.stdout, job_id, work_dir) if result.returncode == 0 else None


def parse_run_dir(script: str, job_id: str, work_dir: str | None, home: str | None = None) -> Path | None:
    """The `run_dir=...` line hpctrain.schedulers.slurm.render renders (%j as "${SLURM_JOB_ID}", ~ as "$HOME")."""
    for line in script.splitlines():
        if line.startswith("run_dir="):
            text = line[len("run_dir=") :].replace("${SLURM_JOB_ID}", job_id).replace("$HOME", home or str(Path.home()))
            try:
                words = shlex.split(text)
            except ValueError:
                return None
            if len(words) == 1:
                path = Path(words[0])
                return path if path.is_absolute() or work_dir is None else Path(work_dir) / path
    return None
