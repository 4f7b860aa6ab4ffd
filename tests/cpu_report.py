"""Where the suite's time goes: with HPCTRAIN_TEST_CPU_REPORT=FILE, every test appends one JSON line to FILE (each
pytest-xdist worker appends, O_APPEND): its id, wall seconds, and the CPU seconds of the worker itself and of the
child processes the test waited for (getrusage); the warm process (tests/warm_start.py) appends one line per command
it forked for a test, with that command's CPU. Jobs the local Slurm cluster or the Kubernetes node ran are not
children of the worker and are not counted. `python tests/cpu_report.py FILE [TOP]` sums it by file and lists the
TOP tests (scripts/test.sh prints it).

The suite is CPU-bound on a 2-core CI machine, so the CPU column, not the wall one, says what a cut would save.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time

import pytest

REPORT = os.environ.get("HPCTRAIN_TEST_CPU_REPORT")


def _cpu() -> tuple[float, float]:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # pytest's hook signature
    if not REPORT:
        yield
        return
    wall, (me, children) = time.monotonic(), _cpu()
    yield
    me_after, children_after = _cpu()
    line = json.dumps(
        {
            "test": item.nodeid,
            "wall": round(time.monotonic() - wall, 2),
            "cpu": round(me_after - me, 2),
            "children_cpu": round(children_after - children, 2),
            "end": round(time.time(), 1),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        }
    )
    fd = os.open(REPORT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def summary(path: str, top: int = 40) -> str:
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    tests = [row for row in rows if "wall" in row]
    cpu: collections.Counter[str] = collections.Counter()  # by test: worker, waited-for children, warm forks
    warm: collections.Counter[str] = collections.Counter()
    for row in rows:
        cpu[row["test"]] += row.get("cpu", 0) + row.get("children_cpu", 0) + row.get("warm_cpu", 0)
        warm[row["test"]] += row.get("warm_cpu", 0)
    by_file: collections.Counter[str] = collections.Counter()
    for test, seconds in cpu.items():
        by_file[test.split("::")[0]] += seconds
    out = [
        f"{len(tests)} tests, {sum(cpu.values()):.0f} CPU s (worker, waited-for children, warm forks: "
        f"{sum(warm.values()):.0f} of it), {sum(r['wall'] for r in tests):.0f} wall s summed over workers",
        "",
        "CPU s  file",
    ]
    out += [f"{seconds:6.0f}  {name}" for name, seconds in by_file.most_common(top)]
    walls = {row["test"]: row["wall"] for row in tests}
    out += ["", "CPU s  warm s  wall s  test"]
    heavy = cpu.most_common(top)
    out += [f"{seconds:6.0f}  {warm[test]:6.0f}  {walls.get(test, 0):6.0f}  {test}" for test, seconds in heavy]
    return "\n".join(out)


if __name__ == "__main__":
    print(summary(sys.argv[1], *(int(n) for n in sys.argv[2:3])))
