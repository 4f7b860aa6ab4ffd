"""The job options that `hpctrain submit` and `hpctrain check` share: their flags (add_job_arguments), and the
job they describe with the job file (submission_from_args): the neutral JobSpec, the scheduler and that
scheduler's options, and a built-in recipe's options parsed as `hpctrain train` will parse them in the job.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hpctrain.engine.scheduling import (
    add_job_scheduler_arguments,
    backend_options,
    choose_scheduler,
    refuse_foreign_flags,
)
from hpctrain.errors import UserError
from hpctrain.jobs.mapping import from_mapping
from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers import SCHEDULERS, backend_info, base
from hpctrain.schedulers.job_sections import JobFile, read_job_file


def add_job_arguments(parser: argparse.ArgumentParser, schedulers: Iterable[str] = SCHEDULERS) -> None:
    """Job options; every one left out keeps the job file's value (or the default). `schedulers`: the backends
    whose own flags are added (default: every one)."""
    g = parser.add_argument_group("job")
    g.add_argument(
        "--job-file",
        metavar="PATH",
        help="YAML or TOML job description, or a Kubernetes platform's key=value .params file; flags "
        "given here override it",
    )
    g.add_argument("--job-name", "-J", dest="name", metavar="NAME", help="job name (default: hpctrain)")
    g.add_argument("--time", "-t", metavar="TIME", help="time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    g.add_argument(
        "--exclude-nodes",
        dest="exclude_nodes",
        action="append",
        metavar="NODE[,NODE...]",
        help="never run on these nodes, e.g. those a preflight found sick (Slurm: --exclude; Kubernetes: "
        "a node affinity); repeatable",
    )
    g.add_argument(
        "--setenv",
        dest="env",
        action="append",
        metavar="NAME=VALUE",
        help="environment variable for the job (repeatable)",
    )
    r = parser.add_argument_group("resources (per node; on Kubernetes per pod)")
    r.add_argument(
        "--nodes",
        "-N",
        metavar="N|MIN:MAX",
        help="nodes (Slurm) or worker pods (Kubernetes); MIN:MAX: an elastic job (torchrun), which keeps training "
        "when nodes are lost while MIN remain (Slurm: no growth; Kubernetes: PyTorchJob only)",
    )
    r.add_argument(
        "--nproc-per-node",
        "--ntasks-per-node",
        dest="nproc_per_node",
        type=int,
        metavar="N",
        help="training processes per node (one per GPU)",
    )
    r.add_argument("--gpus-per-node", type=int, metavar="N")
    r.add_argument("--cpus-per-task", "-c", type=int, metavar="N", help="CPUs per training process")
    r.add_argument("--mem", metavar="SIZE", help="memory per node, e.g. 16G")
    e = parser.add_argument_group("environment")
    e.add_argument(
        "--image",
        metavar="IMAGE",
        help="Slurm: apptainer .sif, or enroot image for pyxis; Kubernetes: the container image of every pod",
    )
    l = parser.add_argument_group("launch")
    l.add_argument(
        "--run-dir", metavar="DIR", help="run directory of a command after -- (%%j = job id; default runs/NAME-%%j)"
    )
    l.add_argument(
        "--signal-grace",
        type=int,
        metavar="S",
        help="SIGUSR1 this many seconds before the time limit (default 120; 0: off)",
    )
    l.add_argument(
        "--max-restarts",
        type=int,
        metavar="N",
        help="torchrun: restart the workers up to N times after one dies (default 0)",
    )
    add_job_scheduler_arguments(parser, schedulers)
    parser.add_argument(
        "job_command",
        metavar="COMMAND",
        nargs=argparse.REMAINDER,
        help="`train WORKLOAD [train options]` (`hpctrain train --help`), or `-- COMMAND ...` for your own program",
    )


# The neutral job's flags (JobSpec, Resources); a backend's own flags become its options (backend_options).
_RESOURCE_FLAGS = ("nodes", "nproc_per_node", "gpus_per_node", "cpus_per_task", "mem")
_JOB_FLAGS = ("name", "time", "run_dir", "signal_grace", "max_restarts")


@dataclass(frozen=True)
class Submission:
    """What the flags and the job file ask for: the neutral job, the scheduler, and that scheduler's options."""

    job: JobSpec
    scheduler: str
    options: dict[str, Any] = field(default_factory=dict)
    """The backend's own options (the job file's section or its top-level keys, then the flags'): the fields of
    its options object, for its create()."""
    recipe: Any = None
    """The TrainConfig of a built-in recipe's options, parsed as `hpctrain train` will in the job; None for a
    command."""
    resources_only: bool = False
    """No command was given (`hpctrain check` of the resources alone): the job's command is a placeholder."""


