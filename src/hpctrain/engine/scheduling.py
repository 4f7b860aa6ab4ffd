"""Choosing the scheduler for a command: `--scheduler NAME`, else the job file's `scheduler:`, else the one found
here (hpctrain.schedulers.detect), and the flags that only one of them understands.

Shared by submit, check, status, logs, cancel, cluster, debug, dev, tensorboard and top. Names no scheduler: which
flags each backend adds, which belong to which backend and what they become, is each backend's BackendInfo
(hpctrain.schedulers.backend_info). Imports no backend's client: the chosen one is loaded by
hpctrain.schedulers.get_scheduler, so a user of one scheduler never loads another's client.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping
from typing import Any

from hpctrain.errors import UserError
from hpctrain.schedulers import DETECTION, OFFLINE_DEFAULT, SCHEDULERS, backend_info

SCHEDULER_NAMES = tuple(SCHEDULERS)
SCHEDULER_ENV = "HPCTRAIN_SCHEDULER"  # the default scheduler of this shell (a login node that has both)


def chosen_scheduler_help(what: str, job_file: bool = False) -> str:
    """--scheduler's help: `what` it chooses, and how choose_scheduler picks one when it is left out (`job_file`:
    the command reads a job file's `scheduler:` first)."""
    first = "the job file's `scheduler:`, else " if job_file else ""
    return f"{what} (default: {first}${SCHEDULER_ENV}, else {DETECTION})"


def add_scheduler_argument(parser: argparse.ArgumentParser, help_text: str) -> argparse._ArgumentGroup:
    g = parser.add_argument_group("scheduler")
    g.add_argument("--scheduler", choices=SCHEDULER_NAMES, help=help_text)
    return g


def add_connection_arguments(
    parser: argparse.ArgumentParser,
    role: str,
    scheduler_help: str = chosen_scheduler_help("where the jobs are"),
    schedulers: Iterable[str] = SCHEDULERS,
) -> None:
    """--scheduler (its help: `scheduler_help`) plus each backend's flags for the command's `role`
    (hpctrain.schedulers.base.ROLES: `job` for submit and check, else the command's name); see
    BackendInfo.add_arguments. The CLI declares no flag that only one backend understands. `schedulers`: the
    backends whose flags are added (the web form: those the console shows; a command: every one)."""
    group = add_scheduler_argument(parser, scheduler_help)
    for name in schedulers:
        backend_info(name).add_arguments(parser, group, role)


def add_job_scheduler_arguments(parser: argparse.ArgumentParser, schedulers: Iterable[str] = SCHEDULERS) -> None:
    """submit and check: --scheduler, and each backend's flags for where the job goes and its options."""
    add_connection_arguments(
        parser,
        role="job",
        scheduler_help=chosen_scheduler_help("where the job runs", job_file=True),
        schedulers=schedulers,
    )


def choose_scheduler(args: argparse.Namespace, file_scheduler: str | None = None, offline: bool = False) -> str:
    """--scheduler, else the job file's, else $HPCTRAIN_SCHEDULER, else the one found here; with `offline` (submit
    --dry-run renders without a cluster) schedulers.OFFLINE_DEFAULT when none is found, as it always did."""
    if getattr(args, "scheduler", None):
        return args.scheduler
    if file_scheduler:
        return file_scheduler
    if os.environ.get(SCHEDULER_ENV):
        if os.environ[SCHEDULER_ENV] not in SCHEDULER_NAMES:
            raise UserError(
                f"{SCHEDULER_ENV}={os.environ[SCHEDULER_ENV]!r} is unknown: set it to "
                f"{' or '.join(SCHEDULER_NAMES)}, or unset it"
            )
        return os.environ[SCHEDULER_ENV]
    from hpctrain.schedulers import detect

    try:
        return detect()
    except UserError:
        if not offline:
            raise
        return OFFLINE_DEFAULT


def refuse_foreign_flags(args: argparse.Namespace, scheduler: str) -> None:
    """A flag that only another scheduler understands is an error that names the fix (not silently ignored)."""
    chosen = backend_info(scheduler)
    for other in SCHEDULERS:
        if other == scheduler:
            continue
        owner = backend_info(other)
        for dest, flag in owner.flags.items():
            if getattr(args, dest, None) not in (None, False):
                way = f" ({chosen.hints[flag]})" if flag in chosen.hints else ""
                raise UserError(
                    f"{flag} is a {owner.title} option but the job goes to {scheduler}: drop {flag}{way}, "
                    f"or pass --scheduler {other}"
                )


def backend_options(
    args: argparse.Namespace, scheduler: str, base: Mapping[str, Any] | None = None, job: bool = True
) -> dict[str, Any]:
    """The chosen backend's own options (its create() keywords but --context): `base` (a job file's), with every
    flag given on top; those of a job, or (job=False) only those that say where the jobs are."""
    info = backend_info(scheduler)
    fields = dict(base or {})
    for dest, name in (info.option_fields if job else info.connection_fields).items():
        value = getattr(args, dest, None)
        if value is not None:
            fields[name] = tuple(value) if isinstance(value, list) else value
    return fields


def role_actions(scheduler: str, role: str) -> tuple[argparse.Action, ...]:
    """The flags `scheduler`'s backend declares for a command's `role` (what its BackendInfo.add_arguments adds,
    asked on a scratch parser), as argparse actions: a face makes its fields of them (the web console's forms)."""
    parser = argparse.ArgumentParser(add_help=False)
    backend_info(scheduler).add_arguments(parser, parser.add_argument_group("scheduler"), role)
    return tuple(parser._actions)


def role_dests(scheduler: str, role: str) -> tuple[str, ...]:
    """The argparse dests of the flags `scheduler`'s backend declares for a command's `role`."""
    return tuple(action.dest for action in role_actions(scheduler, role))


def backend_flag_values(args: argparse.Namespace, role: str, schedulers: Iterable[str] = SCHEDULERS) -> dict[str, Any]:
    """Every flag the backends declared for `role` that was given (not None, empty or False), by argparse dest,
    lists as tuples: a service's Placement options, which each backend reads its own of (and refuses another's)."""
    given: dict[str, Any] = {}
    for name in schedulers:
        for dest in role_dests(name, role):
            value = getattr(args, dest, None)
            if value not in (None, False, [], ()):
                given[dest] = tuple(value) if isinstance(value, list) else value
    return given


def get_backend(args: argparse.Namespace, scheduler: str, fields: Mapping[str, Any] | None = None):
    """The chosen backend, built with its options (when `fields` is None: where the jobs are, from the flags)."""
    from hpctrain.schedulers import get_scheduler

    fields = backend_options(args, scheduler, job=False) if fields is None else fields
    return get_scheduler(scheduler, context=getattr(args, "context", None), **fields)


def backend_for(args: argparse.Namespace):
    """For status, logs, cancel, cluster and debug: the chosen backend, after checking that no flag is another's."""
    scheduler = choose_scheduler(args)
    refuse_foreign_flags(args, scheduler)
    return get_backend(args, scheduler)
