"""What the pages show, asked of the schedulers once per interval for all open pages: a shared cache.

Every page (and every tab) asks the console for the jobs, a job's view or the cluster; the console asks the
schedulers at most once per `interval_s` for each of those, whatever the number of pages (one refresh of a thing at
a time: the others wait for it and read its result), and not at all while no page asks. What no page has asked for
in a while is dropped.

The jobs are every scheduler's table in one snapshot: a scheduler that cannot answer (its controller down, the
extra not installed) shows its one-line error in its own section, and the others still show (an exception that is
not a UserError too: its traceback goes to the console's stderr, for a bug report).
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from hpctrain.errors import UserError
from hpctrain.schedulers.base import Scheduler
from hpctrain.web.safeview import line, view_parts

FORGET_AFTER_INTERVALS = 60


class _Entry:
    __slots__ = ("lock", "taken", "value")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.taken = 0.0
        self.value: Any = None


class Board:
    def __init__(
        self,
        schedulers: Mapping[str, Scheduler | UserError],
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
        all_users: bool = False,
    ) -> None:
        self.schedulers = schedulers
        self.all_users = all_users
        self.interval_s = interval_s
        self.clock = clock
        self.refreshes = 0
        self._lock = threading.Lock()
        self._entries: dict[Hashable, _Entry] = {}

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """make()'s value for `key` as of at most `interval_s` ago (blocking: call it from a worker thread). What
        make() raises is not kept: the next page asks again."""
        now = self.clock()
        with self._lock:
            stale = now - FORGET_AFTER_INTERVALS * self.interval_s
            for old in [k for k, e in self._entries.items() if e.value is not None and e.taken < stale]:
                del self._entries[old]
            entry = self._entries.setdefault(key, _Entry())
        with entry.lock:
            if entry.value is None or self.clock() - entry.taken >= self.interval_s:
                entry.value = make()
                entry.taken = self.clock()
                self.refreshes += 1
            return entry.value

    def forget(self, key: Hashable) -> None:
        """Drop `key`'s value: the next page asks again (after a change made through the console)."""
        with self._lock:
            self._entries.pop(key, None)

    def snapshot(self) -> dict[str, Any]:
        """Every scheduler's jobs."""
        return self.get(("jobs",), self._jobs)

    def _jobs(self) -> dict[str, Any]:
        sections = []
        for name, scheduler in self.schedulers.items():
            section: dict[str, Any] = {"name": name, "parts": [], "error": None}
            try:
                if isinstance(scheduler, UserError):
                    raise scheduler
                section["parts"] = view_parts(scheduler.status_view(None, all_users=self.all_users))
            except UserError as err:
                section["error"] = line(str(err))
            except Exception as err:  # a bug below: this section says so, the other schedulers still show
                traceback.print_exc(file=sys.stderr)
                section["error"] = line(f"hpctrain could not read {name}'s answer ({type(err).__name__}: {err}): a bug")
            sections.append(section)
        return {"taken": time.strftime("%H:%M:%S"), "interval_s": self.interval_s, "schedulers": sections}
