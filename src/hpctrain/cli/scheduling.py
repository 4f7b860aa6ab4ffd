"""Choosing the scheduler for a command: `--scheduler slurm|kubernetes`, else the job file's `scheduler:`, else the
one found here (hpctrain.schedulers.detect), and the flags that only one of them understands.

Shared by submit, check, status, logs, cancel and cluster. Imports no backend: the chosen one is loaded by
hpctrain.schedulers.get_scheduler, so a Slurm user never loads the Kubernetes client.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from hpctrain.errors import UserError

SCHEDULER_NAMES = ("slurm", "kubernetes")
SCHEDULER_ENV = "HPCTRAIN_SCHEDULER"  # the default scheduler of this shell (a login node that has both)

# dest -> flag, for the options every command that talks to a cluster takes.
CONNECTION_FLAGS = {"namespace": "--namespace", "k8s_api": "--k8s-api", "context": "--context"}
# dest -> flag: the Kubernetes options of a job (KubernetesOptions fields in KUBERNETES_FIELDS).
KUBERNETES_JOB_FLAGS = {
    **CONNECTION_FLAGS,
    "shm": "--shm",
    "priority_class": "--priority-class",
    "volumes": "--volume",
    "node_selector": "--node-selector",
    "tolerations": "--toleration",
    "service_account": "--service-account",
    "image_pull_secrets": "--image-pull-secret",
    "labels": "--label",
}
# What a Slurm flag's user wants on Kubernetes.
KUBERNETES_WAY = {
    "--mount": "Kubernetes mounts volumes with --volume",
    "--env-kind": "on Kubernetes the image is the environment: --image",
    "--module": "on Kubernetes the image is the environment: --image",
    "--conda-env": "on Kubernetes the image is the environment: --image",
    "--venv": "on Kubernetes the image is the environment: --image",
    "--gres": "ask for whole GPUs with --gpus-per-node",
    "--gpu-type": "pick the GPU model with --node-selector nvidia.com/gpu.product=MODEL",
    "--partition": "pick nodes with --node-selector and --toleration",
    "--max-requeues": "Kubernetes restarts failed pods within --max-restarts",
    "--max-preemptions": "Kubernetes restarts failed pods within --max-restarts",
}
# argparse dest -> KubernetesOptions field (where they differ; --image is handled by submit).
KUBERNETES_FIELDS = {"k8s_api": "api"}


def add_scheduler_argument(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    g = parser.add_argument_group("scheduler")
    g.add_argument("--scheduler", choices=SCHEDULER_NAMES,
                   help="where the job runs (default: the job file's `scheduler:`, else $HPCTRAIN_SCHEDULER, else slurm "
                        "when sbatch is on PATH, else kubernetes when a kubeconfig is found)")
    return g


def add_connection_arguments(parser: argparse.ArgumentParser, k8s_api: bool = True) -> None:
    """--scheduler plus the Kubernetes options that say where jobs are (status, logs, cancel, cluster; without
    --k8s-api for the commands around the job: dev, tensorboard, top)."""
    g = add_scheduler_argument(parser)
    g.add_argument("--namespace", metavar="NAME",
                   help="Kubernetes: the namespace (default: $HPCTRAIN_NAMESPACE, else the kubeconfig context's, else default)")
    if k8s_api:
        g.add_argument("--k8s-api", dest="k8s_api", choices=("pytorchjob", "trainjob"),
                       help="Kubernetes: Kubeflow PyTorchJob (default) or Trainer v2 TrainJob")
    g.add_argument("--context", metavar="NAME", help="Kubernetes: the kubeconfig context (default: the current one)")


def add_kubernetes_job_arguments(parser: argparse.ArgumentParser) -> None:
    add_connection_arguments(parser)
    k = parser.add_argument_group("kubernetes (with --scheduler kubernetes; --nodes counts worker pods)")
    k.add_argument("--shm", metavar="SIZE", help="size of /dev/shm, an in-memory volume (e.g. 8Gi): DataLoader workers need it")
    k.add_argument("--priority-class", metavar="NAME", help="the pods' PriorityClass")
    k.add_argument("--volume", dest="volumes", action="append", metavar="SPEC",
                   help="pvc:CLAIM:/mount, nfs:SERVER:/export:/mount or host:/node/path:/mount, each with an optional :ro (repeatable)")
    k.add_argument("--node-selector", dest="node_selector", action="append", metavar="KEY=VALUE",
                   help="run only on nodes with this label (repeatable)")
    k.add_argument("--toleration", dest="tolerations", action="append", metavar="KEY[=VALUE][:EFFECT]",
                   help="tolerate a node taint (repeatable)")
    k.add_argument("--service-account", metavar="NAME")
    k.add_argument("--image-pull-secret", dest="image_pull_secrets", action="append", metavar="NAME",
                   help="secret for pulling --image from a private registry (repeatable)")
    k.add_argument("--label", dest="labels", action="append", metavar="KEY=VALUE",
                   help="extra label on the job and its pods (repeatable)")


def choose_scheduler(args: argparse.Namespace, file_scheduler: str | None = None, fallback: str | None = None) -> str:
    """--scheduler, else the job file's, else $HPCTRAIN_SCHEDULER, else the one found here; `fallback` when none
    is found (submit --dry-run renders without a cluster, so it falls back to Slurm as it always did)."""
    if getattr(args, "scheduler", None):
        return args.scheduler
    if file_scheduler:
        return file_scheduler
    if os.environ.get(SCHEDULER_ENV):
        if os.environ[SCHEDULER_ENV] not in SCHEDULER_NAMES:
            raise UserError(f"{SCHEDULER_ENV}={os.environ[SCHEDULER_ENV]!r} is unknown: set it to "
                            f"{' or '.join(SCHEDULER_NAMES)}, or unset it")
        return os.environ[SCHEDULER_ENV]
    from hpctrain.schedulers import detect

    try:
        return detect()
    except UserError:
        if fallback is None:
            raise
        return fallback


def refuse_foreign_flags(args: argparse.Namespace, scheduler: str, slurm_only: Mapping[str, str],
                         kubernetes_only: Mapping[str, str]) -> None:
    """A flag of the other scheduler is an error that names the fix (not silently ignored)."""
    foreign, owner = (kubernetes_only, "kubernetes") if scheduler == "slurm" else (slurm_only, "slurm")
    for dest, flag in foreign.items():
        if getattr(args, dest, None) not in (None, False):
            way = f" ({KUBERNETES_WAY[flag]})" if owner == "slurm" and flag in KUBERNETES_WAY else ""
            raise UserError(f"{flag} is a {'Kubernetes' if owner == 'kubernetes' else 'Slurm'} option but the job goes "
                            f"to {scheduler}: drop {flag}{way}, or pass --scheduler {owner}")


def kubernetes_fields(args: argparse.Namespace, flags: Mapping[str, str], base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """KubernetesOptions fields: `base` (a job file's), with every flag given on top."""
    fields = dict(base or {})
    for dest in flags:
        if dest == "context":
            continue
        value = getattr(args, dest, None)
        if value is not None:
            fields[KUBERNETES_FIELDS.get(dest, dest)] = tuple(value) if isinstance(value, list) else value
    return fields


def get_backend(args: argparse.Namespace, scheduler: str, fields: Mapping[str, Any] | None = None):
    """The chosen backend, built with its options."""
    from hpctrain.schedulers import get_scheduler

    if scheduler == "kubernetes":
        fields = kubernetes_fields(args, CONNECTION_FLAGS) if fields is None else fields
        return get_scheduler("kubernetes", context=getattr(args, "context", None), **fields)
    return get_scheduler("slurm")


def backend_for(args: argparse.Namespace, slurm_only: Mapping[str, str]):
    """For status, logs, cancel and cluster: the chosen backend, or None for Slurm, whose CLI output (tables,
    JSON, messages) is its own. Checks the flags first."""
    scheduler = choose_scheduler(args)
    refuse_foreign_flags(args, scheduler, slurm_only, {**CONNECTION_FLAGS, "replica": "--replica"})
    return None if scheduler == "slurm" else get_backend(args, scheduler)
