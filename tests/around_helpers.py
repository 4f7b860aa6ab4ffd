"""Helpers for the tests of `hpctrain dev|tensorboard|image|top`: run the CLI as a user would, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from training_helpers import run_hpctrain

ROOT = Path(__file__).resolve().parents[1]


def cli_env(home: Path, path_prefix: Path | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["HPCTRAIN_HOME"] = str(home)
    env.pop("SLURM_JOB_ID", None)
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    env.update(extra)
    return env


def hpctrain(
    *args: str, env: dict[str, str], cwd: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return run_hpctrain(*args, env=env, cwd=cwd, timeout=timeout)


def venv_args() -> list[str]:
    """--venv for the virtual environment running the tests (it has jupyterlab and tensorboard), if any."""
    return ["--venv", sys.prefix] if sys.prefix != sys.base_prefix else []


def all_cmdlines() -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                out.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return out
