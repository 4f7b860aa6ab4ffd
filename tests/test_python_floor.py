"""requires-python >= 3.10: nothing in the sources may need a newer Python. vermin reads every file and names each
syntax or standard-library use newer than the target (it found `import tomllib`, Python 3.11, in
hpctrain/jobs/file_reading.py). The floor environment (scripts/lib/floor.sh) also runs the floor-marked tests on a real
Python 3.10 where the machine has one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_sources_need_nothing_newer_than_python_3_10() -> None:
    pytest.importorskip("vermin", reason="vermin comes with the dev extra: pip install -e '.[dev]'")
    dirs = [str(ROOT / d) for d in ("src", "tests", "examples", "benchmarks")]
    vermin = Path(sys.executable).with_name("vermin")  # the console script: the package has no __main__
    proc = subprocess.run(
        [str(vermin), "--target=3.10-", "--violations", "--no-tips", "--eval-annotations", *dirs],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
