"""A job's log followed live, for a page: Scheduler.logs(follow=True) read in a thread, sent as server-sent events.

The scheduler's follower is a blocking iterator of lines (a Slurm job's output file read as it grows, a pod's log
from the API server) that ends when the job ends; for a job that has ended it gives the whole log. A thread reads
it into a bounded tail, and the response sends what is new every SEND_EVERY_S: the last TAIL_LINES lines at once
(a note says how many earlier ones were left out), then each new line. Every line is made visible-safe
(hpctrain.web.safeview.line); the page adds it as text. When the page goes away the thread stops at the next line
the follower gives (or when the job ends); at most MAX_FOLLOWERS follow at a time.
"""

from __future__ import annotations

import asyncio
import collections
import json
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from hpctrain.errors import UserError
from hpctrain.schedulers.base import Scheduler
from hpctrain.web.safeview import line

TAIL_LINES = 2000
SEND_EVERY_S = 0.25
MAX_FOLLOWERS = 16
_followers = threading.BoundedSemaphore(MAX_FOLLOWERS)


class Follower:
    def __init__(
        self,
        scheduler: Scheduler,
        job_id: str,
        stream: str,
        replica: str | None = None,
        ended: Callable[[], bool] | None = None,
    ) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.total = 0
        self.notes: list[str] = []
        self.done = False
        self.stop = False
        self._lock = threading.Lock()
        self._ended = ended
        self._thread = threading.Thread(target=self._pump, args=(scheduler, job_id, stream, replica), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _say(self, text: str) -> None:
        with self._lock:
            self.notes.append(line(text))

    def _pump(self, scheduler: Scheduler, job_id: str, stream: str, replica: str | None) -> None:
        try:
            lines = scheduler.logs(
                job_id, follow=True, replica=replica, stream=stream, say=self._say, ended=self._ended
            )
            for text in lines:
                if self.stop:
                    return
                with self._lock:
                    self.lines.append(line(text))
                    self.total += 1
        except UserError as err:
            self._say(str(err))
        finally:
            self.done = True
            _followers.release()

    def take(self, sent: int) -> tuple[dict[str, Any] | None, int, bool]:
        """What is new since `sent` lines: an event's data (None: nothing new), the new count, and whether the
        follower has ended and all has been taken."""
        with self._lock:
            done = self.done
            new = self.total - sent
            lines = list(self.lines)[-new:] if new > 0 else []
            notes, self.notes = self.notes, []
            data: dict[str, Any] = {}
            if new > len(lines):
                data["skipped"] = new - len(lines)
            if lines:
                data["lines"] = lines
            if notes:
                data["notes"] = notes
            return (data or None), self.total, done


def start(
    scheduler: Scheduler,
    job_id: str,
    stream: str,
    replica: str | None = None,
    ended: Callable[[], bool] | None = None,
) -> Follower:
    """Follow the log in a thread; `ended` (Scheduler.logs): how it learns that the job ended, from the console's
    shared view of the job rather than a query of its own."""
    if not _followers.acquire(blocking=False):
        raise UserError(f"{MAX_FOLLOWERS} logs are being followed already: close a job's page and reload this one")
    follower = Follower(scheduler, job_id, stream, replica, ended)
    follower.start()
    return follower


async def events(follower: Follower) -> AsyncIterator[str]:
    """The follower's lines as server-sent events (`log`, then `end`); stops the follower when the page leaves."""
    sent = 0
    try:
        while True:
            data, sent, done = follower.take(sent)
            if data is not None:
                yield f"event: log\ndata: {json.dumps(data)}\n\n"
            if done and data is None:
                yield "event: end\ndata: {}\n\n"
                return
            await asyncio.sleep(SEND_EVERY_S)
    finally:
        follower.stop = True
