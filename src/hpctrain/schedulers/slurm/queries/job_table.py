"""`hpctrain status` (no job named) as a table: squeue asked for the printed columns only, its text made into the
table's columns directly.

The table shows seven cells a job (display.JOB_COLUMNS); `status --all-users` on a big cluster has 100,000 jobs. So
this path asks squeue for the nine fields those cells come from (not jobs.SQUEUE_FIELDS' fifteen), in job id
order (`--sort=i`), builds no JobInfo, and makes each column in one pass over squeue's text: records.Fields splits
the whole text at once into its columns (the free-text ones, name and reason, at this query's random separator, so
no job name can move a field or make a row). Each distinct state, duration and count is turned into its cell once
(a big queue repeats a few dozen). The cells are exactly display.job_rows' for the same jobs
(tests/test_scale_slurm.py compares them).

squeue's `--sort=i` orders by job id, array tasks and heterogeneous components by their parent's id then index
(_sort_job_by_id in src/squeue/sort.c, slurm-20-11-0-1 to slurm-25-11-0-1); the ids are still sorted here, stably,
by jobs.id_order (a pending array's `4100_[3-10]` record comes first here, last in squeue), which on an ordered
list costs one comparison a job.
"""

from __future__ import annotations

import functools
import getpass
import operator

from hpctrain.jobs.values import format_duration
from hpctrain.schedulers.base import ColumnCells
from hpctrain.schedulers.slurm.commands import Runner, run_bounded, slurm
from hpctrain.schedulers.slurm.queries.display import wanted
from hpctrain.schedulers.slurm.queries.job_states import NULLS, duration_or_none, id_order, state_word
from hpctrain.schedulers.slurm.queries.records import Fields

TABLE_FIELDS = ("JobID", "Name", "State", "Reason", "NodeList", "NumNodes", "MaxNodes", "TimeUsed", "RestartCnt")


def table_argv(user: str | None, fields: Fields | None = None) -> list[str]:
    """squeue for the table: its fields only (records.Fields: Name and Reason ended by this query's random
    separator), in job id order; the caller's jobs unless user is None."""
    argv = ["squeue", "--noheader", "--states=all", "--sort=i"]
    argv.append((fields or Fields(TABLE_FIELDS)).squeue_option())
    return argv + ([f"--user={user}"] if user else [])


@functools.cache
def _wanted(num_nodes: str, max_nodes: str) -> str:
    return wanted(int(num_nodes) if num_nodes.isdigit() else None, int(max_nodes) if max_nodes.isdigit() else None)


@functools.cache
def _elapsed(text: str) -> str:
    seconds = duration_or_none(text)
    return "" if seconds is None else format_duration(seconds)


@functools.cache
def _restarts(text: str) -> str:
    return str(int(text)) if text.isdigit() else "0"


def table_columns(text: str, fields: Fields) -> ColumnCells:
    """Output of table_argv(user, fields) -> the table's cells by column (display.JOB_COLUMNS), in job id order."""
    job_id, name, state, reason, nodes, num_nodes, max_nodes, used, restarts = fields.columns(text)
    columns = [
        job_id,
        name,
        list(map(state_word, state)),
        ["" if r in NULLS else r for r in reason],  # why it waits, or why it failed
        [w if nl in NULLS else nl for nl, w in zip(nodes, map(_wanted, num_nodes, max_nodes))],
        list(map(_elapsed, used)),
        list(map(_restarts, restarts)),
    ]
    keys = list(map(int, job_id)) if all(job_id) and "".join(job_id).isdigit() else list(map(id_order, job_id))
    if any(map(operator.gt, keys, keys[1:])):  # not in id order already (squeue's differs for array records)
        order = sorted(range(len(keys)), key=keys.__getitem__)
        columns = [list(map(column.__getitem__, order)) for column in columns]
    return ColumnCells(columns)


def list_columns(user: str | None = None, all_users: bool = False, run: Runner = run_bounded) -> ColumnCells:
    """The jobs the controller knows as the table's columns, the caller's unless all_users."""
    if not all_users and user is None:
        user = getpass.getuser()
    fields = Fields(TABLE_FIELDS)
    return table_columns(slurm(table_argv(None if all_users else user, fields), run=run).stdout, fields)
