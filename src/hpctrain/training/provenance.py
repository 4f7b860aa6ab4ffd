"""What produced a run: versions, hosts, git revision, command line. Appended once per attempt to provenance.json."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hpctrain.fsutil import read_text, write_atomic

PROVENANCE_FILE = "provenance.json"


def versions() -> dict[str, str | None]:
    import torch

    info: dict[str, str | None] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else None,
        "nccl": None,
    }
    try:  # the installed version, without paying seconds for importing torchvision
        info["torchvision"] = importlib.metadata.version("torchvision")
    except importlib.metadata.PackageNotFoundError:
        info["torchvision"] = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except (RuntimeError, AttributeError):
            pass
    from hpctrain import __version__

    info["hpctrain"] = __version__
    return info


def git_revision(directory: Path | None = None) -> str | None:
    """HEAD of the git checkout holding `directory` (default: the working directory), '+dirty' if modified."""
    cwd = str(directory or Path.cwd())
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def record_attempt(run_dir: Path, hosts: list[str], extra: dict[str, Any]) -> None:
    """Append this attempt (one per start or restart) to run_dir/provenance.json, atomically; never read or
    written through a symbolic link."""
    path = run_dir / PROVENANCE_FILE
    try:
        attempts = json.loads(read_text(path))["attempts"]
    except (OSError, ValueError, KeyError, TypeError):
        attempts = []
    slurm = {key: os.environ[key] for key in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_RESTART_COUNT",
                                              "SLURM_CLUSTER_NAME") if key in os.environ}
    attempts.append({
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv,
        "cwd": str(Path.cwd()),
        "launch_host": socket.gethostname(),
        "hosts": hosts,
        "versions": versions(),
        "git_revision": git_revision(),
        "slurm": slurm,
        **extra,
    })
    write_atomic(path, (json.dumps({"attempts": attempts}, indent=1) + "\n").encode())
