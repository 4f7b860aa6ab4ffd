"""`hpctrain submit`: describe a job (flags and/or a job file), check it, render it, and queue it on the chosen
scheduler.

    hpctrain submit [job options] train mnist [train options]     # a built-in recipe
    hpctrain submit [job options] -- python my_train.py --lr 0.1   # any command
    hpctrain submit --scheduler NAME [its options] train mnist

One path for every scheduler, through hpctrain.schedulers.base.Scheduler: render, local_check (+ check), submit,
record, then `wait` for --wait/--follow. What differs per scheduler is the backend's: its BackendInfo adds its
flags, reads its job-file section, completes the job's defaults; its methods say what is said. The job options are
shared with `hpctrain check` (add_job_arguments / submission_from_args).
"""

from __future__ import annotations

import argparse
import shlex
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from hpctrain.cli.scheduling import (
    add_job_scheduler_arguments,
    backend_options,
    choose_scheduler,
    get_backend,
    refuse_foreign_flags,
)
from hpctrain.errors import UserError, redact
from hpctrain.jobs.mapping import from_mapping
from hpctrain.jobs.spec import ENVIRONMENT_KINDS, JobSpec, missing_prerequisites
from hpctrain.schedulers import SCHEDULERS, backend_info, base
from hpctrain.schedulers.job_sections import JobFile, read_job_file


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Job options; every one left out keeps the job file's value (or the default)."""
    g = parser.add_argument_group("job")
    g.add_argument("--job-file", metavar="PATH",
                   help="YAML or TOML job description, or a Kubernetes platform's key=value .params file; flags given here override it")
    g.add_argument("--job-name", "-J", dest="name", metavar="NAME", help="job name (default: hpctrain)")
    g.add_argument("--time", "-t", metavar="TIME", help="time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    g.add_argument("--exclude-nodes", dest="exclude_nodes", action="append", metavar="NODE[,NODE...]",
                   help="never run on these nodes, e.g. those a preflight found sick (Slurm: --exclude; Kubernetes: "
                        "a node affinity); repeatable")
    g.add_argument("--setenv", dest="env", action="append", metavar="NAME=VALUE", help="environment variable for the job (repeatable)")
    r = parser.add_argument_group("resources (per node; on Kubernetes per pod)")
    r.add_argument("--nodes", "-N", type=int, metavar="N", help="nodes (Slurm) or worker pods (Kubernetes)")
    r.add_argument("--nproc-per-node", "--ntasks-per-node", dest="nproc_per_node", type=int, metavar="N",
                   help="training processes per node (one per GPU)")
    r.add_argument("--gpus-per-node", type=int, metavar="N")
    r.add_argument("--gpu-type", metavar="TYPE", help="GPU type as sinfo shows it (gpu:TYPE:N)")
    r.add_argument("--gres", metavar="SPEC", help="gpu:N, gpu:TYPE:N or shard:N (a slice of a shared GPU)")
    r.add_argument("--cpus-per-task", "-c", type=int, metavar="N", help="CPUs per training process")
    r.add_argument("--mem", metavar="SIZE", help="memory per node, e.g. 16G")
    e = parser.add_argument_group("environment")
    e.add_argument("--env-kind", dest="kind", choices=ENVIRONMENT_KINDS,
                   help="where the command runs (default: inferred from --conda-env/--venv/--image/--module, else none)")
    e.add_argument("--module", dest="modules", action="append", metavar="NAME", help="`module load NAME` first (repeatable)")
    e.add_argument("--conda-env", metavar="NAME|PREFIX")
    e.add_argument("--venv", metavar="DIR")
    e.add_argument("--image", metavar="IMAGE",
                   help="Slurm: apptainer .sif, or enroot image for pyxis; Kubernetes: the container image of every pod")
    e.add_argument("--mount", dest="mounts", action="append", metavar="SRC[:DST]", help="container bind mount (repeatable)")
    e.add_argument("--container-workdir", dest="workdir", metavar="DIR")
    l = parser.add_argument_group("launch")
    l.add_argument("--run-dir", metavar="DIR", help="run directory of a command after -- (%%j = job id; default runs/NAME-%%j)")
    l.add_argument("--signal-grace", type=int, metavar="S", help="SIGUSR1 this many seconds before the time limit (default 120; 0: off)")
    l.add_argument("--max-hang-restarts", type=int, metavar="N",
                   help="new starts after hpctrain's hang watchdog ended an attempt (`train --hang-timeout`); it "
                   "resumes from its checkpoint (default 2; Slurm: needs the run directory)")
    l.add_argument("--max-restarts", type=int, metavar="N",
                   help="torchrun: restart the workers up to N times after one dies (default 0)")
    add_job_scheduler_arguments(parser)
    parser.add_argument("job_command", metavar="COMMAND", nargs=argparse.REMAINDER,
                        help="`train WORKLOAD [train options]` (`hpctrain train --help`), or `-- COMMAND ...` for your own program")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_job_arguments(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="check the job here (not against the cluster), print the sbatch command and script "
                             "(Slurm) or the manifest (Kubernetes); submit nothing")
    parser.add_argument("--wait", action="store_true", help="block until the job ends; exit with its exit status")
    parser.add_argument("--follow", action="store_true", help="--wait, and print the job's output as it grows "
                        "(Slurm: its --output file, from the first attempt on; `hpctrain logs -f JOB` does the same "
                        "for a job already queued)")
    parser.add_argument("--no-check", action="store_true", help="skip the checks against the live cluster")


