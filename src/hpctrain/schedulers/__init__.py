"""Schedulers behind one interface (hpctrain.schedulers.base.Scheduler), registered by name, imported lazily.

    from hpctrain.schedulers import get_scheduler, detect
    sched = get_scheduler(detect(), namespace="team-a")   # keyword options go to the backend's create()
    rendered = sched.render(job)                          # pure: --dry-run prints rendered.text
    problems = sched.local_check(job) + sched.check(job)  # here, then live
    job_id = sched.submit(job, rendered)
    services = sched.services()                           # dev, tensorboard --on-cluster, top (services.py)

Each backend is one package (slurm/, kubernetes/) holding all hpctrain knows of its scheduler: its jobs, its dev
sessions, TensorBoard and `top` services, its cluster view. Adding a scheduler is a folder, a line in SCHEDULERS
and its tests; the backends import nothing of each other (pyproject's import-linter contracts).

Importing this package imports no backend: a Slurm user never loads the Kubernetes client. `backend_info(name)`
imports only the backend package's INFO (the flags it owns, its job defaults), not its client.
"""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.schedulers.base import (
    BackendInfo,
    ClusterView,
    JobAccess,
    JobStatus,
    JobSummary,
    NodeView,
    Outcome,
    Rendered,
    ReplicaStatus,
    Scheduler,
    Table,
    View,
    blocking,
)

# name -> module with a `create(**options) -> Scheduler` function and INFO, a BackendInfo.
SCHEDULERS: dict[str, str] = {
    "slurm": "hpctrain.schedulers.slurm",
    "kubernetes": "hpctrain.schedulers.kubernetes",
}
OFFLINE_DEFAULT = "slurm"
"""What `submit --dry-run` renders for when no scheduler is found here (it needs no cluster), as it always did."""
DETECTION = "slurm when sbatch is on PATH, else kubernetes when a kubeconfig is found"
"""How `detect` chooses, for help texts."""

__all__ = [
    "DETECTION",
    "OFFLINE_DEFAULT",
    "SCHEDULERS",
    "BackendInfo",
    "ClusterView",
    "JobAccess",
    "JobStatus",
    "JobSummary",
    "NodeView",
    "Outcome",
    "Rendered",
    "ReplicaStatus",
    "Scheduler",
    "Table",
    "View",
    "available",
    "backend_info",
    "blocking",
    "detect",
    "get_scheduler",
    "kubeconfig_present",
]


def backend_info(name: str) -> BackendInfo:
    """The BackendInfo of the backend registered as `name` (its package, not its client)."""
    if name not in SCHEDULERS:
        raise UserError(f"--scheduler {name!r} is unknown: use one of {', '.join(SCHEDULERS)}")
    return importlib.import_module(SCHEDULERS[name]).INFO


def get_scheduler(name: str, **options: Any) -> Scheduler:
    """The backend registered as `name`, built with its own options (e.g. KubernetesOptions fields)."""
    if name not in SCHEDULERS:
        raise UserError(f"--scheduler {name!r} is unknown: use one of {', '.join(SCHEDULERS)}")
    module = importlib.import_module(SCHEDULERS[name])
    return module.create(**options)


def kubeconfig_present(environ: Mapping[str, str] | None = None) -> bool:
    """A kubeconfig the client would read: $KUBECONFIG (any of its files), ~/.kube/config, or in-cluster."""
    environ = os.environ if environ is None else environ
    if environ.get("KUBERNETES_SERVICE_HOST") and environ.get("KUBERNETES_SERVICE_PORT"):
        return True
    if environ.get("KUBECONFIG"):
        return any(Path(p).expanduser().is_file() for p in environ["KUBECONFIG"].split(os.pathsep) if p)
    home = environ.get("HOME")
    return Path(home, ".kube", "config").is_file() if home else False


def available(environ: Mapping[str, str] | None = None, which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """Every scheduler this machine can reach, in detect's order of preference: Slurm when `sbatch` is on PATH,
    Kubernetes when a kubeconfig is found (the web console shows them side by side)."""
    found = []
    if which("sbatch"):
        found.append("slurm")
    if kubeconfig_present(environ):
        found.append("kubernetes")
    return found


def detect(environ: Mapping[str, str] | None = None, which: Callable[[str], str | None] = shutil.which) -> str:
    """The default scheduler when neither --scheduler nor the job file names one: Slurm when `sbatch` is on PATH
    (a login node that also has a kubeconfig is still a Slurm login node), else Kubernetes when a kubeconfig is
    found."""
    found = available(environ, which)
    if found:
        return found[0]
    raise UserError(
        "no scheduler found: `sbatch` is not on PATH and there is no kubeconfig ($KUBECONFIG, ~/.kube/config or "
        "in-cluster); pass --scheduler slurm|kubernetes, or use `hpctrain train` to run here"
    )
