"""A job submitted on a command's behalf (`check --preflight`'s probe) belongs to that command: when the command is
interrupted (Ctrl-C, SIGTERM, SIGHUP), the job is cancelled before it exits, instead of being left in the queue to
hold a node for its time limit.

The submission itself is shielded: those signals are held back while sbatch (or the API call) runs, so that the job
id is known before an interruption is acted on; then the signal that arrived meanwhile is delivered and cancels it.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread as Ctrl-C's KeyboardInterrupt is; `exit_code` 128 + N."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


class OwnedJob:
    def __init__(self, sched: Any) -> None:
        self.sched = sched
        self.job_id: str | None = None

    def submit(self, submit: Callable[[], str]) -> str:
        """Run `submit` (returning a job id) with the interrupting signals held back until its id is known."""
        old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        try:
            self.job_id = submit()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a signal held meanwhile is delivered here
        return self.job_id


def _raise(signum: int, frame: Any) -> None:
    raise Interrupted(signum)


@contextmanager
def owned_job(sched: Any, command: str) -> Iterator[OwnedJob]:
    """The block submits through `owned.submit(...)`; an interruption anywhere in it cancels that job."""
    owned = OwnedJob(sched)
    previous = {s: signal.signal(s, _raise) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield owned
    except KeyboardInterrupt as err:
        if owned.job_id is not None:
            why = err.args[0] if isinstance(err, Interrupted) else "SIGINT"
            try:
                sched.cancel(owned.job_id)
                said = f"cancelled job {owned.job_id}, which it had submitted"
            except Exception as cancel_error:  # said in one line; the user can cancel it by hand
                said = f"could not cancel job {owned.job_id} ({cancel_error}): `hpctrain cancel {owned.job_id}`"
            print(f"hpctrain {command}: interrupted ({why}): {said}", file=sys.stderr, flush=True)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
