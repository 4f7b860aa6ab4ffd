"""Python stacks of every thread of a rank, written to a file: on a hang (RUN/hang/rank-N.txt) and on request
(`hpctrain debug stacks JOB` leaves RUN/stacks/request; every rank's watchdog thread answers in RUN/stacks/rank-N.txt).

The request is a file in the run directory rather than a signal, because the run directory is the one thing every
rank of every launcher shares (torchrun's agent would die of a SIGUSR2 meant for its workers, and a Kubernetes pod
cannot be signalled from outside without exec rights). faulthandler writes the stacks without running Python code
in the stuck threads, so a thread blocked in a collective or in I/O shows where it is blocked.
"""

from __future__ import annotations

import faulthandler
import os
import time
from pathlib import Path

HANG_DIR = "hang"
STACKS_DIR = "stacks"
REQUEST_FILE = "request"


def dump_stacks(path: Path, header: str) -> None:
    """Write `header` and the Python stacks of all this process's threads to `path` (replaced whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as handle:
        handle.write(header.rstrip("\n") + "\n\n")
        handle.flush()
        faulthandler.dump_traceback(file=handle, all_threads=True)
    os.replace(tmp, path)


def request_stacks(run_dir: Path) -> float:
    """Ask every rank of the run for its stacks; returns the request's time (compare with `answers`)."""
    folder = run_dir / STACKS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    request = folder / REQUEST_FILE
    asked = time.time()
    request.write_text(f"{asked}\n")
    os.utime(request, (asked, asked))
    return asked


def answers(run_dir: Path, since: float) -> list[Path]:
    """The ranks' stack files written at or after `since`."""
    folder = run_dir / STACKS_DIR
    try:
        return sorted(p for p in folder.glob("rank-*.txt") if p.stat().st_mtime >= since - 1.0)
    except OSError:
        return []


class StackRequests:
    """A rank's side of `request_stacks`: `check()` (from the watchdog's thread) answers a new request once."""

    def __init__(self, run_dir: Path, rank: int, host: str) -> None:
        self.request = run_dir / STACKS_DIR / REQUEST_FILE
        self.answer = run_dir / STACKS_DIR / f"rank-{rank}.txt"
        self.who = f"rank {rank} on {host} (pid {os.getpid()})"
        self._answered = time.time()  # requests from before this process started are not for it

    def check(self) -> None:
        try:
            asked = self.request.stat().st_mtime
        except OSError:
            return
        if asked > self._answered:
            self._answered = asked
            dump_stacks(self.answer, f"{self.who}, on request at {time.strftime('%Y-%m-%d %H:%M:%S')}")
