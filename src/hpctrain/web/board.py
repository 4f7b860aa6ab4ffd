"""What the pages show, asked of the schedulers once per interval for all open pages: a shared cache.

Every page (and every tab) asks the console for the jobs, a job's view or the cluster; the console asks the
schedulers at most once per interval for each of those, whatever the number of pages (one refresh of a thing at
a time: the others wait for it and read its result), and not at all while no page asks. What no page has asked for
in a while is dropped. The whole cluster's jobs and nodes, which cost more on a big cluster, are asked less
often: their interval is `interval_s` or COST_SHARE times the time their last answer took, whichever is longer
(10,000 jobs of one's own: about 80 s on a quiet login node), so that each costs at most a quarter of 1% of a core
however big the cluster; a job's own view keeps the interval.

The jobs are every scheduler's jobs (Scheduler.list_jobs: the neutral JobSummary) in one table, with a column for
the scheduler; a scheduler that cannot answer (its controller down, the extra not installed) is its one-line error
beside the table, and the others still show (an exception that is not a UserError too: its traceback goes to the
console's stderr, for a bug report). The table is kept as JSON text with a version (a hash of that text): a page
that has it already is answered 304 with nothing built or sent.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import sys
import threading
import time
import traceback
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from hpctrain.errors import UserError
from hpctrain.schedulers.base import JobSummary, Scheduler
from hpctrain.web.safeview import line

FORGET_AFTER_INTERVALS = 60
COST_SHARE = 400  # a thing is asked again after at least 400 times what its last answer took: 0.25% of a core
JOB_COLUMNS = ("scheduler", "job", "name", "state", "nodes × processes", "GPUs", "age", "restarts")
AGE_COLUMN = JOB_COLUMNS.index("age")


class Versioned:
    """JSON text and its version (an ETag: the same text, the same version)."""

    __slots__ = ("body", "etag")

    def __init__(self, data: Any) -> None:
        self.body = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
        self.etag = '"' + hashlib.blake2b(self.body, digest_size=12).hexdigest() + '"'


class _Entry:
    __slots__ = ("every", "lock", "taken", "value")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.taken = 0.0
        self.every = 0.0
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

    def get(self, key: Hashable, make: Callable[[], Any], costly: bool = False) -> Any:
        """make()'s value for `key` as of at most `interval_s` ago (blocking: call it from a worker thread); a
        `costly` one (a whole cluster's jobs or nodes) at most COST_SHARE times what its last answer took. What
        make() raises is not kept: the next page asks again."""
        now = self.clock()
        with self._lock:
            stale = now - FORGET_AFTER_INTERVALS * self.interval_s
            for old in [k for k, e in self._entries.items() if e.value is not None and e.taken < stale]:
                del self._entries[old]
            entry = self._entries.setdefault(key, _Entry())
        with entry.lock:
            if entry.value is None or self.clock() - entry.taken >= max(self.interval_s, entry.every):
                started = self.clock()
                entry.value = make()
                entry.taken = self.clock()
                entry.every = COST_SHARE * (entry.taken - started) if costly else 0.0
                self.refreshes += 1
            return entry.value

    def forget(self, key: Hashable) -> None:
        """Drop `key`'s value: the next page asks again (after a change made through the console)."""
        with self._lock:
            self._entries.pop(key, None)

    def snapshot(self) -> Versioned:
        """Every scheduler's jobs: {"columns", "rows", "schedulers": [{"name", "error"}]}, as versioned JSON."""
        return self.get(("jobs",), lambda: Versioned(self._jobs()), costly=True)

    def _jobs(self) -> dict[str, Any]:
        rows: list[list[Any]] = []
        sections = []
        for name, scheduler in self.schedulers.items():
            error = None
            try:
                if isinstance(scheduler, UserError):
                    raise scheduler
                rows += [job_row(name, job) for job in scheduler.list_jobs(all_users=self.all_users)]
            except UserError as err:
                error = line(str(err))
            except Exception as err:  # a bug below: this section says so, the other schedulers still show
                traceback.print_exc(file=sys.stderr)
                error = line(f"hpctrain could not read {name}'s answer ({type(err).__name__}: {err}): a bug")
            sections.append({"name": name, "error": error})
        return {"columns": list(JOB_COLUMNS), "age_column": AGE_COLUMN, "rows": rows, "schedulers": sections}


def job_row(scheduler: str, job: JobSummary) -> list[Any]:
    """A job as the table's cells (visible-safe text), its age as when it was submitted (seconds since the epoch, or
    None): the page counts the age, so that a table in which nothing changed is the same text."""
    shape = str(job.replicas) if job.processes_per_node is None else f"{job.replicas} × {job.processes_per_node}"
    return [
        scheduler,
        line(job.job_id),
        line(job.name or ""),
        line(job.label or job.state),
        shape,
        "" if job.gpus is None else str(job.gpus),
        submitted_at(job.created),
        "" if job.restarts is None else str(job.restarts),
    ]


def submitted_at(created: str | None) -> float | None:
    """ISO 8601 (`2026-11-29T10:07:54Z`; without a zone: this machine's local time, as Slurm prints it) -> seconds
    since the epoch; None where it is missing or not a time."""
    if not created:
        return None
    try:
        return datetime.datetime.fromisoformat(created).timestamp()
    except (ValueError, OverflowError, OSError):
        return None
