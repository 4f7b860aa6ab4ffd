"""The jobs of every configured scheduler, as one snapshot shared by all open pages.

A page asks for the jobs every few seconds; the schedulers are asked at most once per `interval_s` whatever the
number of pages (one refresh at a time, the others wait for it and read its result), and not at all while no page
asks. A scheduler that cannot answer (its controller down, the extra not installed) shows its one-line error in its
own section; the others still show (an exception that is not a UserError too: its traceback goes to the console's
stderr, for a bug report).
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from hpctrain.errors import UserError
from hpctrain.schedulers.base import Scheduler
from hpctrain.web.parts import line, view_parts


class Board:
    def __init__(
        self,
        schedulers: Mapping[str, Scheduler | UserError],
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.schedulers = schedulers
        self.interval_s = interval_s
        self.clock = clock
        self.refreshes = 0
        self._lock = threading.Lock()
        self._snapshot: dict[str, Any] | None = None
        self._taken = 0.0

    def snapshot(self) -> dict[str, Any]:
        """The jobs as of at most `interval_s` ago (blocking: call it from a worker thread)."""
        with self._lock:
            if self._snapshot is None or self.clock() - self._taken >= self.interval_s:
                self._snapshot = self._take()
                self._taken = self.clock()
                self.refreshes += 1
            return self._snapshot

    def _take(self) -> dict[str, Any]:
        sections = []
        for name, scheduler in self.schedulers.items():
            section: dict[str, Any] = {"name": name, "parts": [], "error": None}
            try:
                if isinstance(scheduler, UserError):
                    raise scheduler
                section["parts"] = view_parts(scheduler.status_view(None))
            except UserError as err:
                section["error"] = line(str(err))
            except Exception as err:  # a bug below: this section says so, the other schedulers still show
                traceback.print_exc(file=sys.stderr)
                section["error"] = line(f"hpctrain could not read {name}'s answer ({type(err).__name__}: {err}): a bug")
            sections.append(section)
        return {"taken": time.strftime("%H:%M:%S"), "interval_s": self.interval_s, "schedulers": sections}
