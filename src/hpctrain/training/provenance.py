"""What produced a run: versions, hosts, git revision, command line. Appended once per attempt to provenance.json."""

from __future__ import annotations

import logging
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.fsutil import write_atomic
from hpctrain.readback import BadRunFile, parse_record, read_json
from hpctrain.stops import MAX_PROVENANCE_BYTES, PROVENANCE_FILE

log = logging.getLogger(__name__)


@dataclass
class _Provenance:
    attempts: list[dict[str, Any]]


def versions() -> dict[str, str | None]:
    """Versions of what trains, as `hpctrain env` shows them (None: not in this build or not loadable)."""
    import torch

    from hpctrain import __version__

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn_version(),
        "nccl": nccl_version(),
        "torchvision": package_version("torchvision"),  # the installed version, without importing torchvision
        "hpctrain": __version__,
    }


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cudnn_version() -> str | None:
    """cuDNN as MAJOR.MINOR.PATCH (torch reports one number)."""
    import torch

    try:
        number = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # a broken cuDNN install must not stop the report
        return None
    if not number:
        return None
    # cuDNN 9 encodes major*10000 + minor*100 + patch; earlier versions major*1000 + minor*100 + patch.
    major, rest = divmod(number, 10000 if number >= 90000 else 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def nccl_version() -> str | None:
    """The NCCL this torch build carries (known without a GPU)."""
    import torch
    import torch.distributed as dist

    try:
        if not (dist.is_available() and dist.is_nccl_available()):
            return None
        version = torch.cuda.nccl.version()
    except Exception:  # no NCCL in this build, or it cannot load
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def git_revision(directory: Path | None = None) -> str | None:
    """HEAD of the git checkout holding `directory` (default: the working directory), '+dirty' if modified."""
    cwd = str(directory or Path.cwd())
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def membership_change(previous: dict[str, Any] | None, current: dict[str, Any]) -> str | None:
    """How a restarted torchrun worker group (`worker_group_restart`) differs from the attempt before it in size:
    "node2 lost at step 481; continued on 1 node at step 450 after 38 s (was 2 nodes, 2 processes)" (the loss as a
    survivor first saw it, when one could say), or None for the same world size."""
    if previous is None or "worker_group_restart" not in current:
        return None
    if previous.get("world_size") == current.get("world_size"):
        return None
    names, at = ", ".join(current.get("lost_nodes") or []), current.get("lost_at_step")
    lost = f"{names or 'a node'} lost{f' at step {at}' if at is not None else ''}; " if names or at is not None else ""
    after = f" after {current['since_loss_s']} s" if "since_loss_s" in current else ""
    step = current.get("resumed_step")
    return (
        f"{lost}continued on {_count(current.get('nodes'), 'node')} at step {step if step is not None else 0}{after}"
        f" (was {_count(previous.get('nodes', '?'), 'node')}, {_count(previous.get('world_size'), 'process')})"
    )


def _count(n: object, noun: str) -> str:
    plural = "es" if noun.endswith("s") else "s"
    return f"{n} {noun}{'' if n == 1 else plural}"


def record_attempt(run_dir: Path, hosts: list[str], extra: dict[str, Any]) -> dict[str, Any]:
    """Append this attempt (one per start or restart) to run_dir/provenance.json, atomically; never read or
    written through a symbolic link. A torchrun worker group of another size than the attempt before it is
    recorded as a membership change (membership_change). Returns the attempt as recorded."""
    path = run_dir / PROVENANCE_FILE
    try:
        attempts = parse_record(_Provenance, read_json(path, MAX_PROVENANCE_BYTES, within=run_dir), path).attempts
    except FileNotFoundError:
        attempts = []
    except BadRunFile as err:  # kept aside as it is; a new record starts with this attempt
        aside = path.with_name(PROVENANCE_FILE + ".unreadable")
        try:
            os.replace(path, aside)
            kept = f"moved aside to {aside.name}"
        except OSError as failed:
            kept = f"not moved aside ({os.strerror(failed.errno or 0)}), so replaced"
        log.warning(f"{err}; {kept}, a new record starts with this attempt")
        attempts = []
    slurm = {
        key: os.environ[key]
        for key in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_RESTART_COUNT", "SLURM_CLUSTER_NAME")
        if key in os.environ
    }
    change = membership_change(attempts[-1] if attempts else None, extra)
    attempts.append(
        {
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "argv": sys.argv,
            "cwd": str(Path.cwd()),
            "launch_host": socket.gethostname(),
            "hosts": hosts,
            "versions": versions(),
            "git_revision": git_revision(),
            "slurm": slurm,
            **extra,
            **({"membership_change": change} if change is not None else {}),
        }
    )
    write_atomic(path, (json.dumps({"attempts": attempts}, indent=1) + "\n").encode())
    return attempts[-1]


# How an attempt ended (the stop reason it left for the batch script) and what that made of the next one: the words
# the job page and `status` show beside each attempt.
ENDINGS = {
    "completed": "completed",
    "preempted": "time-limit warning or preemption: state saved, requeued",
    "cancelled": "cancelled (state saved)",
    "diverged": "the loss diverged",
    "hung": "hang: the watchdog ended it (hang/report.txt names the culprit)",
    "sick_node": "bad node: the preflight found a sick node, requeued without it",
}
UNSAID_END = "ended without a word: a node failure, a preemption by the scheduler, a crash or a kill"


def record_attempt_end(run_dir: Path, label: str) -> None:
    """Add how this attempt ended (a stop reason's label) to its record in provenance.json: best effort (the stop
    reason file is what a batch script reads; this is what a person reads later). Nothing when there is no record
    (a run that never started its loop), when it cannot be read, or when the attempt said so already."""
    path = run_dir / PROVENANCE_FILE
    try:
        attempts = parse_record(_Provenance, read_json(path, MAX_PROVENANCE_BYTES, within=run_dir), path).attempts
    except (OSError, BadRunFile):
        return
    if not attempts or not isinstance(attempts[-1], dict) or "ended" in attempts[-1]:
        return
    attempts[-1] = {**attempts[-1], "ended": label, "ended_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    try:
        write_atomic(path, (json.dumps({"attempts": attempts}, indent=1) + "\n").encode())
    except OSError:
        pass


def read_attempts(run_dir: Path) -> list[dict[str, Any]]:
    """The attempts of provenance.json, oldest first; none when there is no record. Raises BadRunFile for a record
    that is not one (too large, a link, not JSON)."""
    path = run_dir / PROVENANCE_FILE
    try:
        attempts = parse_record(_Provenance, read_json(path, MAX_PROVENANCE_BYTES, within=run_dir), path).attempts
    except FileNotFoundError:
        return []
    return [a for a in attempts if isinstance(a, dict)]


ATTEMPT_COLUMNS = ("attempt", "started", "nodes", "processes", "how it started", "how it ended")


def attempt_rows(attempts: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """A row per attempt: when it started, on how many nodes and processes, why it started (the first start, a
    requeue by the scheduler, a torchrun restart, a membership change) and how it ended (ENDINGS; the last one
    still running when it said nothing)."""
    rows = []
    for number, attempt in enumerate(attempts):
        restart = attempt.get("worker_group_restart")
        slurm = attempt.get("slurm") if isinstance(attempt.get("slurm"), dict) else {}
        if number == 0:
            began = "first start"
        elif attempt.get("membership_change"):
            began = f"membership change: {attempt['membership_change']}"
        elif restart:
            step = attempt.get("resumed_step")
            began = f"torchrun restart {restart} (a worker ended)" + (f", resumed at step {step}" if step else "")
        elif slurm.get("SLURM_RESTART_COUNT"):
            began = f"requeued (restart {slurm['SLURM_RESTART_COUNT']})"
        else:
            began = "started again"
        ended = attempt.get("ended")
        if isinstance(ended, str):
            how = ENDINGS.get(ended, ended)
        else:
            how = "running, or " + UNSAID_END if number == len(attempts) - 1 else UNSAID_END
        hosts = attempt.get("hosts")
        rows.append(
            (
                str(number + 1),
                str(attempt.get("started_at", "?")),
                str(attempt.get("nodes", len(hosts) if isinstance(hosts, list) else "?")),
                str(attempt.get("world_size", "?")),
                began,
                how,
            )
        )
    return rows