# The command of a job that `hpctrain check` checks for its resources alone.
PLACEHOLDER_COMMAND = ("true",)


def job_from_data(data: dict[str, Any], source: str) -> JobSpec:
    """The neutral job that `data` describes as a job file's top level would (a web form's fields), named `source`
    in its one-line errors: the faces read job data through here, never through hpctrain.jobs' file reading."""
    return from_mapping(data, source)


def submission_from_args(args: argparse.Namespace, dry_run: bool = False, command_optional: bool = False) -> Submission:
    """Job file, then flags on top; the scheduler from --scheduler, the file or this machine. `command_optional`:
    without a command, the job runs PLACEHOLDER_COMMAND and says so (`resources_only`)."""
    job_file = read_job_file(args.job_file) if args.job_file else JobFile(job={})
    scheduler = choose_scheduler(args, job_file.scheduler, offline=dry_run)
    info = backend_info(scheduler)
    file_options = job_file.options
    if job_file.section is not None and job_file.section != scheduler:
        owner = backend_info(job_file.section)
        raise UserError(
            f"job file {args.job_file} holds {owner.title} options ({', '.join(sorted(file_options))}) "
            f"but the job goes to {scheduler}: pass --scheduler {owner.name}, or remove them"
        )
    refuse_foreign_flags(args, scheduler)
    data = dict(job_file.job)
    file_options = {**_top_level_options(args, data, scheduler), **file_options}
    options = backend_options(args, scheduler, file_options)
    resources_only = command_optional and not args.job_command and not data.get("command")
    if resources_only:
        data["command"] = list(PLACEHOLDER_COMMAND)
    job, options = _job(args, data, options, info)
    recipe = recipe_config(list(job.command[2:])) if job.is_recipe else None
    return Submission(job=job, scheduler=scheduler, options=options, recipe=recipe, resources_only=resources_only)


def _top_level_options(args: argparse.Namespace, data: dict[str, Any], scheduler: str) -> dict[str, Any]:
    """A backend's options at the job file's top level (where job files kept them before sections), taken out of
    `data`: the chosen backend's, read as its section is; another backend's are refused with the fix unless at
    their defaults (a job.yaml of an earlier version holds them all)."""
    chosen = backend_info(scheduler)
    found: dict[str, Any] = {}
    for name in SCHEDULERS:
        owner = backend_info(name)
        keys = {k: data.pop(k) for k in list(data) if str(k).replace("-", "_") in owner.file_keys}
        if name == scheduler and keys and owner.file_section is not None:
            found = owner.file_section(f"job file {args.job_file}", keys)
        for key, value in sorted(keys.items()) if name != scheduler else ():
            field_name = str(key).replace("-", "_")
            no_option = [
                owner.file_keys[field_name],
                *([owner.earlier_defaults[field_name]] if field_name in owner.earlier_defaults else []),
            ]
            if _as_data(value) not in map(_as_data, no_option):
                flag = owner.flags.get(field_name, f"--{key}")
                raise UserError(f"{flag} ({key} in a job file) is {owner.title}'s: drop it for {chosen.title}")
    return found


