"""The jobs as every scheduler means them (base.JobSummary, Scheduler.list_jobs: the web console's jobs table), from
one squeue of the few fields they need.

squeue prints a job's GPUs as it asked for them: TresPerNode is `gres:gpu:2` (22.05), `gres/gpu:2` (23.02 on), a
typed `gres/gpu:a100:2`, several entries separated by commas (a shard count beside it), or N/A; TresPerJob the same
for `--gpus N` (the job's total). Each distinct text is read once (a big queue repeats a few). Name is free text:
records.Fields reads it so that nothing in it can move a field or make a job.
"""

from __future__ import annotations

import functools
import getpass
from collections.abc import Callable

from hpctrain.schedulers.base import JobSummary
from hpctrain.schedulers.slurm.commands import Runner, run_bounded, slurm
from hpctrain.schedulers.slurm.grammar import gres_fields
from hpctrain.schedulers.slurm.queries.job_states import NULLS, id_order, state_word
from hpctrain.schedulers.slurm.queries.records import Fields

SUMMARY_FIELDS = (
    "JobID",
    "Name",
    "State",
    "NumNodes",
    "NumTasks",
    "tres-per-node",
    "tres-per-job",
    "SubmitTime",
    "RestartCnt",
)


@functools.cache
def gpus_of(tres: str) -> int:
    """The GPUs in a TRES list as squeue prints it (`gres:gpu:2`, `gres/gpu:a100:2,gres/shard:4`); 0 for none."""
    if tres in NULLS:
        return 0
    total = 0
    for entry in tres.split(","):
        kind, _, gres = entry.strip().partition(":" if entry.startswith("gres:") else "/")
        if kind != "gres" or not gres:
            continue
        try:
            name, _, count = gres_fields(gres.split("(")[0])
        except ValueError:
            continue  # a form this reader does not know is no GPU count, never an error
        total += count if name == "gpu" else 0
    return total


# Slurm's "not set" (slurm.h), printed as a number: 22.05 prints it for a job that gave no task count
NO_VAL = 0xFFFFFFFE


def _count(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) < NO_VAL else None


def summary_argv(user: str | None, fields: Fields) -> list[str]:
    """squeue for the summaries: their fields only; `user`'s jobs, or everyone's with None."""
    return ["squeue", "--noheader", "--states=all", fields.squeue_option(), *([f"--user={user}"] if user else [])]


def list_summaries(
    neutral: Callable[[str], str], all_users: bool = False, run: Runner = run_bounded
) -> list[JobSummary]:
    """The caller's jobs (everyone's with all_users) that the controller knows, in job id order; `neutral` maps
    Slurm's state word to a neutral state."""
    fields = Fields(SUMMARY_FIELDS)
    columns = fields.columns(slurm(summary_argv(None if all_users else getpass.getuser(), fields), run=run).stdout)
    out = []
    for job_id, name, state, nodes, tasks, per_node, per_job, submitted, restarts in zip(*columns):
        word = state_word(state)
        num_nodes, num_tasks = _count(nodes) or 0, _count(tasks)
        gpus = gpus_of(per_node) * num_nodes or gpus_of(per_job)
        out.append(
            JobSummary(
                job_id=job_id,
                state=neutral(word),
                created=None if submitted in NULLS else submitted,
                replicas=num_nodes,
                name=name,
                processes_per_node=num_tasks // num_nodes if num_tasks and num_nodes else None,
                gpus=gpus,
                restarts=_count(restarts) or 0,
                label=word,
            )
        )
    return sorted(out, key=lambda s: id_order(s.job_id))