_RESOURCE_FLAGS = ("nodes", "nproc_per_node", "gpus_per_node", "gpu_type", "gres", "cpus_per_task", "mem")
_JOB_FLAGS = ("name", "time", "run_dir", "signal_grace", "max_hang_restarts", "max_restarts")


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


def submission_from_args(args: argparse.Namespace, dry_run: bool = False, command_optional: bool = False) -> Submission:
    """Job file, then flags on top; the scheduler from --scheduler, the file or this machine. `command_optional`:
    without a command, the job runs PLACEHOLDER_COMMAND and says so (`resources_only`)."""
    job_file = read_job_file(args.job_file) if args.job_file else JobFile(job={})
    scheduler = choose_scheduler(args, job_file.scheduler, offline=dry_run)
    info = backend_info(scheduler)
    file_options = job_file.options
    if job_file.section is not None and job_file.section != scheduler:
        owner = backend_info(job_file.section)
        raise UserError(f"job file {args.job_file} holds {owner.title} options ({', '.join(sorted(file_options))}) "
                        f"but the job goes to {scheduler}: pass --scheduler {owner.name}, or remove them")
    refuse_foreign_flags(args, scheduler)
    data = dict(job_file.job)
    file_options = {**_top_level_options(args, data, scheduler), **file_options}
    options = backend_options(args, scheduler, file_options)
    resources_only = command_optional and not args.job_command and not data.get("command")
    if resources_only:
        data["command"] = list(PLACEHOLDER_COMMAND)
    job = _job(args, data, info)
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
            if _as_data(value) != _as_data(owner.file_keys[str(key).replace("-", "_")]):
                flag = owner.flags.get(str(key).replace("-", "_"), f"--{key}")
                raise UserError(f"{flag} ({key} in a job file) is {owner.title}'s: drop it for {chosen.title}")
    return found