def _as_data(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _job(
    args: argparse.Namespace, data: dict[str, Any], options: dict[str, Any], info: base.BackendInfo
) -> tuple[JobSpec, dict[str, Any]]:
    """The JobSpec: job file data, flags on top; then the command (a recipe is validated like `hpctrain train`
    would); and the backend's options as the backend completes them beside the job (info.complete_job)."""
    source = f"job file {args.job_file}" if args.job_file else "job"
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    for key in _JOB_FLAGS + _RESOURCE_FLAGS:
        value = getattr(args, key)
        if value is not None:
            data[key] = value
    if args.exclude_nodes:
        data["exclude_nodes"] = [
            node.strip() for item in args.exclude_nodes for node in item.split(",") if node.strip()
        ]
    if args.env:
        env = dict(data.get("env") or {}) if isinstance(data.get("env"), dict) else {}
        for item in args.env:
            key, sep, value = item.partition("=")
            if not sep:
                raise UserError(f"--setenv {item!r}: write NAME=VALUE")
            env[key] = value
        data["env"] = env
    data, options = info.complete_job(data, options, vars(args))  # e.g. Slurm's GRES split, environment, interpreter
    command = _command(args.job_command)
    if command:
        data["command"] = list(command)
    if not data.get("command"):
        raise UserError(
            "no command: add `train mnist [train options]` or `-- your command` (or `command:` in the job file)"
        )
    cmd = data["command"]
    is_recipe = isinstance(cmd, list) and all(isinstance(a, str) for a in cmd) and cmd[:2] == ["hpctrain", "train"]
    if is_recipe:
        if data.get("run_dir") is not None:
            raise UserError("--run-dir of a built-in recipe goes after the recipe: `train mnist --run-dir DIR`")
        data["run_dir"] = _recipe_run_dir(cmd[2:], info)
        if "name" not in data:  # squeue then says what runs, rather than "hpctrain"
            cfg = recipe_config(cmd[2:])
            data["name"] = f"{cfg.workload}-{cfg.dataset}"
    elif data.get("run_dir") is None and isinstance(data.get("name", "hpctrain"), str):
        data["run_dir"] = info.run_dir_pattern(f"runs/{_path_safe(data.get('name', 'hpctrain'))}")
    return from_mapping(data, source), options


def _command(rest: list[str]) -> tuple[str, ...]:
    if not rest:
        return ()
    if rest[0] == "--":
        return tuple(rest[1:])
    if rest[0] == "train":
        return ("hpctrain", *rest)
    raise UserError(
        f"unknown job option or recipe {rest[0]!r}: built-in recipes start with `train` (`train mnist ...`); "
        f"put your own command after `--` (`hpctrain submit [options] -- {shlex.join(rest)}`)"
    )


def _recipe_run_dir(train_argv: list[str], info: base.BackendInfo) -> str:
    """The run dir that the training inside the job will use, with %j for the job id (see config.default_run_dir),
    in the backend's pattern (where job ids are names, the name alone says what runs: runs/%j)."""
    cfg = recipe_config(train_argv)
    if cfg.run_dir is not None:
        return cfg.run_dir
    from hpctrain.config import default_run_dir

    return info.run_dir_pattern(default_run_dir(cfg, environ={}))


def recipe_config(train_argv: list[str]):
    """Validate a recipe's options exactly as `hpctrain train` will parse them in the job."""
    from hpctrain.recipes.train_options import config_from_argv

    cfg = config_from_argv(list(train_argv))
    if cfg.nproc is not None:
        raise UserError(
            "--nproc starts local processes; in a job use --nproc-per-node (and --nodes) of hpctrain submit"
        )
    from hpctrain.recipes import recipe_info

    recipe_info(cfg.workload, cfg.recipe)  # an unknown variant fails here, not after the job waited in the queue
    return cfg


def _path_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "job"
