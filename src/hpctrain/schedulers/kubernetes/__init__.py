"""Kubernetes: Kubeflow PyTorchJob / Trainer v2 TrainJob behind hpctrain's scheduler interface.

    options.py, params.py  KubernetesOptions and a platform's .params files;  kubeconfig.py  the default namespace
    flags.py               the flags Kubernetes owns (where the jobs are, a job's options)
    render.py, validate.py the manifest from a JobSpec (pure), checked against the CRDs' schemas
    local.py               the checks on the submit host;  checks.py  those against the live cluster
    scheduler.py           KubernetesScheduler: submit, status, logs, cancel, the cluster view
    display.py             what `status`, `cluster` and `cancel` show, as data, and the submission's record
    client.py              the API client: timeouts, size caps, errors in one line
    rest.py                what the views and checks read: the API server's JSON as dicts, no generated models
    answers.py             answers of the wrong shape (HTML, empty, nested, wrong types) as one line

Importing this package does not import the `kubernetes` client; `KubernetesScheduler` loads it on first use.
INFO tells the CLI which flags are this backend's and what they become.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

from hpctrain.errors import UserError
from hpctrain.schedulers.base import BackendInfo
from hpctrain.schedulers.kubernetes.flags import add_arguments
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
from hpctrain.schedulers.kubernetes.manifests.params import parse_params_text

# dest -> flag: where the jobs are (every command that talks to the cluster), then the options of a job.
CONNECTION_FLAGS = {"namespace": "--namespace", "k8s_api": "--k8s-api", "context": "--context"}
JOB_FLAGS = {
    "shm": "--shm",
    "priority_class": "--priority-class",
    "volumes": "--volume",
    "node_selector": "--node-selector",
    "tolerations": "--toleration",
    "service_account": "--service-account",
    "image_pull_secrets": "--image-pull-secret",
    "labels": "--label",
    "runtime": "--runtime",
    "replace": "--replace",
}


def client_version() -> str | None:
    """The installed `kubernetes` Python client's version (hpctrain[k8s]), read from its metadata, not imported."""
    try:
        return metadata.version("kubernetes")
    except metadata.PackageNotFoundError:
        return None


def read_file_section(source: str, section: Any) -> dict[str, Any]:
    """A job file's `kubernetes:` section: KubernetesOptions fields (lists become tuples)."""
    from dataclasses import fields

    from hpctrain.jobs.mapping import known_keys

    valid = sorted(f.name for f in fields(KubernetesOptions))
    if not isinstance(section, dict):
        raise UserError(f"{source}: kubernetes must be a mapping of options ({', '.join(valid)})")
    data = known_keys(section, valid, f"{source}: unknown kubernetes key(s)")
    return {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}


INFO = BackendInfo(
    name="kubernetes",
    title="Kubernetes",
    flags={**CONNECTION_FLAGS, **JOB_FLAGS, "replica": "--replica"},
    hints={  # what a Slurm flag's user wants here
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
        "--max-hang-restarts": "Kubernetes restarts failed pods within --max-restarts (a hung attempt exits 142)",
    },
    # KubernetesOptions fields (--context is create()'s own keyword); on Kubernetes --image is the pods' image
    connection_fields={"namespace": "namespace", "k8s_api": "api"},
    option_fields={"namespace": "namespace", "k8s_api": "api", **{dest: dest for dest in JOB_FLAGS}, "image": "image"},
    file_section=read_file_section,
    file_formats={".params": parse_params_text},  # (text, source): no client, no torch
    add_arguments=add_arguments,
    # The pods have the image's programs and the volumes' files, not this machine's: --image is an option, and
    # the job's run directory is not read here.
    run_dir_pattern=lambda stem: "runs/%j",  # %j is the job name: it says what runs and is unique in its namespace
    local_run_dir=lambda run_dir: None,
    client_version=client_version,
)


def create(options: KubernetesOptions | None = None, context: str | None = None, **fields: Any):
    """The registry's entry point: `get_scheduler("kubernetes", namespace="team-a", api="trainjob")` or
    `get_scheduler("kubernetes", options=KubernetesOptions(...), context="prod")`. Without a namespace: the
    default one of kubeconfig.default_namespace (HPCTRAIN_NAMESPACE, the context's, `default`)."""
    from hpctrain.schedulers.kubernetes.scheduler import KubernetesScheduler

    if options is None:
        if fields.get("namespace") is None:  # as kubectl: the context's namespace (or HPCTRAIN_NAMESPACE)
            from hpctrain.schedulers.kubernetes.api.kubeconfig import default_namespace

            fields["namespace"] = default_namespace(context)
        options = KubernetesOptions(**fields)
    elif fields:
        raise TypeError("give KubernetesOptions or its fields, not both")
    return KubernetesScheduler(options, context=context)


__all__ = ["INFO", "KubernetesOptions", "create"]
