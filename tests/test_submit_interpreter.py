"""The check runs the job's Python (as the job's PATH finds it) far enough to import what the job needs: a venv
that was not activated when submitting used to pass the checks and fail in the job with "No module named 'torch'".
A real interpreter without torch: a venv of the machine's system Python, made here (no package installed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.cli import main

SCRIPT = "import os\nimport torch\nfrom helpers import shape\nprint(torch.__version__, shape)\n"


@pytest.fixture
def bare_venv(tmp_path: Path) -> Path:
    """A venv of another Python that has no torch."""
    base = next(
        (
            p
            for p in ("/usr/bin/python3", shutil.which("python3") or "")
            if p and subprocess.run([p, "-c", "import torch"], capture_output=True).returncode != 0
        ),
        None,
    )
    if base is None:
        pytest.skip("no Python without torch on this machine to make a bare venv from")
    subprocess.run([base, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, capture_output=True)
    return tmp_path / "bare"


def test_a_python_without_torch_on_the_jobs_path_is_refused_naming_the_fix(
    bare_venv: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mnist.py").write_text(SCRIPT)
    (tmp_path / "helpers.py").write_text("shape = 1\n")  # beside the script: python finds it there
    monkeypatch.setenv("PATH", f"{bare_venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert main(["submit", "--dry-run", "--", "python3", "mnist.py"]) == 2
    err = capsys.readouterr().err
    assert (
        f"hpctrain submit: {bare_venv / 'bin' / 'python3'} (the Python the job will run) cannot import torch, "
        "which mnist.py imports, so the job would fail at once with \"No module named 'torch'\": activate the "
        "environment that has it before submitting (source VENV/bin/activate), name it (--venv DIR or "
        "--conda-env), or run that environment's python by its path; the Python running hpctrain has it: -- "
        f"{sys.executable} mnist.py ..."
    ) in err, err
    # The fix it names works: the Python that has torch, by its path.
    assert main(["submit", "--dry-run", "--", sys.executable, "mnist.py"]) == 0, capsys.readouterr().err
    # A script that needs nothing beyond the standard library is not held to torch.
    (tmp_path / "plain.py").write_text("import json\nprint(json.dumps(1))\n")
    assert main(["submit", "--dry-run", "--", "python3", "plain.py"]) == 0, capsys.readouterr().err


def test_a_module_the_script_imports_that_the_jobs_python_lacks_is_named(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    """Only torch blocks: a script may extend sys.path to find its other modules, which is read here only roughly."""
    (tmp_path / "train.py").write_text("import torch\nimport no_such_package_here\n")
    assert main(["submit", "--dry-run", "--", sys.executable, "train.py"]) == 0
    assert (
        f"hpctrain submit: warning: {sys.executable} (the Python the job will run) cannot import "
        "no_such_package_here, which train.py imports"
    ) in capsys.readouterr().err
