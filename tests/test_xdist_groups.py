"""scripts/test.sh relies on pytest-xdist's `--dist loadgroup` to run the real node's tests (conftest.py marks them)
on one worker. With pytest 9.2 and pytest-xdist 3.8 that grouping silently stopped: the group's tests spread over
every worker and waited on each other's lock. This runs a small suite of its own the same way and checks that a
group's tests share a worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SUITE = """
import os
import pytest

@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    with open(os.environ["SEEN"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")

@pytest.mark.parametrize("i", range(8))
def test_free(i):
    pass
"""


def test_loadgroup_sends_a_groups_tests_to_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_suite.py").write_text(SUITE)
    seen = tmp_path / "seen"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-n",
            "3",
            "--dist",
            "loadgroup",
            "-q",
            "-c",
            "/dev/null",
            "--rootdir",
            str(tmp_path),
            str(tmp_path / "test_suite.py"),
        ],
        env={**os.environ, "SEEN": str(seen)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    workers = seen.read_text().split()
    assert len(workers) == 4 and len(set(workers)) == 1, workers
