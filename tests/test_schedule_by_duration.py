"""The test suite's own scheduler hint (tests/schedule_by_duration.py): longest first, spread over the workers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from schedule_by_duration import ordered, share_sizes


def test_worksteal_shares_and_the_longest_tests_dealt_over_them() -> None:
    assert share_sizes(10, 4) == [2, 2, 3, 3] and share_sizes(3, 4) == [0, 1, 1, 1]
    items = [SimpleNamespace(nodeid=f"t{i}") for i in range(10)]
    seconds = {"t9": 100.0, "t8": 90.0, "t7": 80.0, "t6": 70.0, "t0": 5.0}
    shares = ordered(items, seconds, 4)
    ids = [it.nodeid for it in shares]
    assert sorted(ids) == sorted(it.nodeid for it in items)  # nothing lost or doubled
    chunks = [ids[0:2], ids[2:4], ids[4:7], ids[7:10]]  # what worksteal sends each worker at the start
    assert [c[0] for c in chunks] == ["t9", "t8", "t7", "t6"]  # each worker starts with one of the longest
    for chunk in chunks:  # within a share, untimed tests keep their collection order
        untimed = [int(t[1:]) for t in chunk if t not in seconds]
        assert untimed == sorted(untimed), chunks
    totals = [sum(seconds.get(t, 0.5) for t in c) for c in chunks]
    assert max(totals) < 102, totals  # no share holds two of the long ones


def test_a_run_records_call_times_and_the_next_run_reads_them(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text("import time\n\ndef test_a():\n    pass\n\ndef test_b():\n    time.sleep(0.3)\n")
    (tmp_path / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                                          "pytest_plugins = ['schedule_by_duration']\n")
    record = tmp_path / "cache" / "durations.json"
    env = {"HPCTRAIN_TEST_DURATIONS": str(record), "PATH": "/usr/bin:/bin"}

    def run() -> str:
        out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--collect-only",
                              "test_x.py"] if record.exists() else [sys.executable, "-m", "pytest", "-p",
                             "no:cacheprovider", "-q", "test_x.py"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    run()
    times = json.loads(record.read_text())
    assert set(times) == {"test_x.py::test_a", "test_x.py::test_b"} and times["test_x.py::test_b"] >= 0.3
    collected = [line for line in run().splitlines() if "::" in line]
    assert collected == ["test_x.py::test_b", "test_x.py::test_a"]  # the longer one first
