"""Longest tests first, spread over the pytest-xdist workers: a plugin of the test suite (tests/conftest.py).

The suite is CPU-bound on CI's 2 cores, and its time is set by the tail: a 2-minute Slurm test collected near the
end starts when the other workers are nearly done. Where HPCTRAIN_TEST_DURATIONS names a file (scripts/test.sh keeps
one outside the checkout), each test's call time from the last run is recorded there, and the next run orders the
tests by it: `--dist worksteal` gives each worker one contiguous share of the list at the start and later steals
from the end of a busy worker's share, so the longest tests are dealt over the shares (each to the share with the
least time so far) and each share runs longest first. Tests without a record count as short and keep their
collection order within a share.
Without the file nothing changes. Every worker computes the same order from the same file (xdist requires it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

UNKNOWN_S = 0.5  # a test never timed: most tests are short
ENV = "HPCTRAIN_TEST_DURATIONS"
_timed: dict[str, float] = {}
_taken: list[Path | None] = []  # the file, once the collecting process has taken the variable out of its environment


def _path() -> Path | None:
    if _taken:
        return _taken[0]
    value = os.environ.get(ENV)
    return Path(value) if value else None


def _recorded() -> dict[str, float]:
    path = _path()
    try:
        data = json.loads(path.read_text()) if path else {}
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float))} if isinstance(data, dict) else {}


def share_sizes(count: int, workers: int) -> list[int]:
    """How many tests worksteal sends each worker at the start (the remaining count over the workers left)."""
    sizes, left = [], count
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    return sizes


def ordered(items: list[Any], seconds: dict[str, float], workers: int) -> list[Any]:
    """`items` (with .nodeid) dealt over `workers` shares of worksteal's sizes, longest first, each share longest
    first; the relative order of equally long (untimed) tests is kept."""
    by_time = sorted(items, key=lambda it: -seconds.get(it.nodeid, UNKNOWN_S))  # stable
    sizes = share_sizes(len(items), workers)
    shares: list[list[Any]] = [[] for _ in sizes]
    totals = [0.0] * len(sizes)
    for item in by_time:
        open_shares = [i for i in range(len(sizes)) if len(shares[i]) < sizes[i]]
        i = min(open_shares, key=lambda k: (totals[k], k))
        shares[i].append(item)
        totals[i] += seconds.get(item.nodeid, UNKNOWN_S)
    return [item for share in shares for item in share]


def pytest_collection_modifyitems(config: pytest.Config, items: list[Any]) -> None:
    seconds = _recorded()
    # The tests run in this process (an xdist worker, or a plain run): a pytest that a test starts must not write
    # into the suite's record.
    _taken[:] = [_path()]
    os.environ.pop(ENV, None)
    if seconds and items:
        workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
        items[:] = ordered(items, seconds, workers)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and "PYTEST_XDIST_WORKER" not in os.environ:  # the controller (or a plain run)
        _timed[report.nodeid] = round(report.duration, 2)


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = _path()
    if path is None or not _timed or "PYTEST_XDIST_WORKER" in os.environ:
        return
    merged = {**_recorded(), **_timed}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(merged, indent=0, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass  # only a schedule hint: the run's result does not depend on it
