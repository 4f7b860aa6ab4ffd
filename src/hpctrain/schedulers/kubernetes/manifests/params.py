"""The `key=value` params file of PAI-style Kubernetes platforms, read into hpctrain's job fields.

    name=mnist-run              kind=PyTorchJob|TrainJob       worker_count=2 (pods)
    worker_cpu=8 (per pod)      worker_gpu=1 (per pod)         worker_memory=16 (GB per pod)
    worker_shared_memory=4 (GB of /dev/shm)                   worker_image=REGISTRY/pytorch:TAG
    command=python3 train.py --epochs 10                      priority=1 (a label)
    workspace_id=team-a (the namespace)                        interactive=false

`parse_params_text` returns (job fields for hpctrain.jobs.mapping.from_mapping, KubernetesOptions fields), so the same
checks as for YAML/TOML job files follow. Every unknown key and every wrong value is named in one error.
"""

from __future__ import annotations

import re
import shlex
from decimal import Decimal, InvalidOperation
from typing import Any

from hpctrain.errors import UserError
from hpctrain.schedulers.kubernetes.manifests.options import quantity_mb

KEYS = (
    "name",
    "kind",
    "worker_count",
    "worker_cpu",
    "worker_gpu",
    "worker_memory",
    "worker_shared_memory",
    "worker_image",
    "command",
    "priority",
    "workspace_id",
    "interactive",
)
KINDS = {"pytorchjob": "pytorchjob", "trainjob": "trainjob"}
PRIORITY_LABEL = "hpctrain.io/priority"
_INT_RE = re.compile(r"^[0-9]+$")
MAX_GB = 1 << 20  # 1 PiB: beyond any node (the job's own bounds, hpctrain.jobs.spec, then apply)


def _whole(key: str, value: str, low: int, problems: list[str]) -> int | None:
    if not _INT_RE.match(value) or len(value) > 30 or int(value) < low:  # no huge int() to convert
        problems.append(f"{key}={value!r} must be a whole number >= {low}")
        return None
    return int(value)


def _gigabytes_mb(key: str, value: str, problems: list[str]) -> int | None:
    try:
        amount = Decimal(value)
    except InvalidOperation:
        amount = Decimal(-1)
    if not amount.is_finite() or amount <= 0 or amount > MAX_GB:
        problems.append(
            f"{key}={value!r} must be a positive number of GB, at most {MAX_GB} (e.g. {key}=4 or {key}=0.5)"
        )
        return None
    return max(1, int(amount * 1024))  # bounded above: no huge int() (1e100000 would pass Python's digit limit)


def parse_params_text(text: str, source: str = "params") -> tuple[dict[str, Any], dict[str, Any]]:
    values: dict[str, str] = {}
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key:
            problems.append(f"line {number} {raw.strip()!r} is not key=value")
        elif key in values:
            problems.append(f"{key} is given twice (line {number}): keep one")
        else:
            values[key] = value
    unknown = sorted(set(values) - set(KEYS))
    if unknown:
        problems.append(f"unknown key(s) {', '.join(unknown)} (valid: {', '.join(KEYS)})")

    job: dict[str, Any] = {}
    options: dict[str, Any] = {}
    if "name" in values:
        job["name"] = values["name"]
    if "kind" in values:
        api = KINDS.get(values["kind"].lower())
        if api is None:
            problems.append(f"kind={values['kind']!r} is not supported: use PyTorchJob or TrainJob")
        else:
            options["api"] = api
    if "worker_count" in values:
        job["nodes"] = _whole("worker_count", values["worker_count"], 1, problems)
    gpus = _whole("worker_gpu", values["worker_gpu"], 0, problems) if "worker_gpu" in values else 0
    nproc = max(1, gpus or 0)
    if gpus:
        job["gpus_per_node"] = gpus
    job["nproc_per_node"] = nproc
    if "worker_cpu" in values:
        cpus = _whole("worker_cpu", values["worker_cpu"], 1, problems)
        if cpus is not None and cpus % nproc:
            problems.append(
                f"worker_cpu={cpus} is not a multiple of worker_gpu={gpus}: each GPU's process gets the "
                "same number of CPUs; use a multiple"
            )
        elif cpus is not None:
            job["cpus_per_task"] = cpus // nproc
    memory_mb = _gigabytes_mb("worker_memory", values["worker_memory"], problems) if "worker_memory" in values else None
    if memory_mb is not None:
        job["mem"] = f"{memory_mb}M"
    if "worker_shared_memory" in values:
        shm_mb = _gigabytes_mb("worker_shared_memory", values["worker_shared_memory"], problems)
        if shm_mb is not None:
            options["shm"] = quantity_mb(shm_mb)
            if memory_mb is not None and shm_mb > memory_mb:
                problems.append(
                    f"worker_shared_memory={values['worker_shared_memory']} exceeds worker_memory="
                    f"{values['worker_memory']}: /dev/shm counts against the pod's memory; lower it"
                )
    if "worker_image" in values:
        options["image"] = values["worker_image"]
    if "command" in values:
        try:
            command = shlex.split(values["command"])
        except ValueError as err:
            command = None
            problems.append(f"command={values['command']!r} cannot be split into words ({err}): check its quotes")
        if command == []:
            problems.append("command= is empty: give the command every worker runs")
        elif command:
            job["command"] = command
    if "priority" in values:
        priority = _whole("priority", values["priority"], 0, problems)
        if priority is not None:
            options["labels"] = (f"{PRIORITY_LABEL}={priority}",)
    if "workspace_id" in values:
        options["namespace"] = values["workspace_id"]
    if "interactive" in values:
        flag = values["interactive"].lower()
        if flag not in ("true", "false"):
            problems.append(f"interactive={values['interactive']!r} must be true or false")
        elif flag == "true":
            problems.append(
                "interactive=true asks for an interactive session, which hpctrain does not start: "
                "set interactive=false (or use kubectl exec into a running pod)"
            )
    if problems:
        raise UserError(f"{source}: " + "; ".join(problems))
    return job, options
