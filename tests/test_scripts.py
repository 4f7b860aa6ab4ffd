"""scripts/quickstart.sh, scripts/test.sh and .ci/run: lint, and the Python environment they install into
(scripts/lib/venv.sh), which is never the system Python. The environments here are real venvs, made in tmp_path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "scripts" / "lib" / "venv.sh"
TORCH_LIB = ROOT / "scripts" / "lib" / "torch.sh"
SCRIPTS = [
    ROOT / "scripts" / "quickstart.sh",
    ROOT / "scripts" / "test.sh",
    LIB,
    ROOT / "scripts" / "lib" / "floor.sh",
    ROOT / ".ci" / "run",
    TORCH_LIB,
]


def test_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed: apt-get install shellcheck")
    result = subprocess.run(["shellcheck", "-x", *map(str, SCRIPTS)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_no_script_installs_into_the_system_python() -> None:
    for script in SCRIPTS:
        text = script.read_text()
        assert "BREAK_SYSTEM_PACKAGES" not in text and "python3 -m pip" not in text, script
    for script in SCRIPTS[:2]:
        assert "source scripts/lib/venv.sh" in script.read_text() and '"$PYTHON" -m pip install' in script.read_text()


def choose(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Source the library in a shell with `env` (and none of the caller's environments) and report its choice."""
    environ = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "HPCTRAIN_VENV")}
    environ.update(env)
    script = f'source {LIB}; use_python_env "$1"; echo "PYTHON=$PYTHON"; command -v python'
    return subprocess.run(
        ["bash", "-c", script, "venv-test", str(root)], env=environ, capture_output=True, text=True, timeout=300
    )


def chosen(result: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    return lines[-2].removeprefix("PYTHON="), lines[-1]


def test_dot_venv_in_the_checkout_is_created_then_reused(tmp_path: Path) -> None:
    first = chosen(choose(tmp_path))
    assert first == (str(tmp_path / ".venv" / "bin" / "python"),) * 2  # and first on PATH
    marker = tmp_path / ".venv" / "kept"
    marker.write_text("")
    again = choose(tmp_path)
    assert chosen(again) == first and "creating" not in again.stdout and marker.exists()


def test_an_active_environment_is_used_and_never_created(tmp_path: Path) -> None:
    active = tmp_path / "active"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(active)], check=True)
    for variable in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        assert chosen(choose(tmp_path / "checkout", **{variable: str(active)}))[0] == str(active / "bin" / "python")
    assert not (tmp_path / "checkout" / ".venv").exists()
    missing = choose(tmp_path / "checkout", VIRTUAL_ENV=str(tmp_path / "gone"))
    assert missing.returncode == 1 and "has no working bin/python" in missing.stderr
    assert not (tmp_path / "gone").exists()


def test_hpctrain_venv_wins_and_is_created_outside_the_checkout(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "venv"
    active = tmp_path / "active"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(active)], check=True)
    result = choose(tmp_path / "checkout", HPCTRAIN_VENV=str(cache), VIRTUAL_ENV=str(active))
    assert chosen(result)[0] == str(cache / "bin" / "python")
    assert not (tmp_path / "checkout" / ".venv").exists()


def torch_choice(python: str, path: Path, **env: str) -> tuple[str, list[str]]:
    """What quickstart's choose_torch says and the `pip install` arguments it builds, with PATH `path` first."""
    environ = {k: v for k, v in os.environ.items() if k != "HPCTRAIN_TORCH_INDEX_URL"}
    environ.update(env, PATH=f"{path}{os.pathsep}/usr/bin:/bin")
    script = f'source {TORCH_LIB}; choose_torch "$1"; for a in "${{TORCH_INSTALL[@]}}"; do echo "$a"; done'
    result = subprocess.run(
        ["bash", "-c", script, "torch-test", python], env=environ, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    said, *args = result.stdout.splitlines()
    return said, args


def test_quickstart_says_which_torch_build_and_takes_a_cpu_index_from_the_user(tmp_path: Path) -> None:
    # A fresh environment without torch, on a machine without a GPU (no nvidia-smi), then with one (a stand-in
    # nvidia-smi: there is no GPU here) and then with the user's index; an environment with torch keeps it.
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python, nogpu, gpu = str(bare / "bin" / "python"), tmp_path / "nogpu", tmp_path / "gpu"
    nogpu.mkdir()
    gpu.mkdir()
    smi = gpu / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: GPU-0)'\necho 'GPU 1: NVIDIA H100 (UUID: GPU-1)'\n")
    smi.chmod(0o755)
    said, args = torch_choice(python, nogpu)
    assert (
        said
        == (
            "quickstart: installing pip's default torch, the CUDA build (about 5.7 GB), though nvidia-smi "
            "shows no NVIDIA GPU here; for a CPU-only build, set HPCTRAIN_TORCH_INDEX_URL to a package index "
            "that serves one (README, Quick start)"
        )
        and args == []
    )
    said, args = torch_choice(python, gpu)
    assert (
        said
        == (
            "quickstart: installing pip's default torch, the CUDA build (about 5.7 GB): this machine has 2 "
            "NVIDIA GPU(s)"
        )
        and args == []
    )
    index = tmp_path / "my index"
    (index / "simple").mkdir(parents=True)
    url = (index / "simple").as_uri()
    said, args = torch_choice(python, nogpu, HPCTRAIN_TORCH_INDEX_URL=url)
    assert said == (
        "quickstart: installing torch and torchvision from "
        f"HPCTRAIN_TORCH_INDEX_URL={url} (the build that index serves)"
    )
    assert args == ["--index-url", url, "torch", "torchvision"]
    # pip, run with those arguments for the bare environment, asks that index and no other (it is empty: nothing
    # found, nothing installed)
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--dry-run", "--no-deps", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": ""},
    )
    assert pip.returncode != 0 and "No matching distribution found for torch" in pip.stderr, pip.stderr
    said, args = torch_choice(sys.executable, nogpu, HPCTRAIN_TORCH_INDEX_URL=url)
    import torch

    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU build"
    assert said == f"quickstart: keeping torch {torch.__version__} ({build}), which this environment already has"
    assert args == []
