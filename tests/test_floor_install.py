"""A plain `pip install -e .` (the README's way, no constraints file) into an environment that already has the
floor torch (2.2, built against NumPy 1.x) and a NumPy 1.x, as NVIDIA's NGC 24.01 image ships them, must keep that
NumPy: opencv-python-headless from 4.12 on requires NumPy 2, and pip upgraded NumPy to reach it, after which every
torch 2.2 process failed. CI's floor environment (scripts/lib/floor.sh) installs hpctrain that way too, but pip
chooses an opencv there only when the cached environment is new; so this test asks pip itself, without any
constraints file, on every run.

pip resolves against what an environment has installed, which it reads from the packages' metadata. The test gives
a fresh virtual environment the metadata of everything the floor environment holds except opencv and hpctrain (an
environment that has torch and NumPy but never had hpctrain), and lets the floor environment's pip resolve the
install for it (--dry-run: nothing is installed; pip fetches what it needs to know from the package index it is
configured with, as the user's pip does)."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from hpctrain.compat import version_tuple

pytestmark = pytest.mark.floor
ROOT = Path(__file__).resolve().parents[1]
LEFT_OUT = {"opencv-python-headless", "hpctrain"}


def test_a_plain_install_beside_torch_2_2_and_numpy_1_keeps_them(tmp_path: Path) -> None:
    torch, numpy = importlib.metadata.version("torch"), importlib.metadata.version("numpy")
    if version_tuple(torch) >= (2, 3) or version_tuple(numpy) >= (2, 0):
        pytest.skip(f"needs the floor environment (torch < 2.3 with NumPy 1.x); this has torch {torch}, NumPy {numpy}")
    target = tmp_path / "env"
    venv.create(target, with_pip=False)
    site = next(target.glob("lib/python*/site-packages"))
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name is None or name.lower() in LEFT_OUT:
            continue
        info = site / f"{name.replace('-', '_')}-{dist.version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(
            dist.read_text("METADATA") or f"Metadata-Version: 2.1\nName: {name}\nVersion: {dist.version}\n"
        )
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(target / "bin" / "python"),
            "install",
            "--dry-run",
            "--quiet",
            "--report",
            str(report),
            "-e",
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    chosen = {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert "opencv-python-headless" in chosen, chosen
    assert "numpy" not in chosen and "torch" not in chosen and "torchvision" not in chosen, (
        f"a plain install would replace NumPy {numpy} / torch {torch}: {chosen}"
    )
    shutil.rmtree(target)
