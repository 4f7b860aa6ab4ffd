"""Where a job's output file is, and following it while the job runs.

The controller knows the expanded path (scontrol StdOut=/StdErr=) while it remembers the job. After that the
run directory that `hpctrain submit` recorded (runs/NAME-JOB/job.yaml, with the job's output pattern) or
sbatch's default `slurm-JOB.out` in the submit directory are the places left to look.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from hpctrain.readback import open_regular
from hpctrain.schedulers.slurm.commands import poll_until
from hpctrain.schedulers.slurm.queries.job_states import JobInfo
from hpctrain.schedulers.slurm.queries.records import expand_pattern

__all__ = ["expand_pattern", "follow", "output_candidates"]


def _from_run_dirs(job_id: str, stream: str, base: Path) -> list[Path]:
    """Candidates from runs/*-JOB/job.yaml under base (written by `hpctrain submit`; read back as untrusted)."""
    from hpctrain.errors import UserError
    from hpctrain.jobs.file_reading import read_job_record

    found: list[Path] = []
    for record in sorted(base.glob(f"runs/*-{job_id}/job.yaml")):
        try:
            desc = read_job_record(record, within=base) or {}
        except (OSError, UserError):
            continue
        if not isinstance(desc, dict):
            continue
        pattern = desc.get("error") if stream == "stderr" else None
        pattern = pattern or desc.get("output") or "slurm-%j.out"
        path = Path(expand_pattern(str(pattern), job_id, name=desc.get("name")))
        found.append(path if path.is_absolute() else base / path)
    return found


def output_candidates(
    job_id: str, info: JobInfo | None, stream: str = "stdout", base: Path | None = None
) -> list[Path]:
    """Places the job's stdout or stderr may be, best first (existing or not)."""
    base = Path.cwd() if base is None else base
    out: list[Path] = []
    if info is not None:
        known = info.stderr if stream == "stderr" else info.stdout
        if known:
            out.append(Path(known))
        if info.work_dir:
            out.append(Path(info.work_dir) / f"slurm-{job_id}.out")
    out += _from_run_dirs(job_id, stream, base)
    out.append(base / f"slurm-{job_id}.out")
    unique: list[Path] = []
    for p in out:
        if p not in unique:
            unique.append(p)
    return unique


def follow(
    path: Path,
    write: Callable[[str], None],
    is_finished: Callable[[], bool],
    poll_s: float = 0.5,
    check_every_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Copy `path` to `write` as it grows, until is_finished() says the job ended; then copy what is left.
    The file may not exist yet (a pending job) and may be truncated (a requeue without --open-mode=append).
    commands.poll_until does the polling (and rides out a controller that stops answering for a while)."""
    position = 0
    handle: IO[str] | None = None
    last_check = -check_every_s

    def step() -> bool:
        nonlocal handle, position, last_check
        now = time.monotonic()
        done = False
        if now - last_check >= check_every_s:
            last_check = now
            done = is_finished()  # asked before reading: what the job wrote before it ended is read below
        if handle is None and path.exists():
            handle = os.fdopen(open_regular(path), encoding="utf-8", errors="replace")  # kept open while following
        if handle is not None:
            if os.stat(path).st_size < position:
                handle.seek(0)
            chunk = handle.read()
            position = handle.tell()
            if chunk:
                write(chunk)
        return done

    try:
        poll_until(step, bool, timeout_s=None, poll_s=poll_s, sleep=sleep)
    finally:
        if handle is not None:
            handle.close()