def _as_data(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def job_from_args(args: argparse.Namespace) -> JobSpec:
    return submission_from_args(args, dry_run=getattr(args, "dry_run", False)).job


def _job(args: argparse.Namespace, data: dict[str, Any], info: base.BackendInfo) -> JobSpec:
    """The JobSpec: job file data, flags on top; then the command (a recipe is validated like `hpctrain train` would)."""
    source = f"job file {args.job_file}" if args.job_file else "job"
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    for key in _JOB_FLAGS + _RESOURCE_FLAGS:
        value = getattr(args, key)
        if value is not None:
            if key in ("gpus_per_node", "gpu_type") and "gres" in data:
                data.pop("gres")  # the flag replaces the file's GPU request
            if key == "gres":
                for k in ("gpus_per_node", "gpu_type", "shards_per_node"):
                    data.pop(k, None)
            data[key] = value
    if args.exclude_nodes:
        data["exclude_nodes"] = [node.strip() for item in args.exclude_nodes for node in item.split(",") if node.strip()]
    if args.env:
        env = dict(data.get("env") or {}) if isinstance(data.get("env"), dict) else {}
        for item in args.env:
            key, sep, value = item.partition("=")
            if not sep:
                raise UserError(f"--setenv {item!r}: write NAME=VALUE")
            env[key] = value
        data["env"] = env
    data = info.complete_job(data, vars(args))  # the environment its flags describe, the interpreter
    command = _command(args.job_command)
    if command:
        data["command"] = list(command)
    if not data.get("command"):
        raise UserError("no command: add `train mnist [train options]` or `-- your command` (or `command:` in the job file)")
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
    return from_mapping(data, source)


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
    from hpctrain.cli.train import config_from_argv

    cfg = config_from_argv(list(train_argv))
    if cfg.nproc is not None:
        raise UserError("--nproc starts local processes; in a job use --nproc-per-node (and --nodes) of hpctrain "
                        "submit")
    from hpctrain.recipes import recipe_info

    recipe_info(cfg.workload, cfg.recipe)  # an unknown variant fails here, not after the job waited in the queue
    return cfg


def _path_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "job"


def dry_run_notes(job: JobSpec, problems: list[str]) -> tuple[list[str], list[str]]:
    """Split a --dry-run's problems into those that make it exit 2 and notes: the image or venv made once before the
    first submit (an example's placeholder, or not pulled yet) and, while a venv is missing, the programs that only
    it would provide. A real submit and `hpctrain check` still refuse both."""
    missing = missing_prerequisites(job)
    if not missing:
        return problems, []
    venv_missing = job.environment.kind == "venv" and any(m.startswith("venv ") for m in missing)
    noted = [p for p in problems if p in missing or (venv_missing and "is not on the PATH the job will have" in p)]
    notes = [f"note: {p} (a real submit refuses until then)" for p in noted]
    return [p for p in problems if p not in noted], notes


def job_warnings(job: JobSpec, recipe: Any = None) -> list[str]:
    """What is allowed but most likely not meant: a built-in recipe's --synthetic epoch on CPUs (hours)."""
    r = job.resources
    if recipe is None or r.gpus_per_node or r.shards_per_node:
        return []
    from hpctrain.recipes import synthetic_cpu_warning

    processes = r.nodes * r.nproc_per_node  # a single-process launcher asks for 1 x 1
    warning = synthetic_cpu_warning(recipe, processes * r.cpus_per_task)
    return [warning] if warning else []


def report_problems(command: str, problems: list[str]) -> None:
    for line in problems:
        print(f"hpctrain {command}: {redact(line)}", file=sys.stderr)


def report_warnings(command: str, job: JobSpec, recipe: Any = None) -> None:
    for line in job_warnings(job, recipe):
        print(f"hpctrain {command}: warning: {redact(line)}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    submission = submission_from_args(args, dry_run=args.dry_run)
    job = submission.job
    sched = get_backend(args, submission.scheduler, submission.options)
    rendered = sched.render(job)  # pure; what it cannot express fails here, before anything is sent
    report_warnings("submit", job, submission.recipe)
    from hpctrain.recipes import check_data  # run by the backend where it sees the data (it may not import it)

    problems = sched.local_check(job, submission.recipe, check_data=check_data)
    if args.dry_run:
        # The script or manifest is shown whatever the checks say (it is what the user asked to read); the exit
        # status is a real submit's verdict on everything that can be checked without the cluster.
        sys.stdout.write(redact(rendered.preview or rendered.text))  # the files keep the values: they are 0600
        problems, notes = dry_run_notes(job, problems)
        verdict = ["a real submit would refuse this job (exit status 2)"] if base.blocking(problems) else []
        report_problems("submit", problems + verdict + notes + [sched.dry_run_note])
        return 2 if verdict else 0
    cluster = [] if args.no_check else sched.check(job)
    # Warnings, and what the job will do at its time limit; notes on checks that could not run are `check`'s to say.
    report_problems("submit", [p for p in problems + cluster if p.startswith((base.WARNING_PREFIX, base.TIME_LIMIT_NOTE))])
    if blocking := base.blocking(problems + cluster):
        hint = " (fix the above, or pass --no-check to skip the cluster checks)" if base.blocking(cluster) else " (fix the above)"
        report_problems("submit", blocking + ["nothing was submitted" + hint])
        return 2
    job_id = sched.submit(job, rendered)
    said = sched.record(job, rendered, job_id, _description(submission))
    print(job_id, flush=True)
    report_problems("submit", said)
    if not (args.wait or args.follow):
        return 0
    return wait(sched, job_id, "submit", follow=args.follow)


def _description(submission: Submission) -> dict[str, Any]:
    """job.yaml: the job as a job file (resubmit with --job-file), with the backend's options in its section."""
    description = submission.job.to_dict()
    if submission.job.is_recipe:
        del description["run_dir"]  # derived from the recipe's options; a job file must not repeat it
    description["scheduler"] = submission.scheduler
    if submission.options:
        description[submission.scheduler] = {k: list(v) if isinstance(v, tuple) else v
                                             for k, v in submission.options.items()}
    return description


def wait(sched: Any, job_id: str, command: str, follow: bool = False, poll_s: float = 2.0) -> int:
    """Poll `status` until the job ends, saying each change on stderr; with `follow`, copy the job's output to
    stdout meanwhile (where the backend can follow a queued job). The job's exit status: its own, else the last
    non-zero one a replica showed while it ran (a Kubernetes job's pods may be deleted as it fails); 1 when it did not
    succeed and none is known, said so."""
    follower = None
    if follow:
        note = sched.follow_note(job_id)
        if note:
            report_problems(command, [note])
        else:
            follower = threading.Thread(target=_copy_output, args=(sched, job_id, command), daemon=True)
            follower.start()
    last: tuple[str, int] | None = None
    seen: int | None = None  # the last non-zero exit code a replica showed: its pods may go with the job's end
    while True:
        try:
            status = sched.status(job_id)
        except base.JobNotFound:
            if last is None:
                raise
            print(f"hpctrain {command}: job {job_id} is gone (deleted before it ended)", file=sys.stderr)
            return 1
        seen = next((r.exit_code for r in status.replicas if r.exit_code), seen)
        if (status.shown_state, status.restarts) != last:
            print(f"hpctrain {command}: job {job_id} {sched.progress(status)}", file=sys.stderr, flush=True)
            last = (status.shown_state, status.restarts)
        if status.finished:
            break
        time.sleep(poll_s)
    if follower is not None:
        follower.join()  # the follower reads the rest once it sees the job ended
    code = status.exit_code
    if not code and status.state != base.SUCCEEDED:
        code = seen or code
    if code is None and status.state != base.SUCCEEDED:
        print(f"hpctrain {command}: job {job_id} ended {status.shown_state}; hpctrain could not learn its exit status "
              "(its processes' records are gone and the scheduler kept none): exiting with 1", file=sys.stderr)
        return 1
    code = code or (0 if status.state == base.SUCCEEDED else 1)
    print(f"hpctrain {command}: job {job_id} ended {status.shown_state} with exit status {code}", file=sys.stderr)
    return code


def _copy_output(sched: Any, job_id: str, command: str) -> None:
    try:
        for line in sched.logs(job_id, follow=True):
            print(line, flush=True)
    except UserError as err:
        report_problems(command, [f"warning: {err}"])
