"""Where an `hpctrain submit` job keeps its run: the `run_dir=` line of its own batch script, read back from Slurm;
and which job holds a run directory that is the same for every job (no %j): a second job queued into it while the
first is active would find it in use and fail, so `submit` refuses it before queueing (`holding`)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from hpctrain.errors import UserError
from hpctrain.fsutil import DirectoryInUse, DirectoryLock, LocksUnsupported, write_atomic
from hpctrain.jobs.spec import JobSpec
from hpctrain.readback import read_text
from hpctrain.schedulers.slurm.commands import slurm

__all__ = ["HOLDER_FILE", "fixed_run_dir", "holder_problem", "holding", "parse_run_dir", "run_dir_of"]


def run_dir_of(job_id: str, work_dir: str | None) -> Path | None:
    """The run directory an `hpctrain submit` job exports, read from its batch script (`scontrol write
    batch_script`); None when the job was not submitted by hpctrain or the script is unreadable. Raises
    SlurmUnavailable when Slurm does not answer."""
    result = slurm(["scontrol", "write", "batch_script", job_id, "-"], check=False)
    return parse_run_dir(result.stdout, job_id, work_dir) if result.returncode == 0 else None


def parse_run_dir(script: str, job_id: str, work_dir: str | None, home: str | None = None) -> Path | None:
    """The `run_dir=...` line hpctrain.schedulers.slurm.batch.script renders (%j as "${SLURM_JOB_ID}", ~ as "$HOME")."""
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


HOLDER_FILE = ".hpctrain-job"
"""In a run directory without %j: the id of the last job queued into it (written once sbatch said it)."""
SUBMIT_LOCK = ".hpctrain-submit.lock"


def fixed_run_dir(job: JobSpec) -> Path | None:
    """The job's run directory when it is the same for every job (no %j), else None."""
    if job.run_dir is None or "%j" in job.run_dir:
        return None
    return Path(os.path.expanduser(job.run_dir))


def holder_problem(directory: Path, active_state: Callable[[str], str | None]) -> str | None:
    """Why no job may be queued into `directory` now: the job named in its HOLDER_FILE is still active
    (`active_state` its Slurm state, None once it ended or Slurm no longer knows it). A holder file that is
    missing, unreadable or names no job id holds nothing."""
    try:
        text = read_text(directory / HOLDER_FILE, 64, within=directory).strip()
    except (OSError, UserError):
        return None
    if not text.isdigit():
        return None
    state = active_state(text)
    if state is None:
        return None
    return (
        f"--run-dir {directory} is held by job {text} ({state}), which writes there; a second job would find the "
        f"directory in use and fail: wait for job {text} to end, cancel it (`hpctrain cancel {text}`), or choose "
        "another --run-dir"
    )


@contextmanager
def holding(job: JobSpec, active_state: Callable[[str], str | None]) -> Iterator[Callable[[str], None]]:
    """Queue a job into its fixed run directory only when no active job holds it: refused (UserError) before
    anything is queued; the block calls the function it gets with the new job's id, which then holds the directory.
    A lock keeps two submissions into one directory apart between the check and the record."""
    directory = fixed_run_dir(job)
    if directory is None:
        yield lambda job_id: None
        return
    lock: DirectoryLock | None = None
    try:
        lock = DirectoryLock.acquire(directory, SUBMIT_LOCK, f"hpctrain submit, pid {os.getpid()}")
    except LocksUnsupported:
        pass  # the holder check still runs; only two submissions at the same instant are not kept apart
    except DirectoryInUse:
        raise UserError(
            f"--run-dir {directory}: another `hpctrain submit` into it is under way; wait for it, then check "
            f"`hpctrain status`"
        ) from None
    try:
        problem = holder_problem(directory, active_state)
        if problem is not None:
            raise UserError(problem)
        yield lambda job_id: write_atomic(directory / HOLDER_FILE, f"{job_id}\n".encode())
    finally:
        if lock is not None:
            lock.release()
