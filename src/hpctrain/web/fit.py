"""The cluster page's answer to "does my job fit on one node, does it fit my quota": a job of the form's size
(nodes, GPUs, CPUs and memory per node) made into the neutral job description as a job file would give it
(hpctrain.engine.job_options.job_from_data: its errors are the CLI's), then the scheduler's own live check
(Scheduler.check, what `hpctrain check` asks: on Slurm whether a node of the partitions can hold it, on Kubernetes
the nodes' allocatable resources and the namespace's quota). A GET: it asks, and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hpctrain.engine.job_options import job_from_data
from hpctrain.errors import UserError
from hpctrain.schedulers.base import Scheduler, blocking
from hpctrain.web.safeview import line

FIELDS = (
    ("nodes", "nodes", "1"),
    ("gpus_per_node", "GPUs per node", "0"),
    ("cpus_per_task", "CPUs per node", "1"),
    ("mem", "memory per node", ""),
)
WHOLE = ("nodes", "gpus_per_node", "cpus_per_task")


def asked(query: Mapping[str, str]) -> dict[str, str] | None:
    """The form's values from the query (None: the form was not sent)."""
    if not any(key in query for key, _, _ in FIELDS):
        return None
    return {key: query.get(key, default).strip()[:64] for key, _, default in FIELDS}


def job_of(values: Mapping[str, str]) -> Any:
    """The job the form describes: one process per node, the CPUs and memory given per node. Bad values are the
    job file's one-line errors."""
    data: dict[str, Any] = {"command": ["true"], "nproc_per_node": 1}
    for key, label, _ in FIELDS:
        text = values.get(key, "")
        if not text:
            continue
        if key in WHOLE:
            if not text.isdigit():
                raise UserError(f"{label}: {text!r} is not a whole number; give a count such as 2")
            data[key] = int(text)
        else:
            data[key] = text
    return job_from_data(data, "the form")


def answer(scheduler: Scheduler, values: Mapping[str, str]) -> dict[str, Any]:
    """{"fits": bool, "lines": [...]}: the check's problems (each naming its fix) and warnings, or that it fits."""
    try:
        job = job_of(values)
        problems = scheduler.check(job)
    except UserError as err:
        return {"fits": False, "lines": [line(str(err))]}
    refused = blocking(problems)
    said = [line(p) for p in problems]
    if not refused:
        said.insert(
            0, "fits: the live check finds no problem (nodes big enough; the quota allows it, where there is one)"
        )
    return {"fits": not refused, "lines": said}
