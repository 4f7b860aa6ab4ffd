"""`hpctrain submit`: describe a job (flags and/or a job file), check it, render it, and queue it on Slurm (sbatch)
or Kubernetes (a Kubeflow PyTorchJob or TrainJob).

    hpctrain submit [job options] train mnist [train options]     # a built-in recipe
    hpctrain submit [job options] -- python my_train.py --lr 0.1   # any command
    hpctrain submit --scheduler kubernetes --image IMG [...] train mnist

The job options are shared with `hpctrain check` (add_job_arguments / submission_from_args).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.cli.scheduling import (
    KUBERNETES_JOB_FLAGS,
    add_kubernetes_job_arguments,
    choose_scheduler,
    get_backend,
    kubernetes_fields,
    refuse_foreign_flags,
)
from hpctrain.errors import UserError, redact
from hpctrain.jobs import JobFile, read_job_file
from hpctrain.jobs.spec import (
    ENVIRONMENT_KINDS,
    LAUNCHERS,
    JobSpec,
    from_mapping,
    local_problems,
    mem_warning,
    missing_prerequisites,
)

# dest -> flag: what only Slurm understands (given with --scheduler kubernetes: an error naming the fix).
SLURM_ONLY_FLAGS = {
    "partition": "--partition", "account": "--account", "qos": "--qos", "output": "--output", "error": "--error",
    "sbatch_extra": "--sbatch", "gpu_type": "--gpu-type", "gres": "--gres", "kind": "--env-kind", "modules": "--module",
    "conda_env": "--conda-env", "venv": "--venv", "mounts": "--mount", "workdir": "--container-workdir",
    "launcher": "--launcher", "rdzv_port": "--rdzv-port", "max_requeues": "--max-requeues",
    "max_preemptions": "--max-preemptions",
}


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Job options; every one left out keeps the job file's value (or the default)."""
    g = parser.add_argument_group("job")
    g.add_argument("--job-file", metavar="PATH",
                   help="YAML or TOML job description, or a Kubernetes platform's key=value .params file; flags given here override it")
    g.add_argument("--job-name", "-J", dest="name", metavar="NAME", help="job name (default: hpctrain)")
    g.add_argument("--partition", "-p", metavar="NAME")
    g.add_argument("--account", "-A", metavar="NAME")
    g.add_argument("--qos", "-q", metavar="NAME")
    g.add_argument("--time", "-t", metavar="TIME", help="time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    g.add_argument("--output", "-o", metavar="PATTERN", help="output file (sbatch --output; %%j = job id)")
    g.add_argument("--error", "-e", metavar="PATTERN", help="error file (default: with the output)")
    g.add_argument("--sbatch", dest="sbatch_extra", action="append", metavar="OPTION",
                   help="extra sbatch option for an #SBATCH line, e.g. --sbatch=--exclusive (repeatable)")
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
    l.add_argument("--launcher", choices=LAUNCHERS,
                   help="torchrun: one torchrun per node; srun: one task per process; single: one process (default: torchrun)")
    l.add_argument("--run-dir", metavar="DIR", help="run directory of a command after -- (%%j = job id; default runs/NAME-%%j)")
    l.add_argument("--rdzv-port", type=int, metavar="PORT", help="torchrun rendezvous port (default: a free one)")
    l.add_argument("--signal-grace", type=int, metavar="S", help="SIGUSR1 this many seconds before the time limit (default 120; 0: off)")
    l.add_argument("--max-requeues", type=int, metavar="N", help="requeues after time-limit warnings (default 3)")
    l.add_argument("--max-preemptions", type=int, metavar="N",
                   help="new starts after Slurm requeued the job itself: preemption, node failure (default 10)")
    l.add_argument("--max-restarts", type=int, metavar="N",
                   help="torchrun: restart the workers up to N times after one dies (default 0)")
    add_kubernetes_job_arguments(parser)
    parser.add_argument("job_command", metavar="COMMAND", nargs=argparse.REMAINDER,
                        help="`train RECIPE [train options]`, or `-- COMMAND ...` for your own program")


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
_JOB_FLAGS = ("name", "partition", "account", "qos", "time", "output", "error", "launcher", "run_dir", "rdzv_port",
              "signal_grace", "max_requeues", "max_preemptions", "max_restarts")
_ENV_FLAGS = ("kind", "modules", "conda_env", "venv", "image", "mounts", "workdir")


@dataclass(frozen=True)
class Submission:
    """What the flags and the job file ask for: the neutral job, the scheduler, and that scheduler's options."""

    job: JobSpec
    scheduler: str
    kubernetes: dict[str, Any] = field(default_factory=dict)
    """KubernetesOptions fields (the job file's, then the flags'); empty for Slurm."""


def submission_from_args(args: argparse.Namespace, dry_run: bool = False) -> Submission:
    """Job file, then flags on top; the scheduler from --scheduler, the file or this machine."""
    job_file = read_job_file(args.job_file) if args.job_file else JobFile(job={})
    scheduler = choose_scheduler(args, job_file.scheduler, fallback="slurm" if dry_run else None)
    if job_file.kubernetes and scheduler != "kubernetes":
        raise UserError(f"job file {args.job_file} holds Kubernetes options ({', '.join(sorted(job_file.kubernetes))}) "
                        f"but the job goes to {scheduler}: pass --scheduler kubernetes, or remove them")
    refuse_foreign_flags(args, scheduler, SLURM_ONLY_FLAGS, KUBERNETES_JOB_FLAGS)
    options: dict[str, Any] = {}
    if scheduler == "kubernetes":
        options = kubernetes_fields(args, KUBERNETES_JOB_FLAGS, job_file.kubernetes)
        if args.image is not None:
            options["image"] = args.image
    job = _job(args, dict(job_file.job), scheduler)
    return Submission(job=job, scheduler=scheduler, kubernetes=options)


def job_from_args(args: argparse.Namespace) -> JobSpec:
    return submission_from_args(args, dry_run=getattr(args, "dry_run", False)).job


def _job(args: argparse.Namespace, data: dict[str, Any], scheduler: str) -> JobSpec:
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
    if args.sbatch_extra:
        data["sbatch_extra"] = list(args.sbatch_extra)
    if args.env:
        env = dict(data.get("env") or {}) if isinstance(data.get("env"), dict) else {}
        for item in args.env:
            key, sep, value = item.partition("=")
            if not sep:
                raise UserError(f"--setenv {item!r}: write NAME=VALUE")
            env[key] = value
        data["env"] = env
    if scheduler == "slurm":  # on Kubernetes --image is the pods' image (KubernetesOptions), the only environment
        data["environment"] = _environment_data(data.get("environment"), args)
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
        data["run_dir"] = _recipe_run_dir(cmd[2:], scheduler)
        if "name" not in data:  # squeue then says what runs, rather than "hpctrain"
            cfg = recipe_config(cmd[2:])
            data["name"] = f"{cfg.workload}-{cfg.dataset}"
    elif data.get("run_dir") is None and scheduler == "kubernetes":
        data["run_dir"] = "runs/%j"  # %j is the job name there, unique in its namespace
    elif data.get("run_dir") is None and isinstance(data.get("name", "hpctrain"), str):
        data["run_dir"] = f"runs/{_path_safe(data.get('name', 'hpctrain'))}-%j"
    if scheduler == "slurm" and _environment_kind(data.get("environment")) == "none" and data.get("python") is None:
        # The job runs hpctrain and torchrun with this interpreter: a venv called by path, not activated, works.
        data["python"] = os.path.abspath(sys.executable)
    return from_mapping(data, source)


def _environment_kind(value: Any) -> Any:
    return value if isinstance(value, str) else dict(value or {}).get("kind", "none")


def _environment_data(file_value: Any, args: argparse.Namespace) -> Any:
    given = {k: getattr(args, k) for k in _ENV_FLAGS if getattr(args, k) is not None}
    if not given:
        return file_value
    env = {"kind": file_value} if isinstance(file_value, str) else dict(file_value or {})
    env = {str(k).replace("-", "_"): v for k, v in env.items()}
    env.update(given)
    if "kind" not in given and env.get("kind", "none") == "none":
        env["kind"] = _infer_kind(env)
    return env


def _infer_kind(env: dict[str, Any]) -> str:
    if env.get("conda_env"):
        return "conda"
    if env.get("venv"):
        return "venv"
    if env.get("image"):
        from hpctrain.images import docker_pull_hint

        hint = docker_pull_hint(str(env["image"]))
        if hint:
            raise UserError(hint)
        if str(env["image"]).endswith(".sif"):
            return "apptainer"
        raise UserError(f"--image {env['image']!r}: say which runtime with --env-kind apptainer or --env-kind pyxis")
    if env.get("modules"):
        return "modules"
    return "none"


def _command(rest: list[str]) -> tuple[str, ...]:
    if not rest:
        return ()
    if rest[0] == "--":
        return tuple(rest[1:])
    if rest[0] == "train":
        return ("hpctrain", *rest)
    raise UserError(
        f"unknown job option or recipe {rest[0]!r}: built-in recipes start with `train` (`train mnist ...`); "
        f"put your own command after `--` (`hpctrain submit [options] -- {' '.join(rest)}`)"
    )


def _recipe_run_dir(train_argv: list[str], scheduler: str | None) -> str:
    """The run dir that the training inside the job will use, with %j for the job id (see config.default_run_dir).
    On Kubernetes the job name already says what runs (and is unique in its namespace): runs/JOBNAME."""
    cfg = recipe_config(train_argv)
    if cfg.run_dir is not None:
        return cfg.run_dir
    if scheduler == "kubernetes":
        return "runs/%j"
    from hpctrain.config import default_run_dir

    return default_run_dir(cfg, environ={}) + "-%j"


def recipe_config(train_argv: list[str]):
    """Validate a recipe's options exactly as `hpctrain train` will parse them in the job."""
    from hpctrain.cli.train import config_from_argv

    cfg = config_from_argv(list(train_argv))
    if cfg.nproc is not None:
        raise UserError("--nproc starts local processes; in a Slurm job use --nproc-per-node (and --nodes) of hpctrain submit")
    from hpctrain.recipes import get_recipe

    get_recipe(cfg.workload, cfg.recipe)  # an unknown variant fails here, not after the job waited in the queue
    return cfg


def _path_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "job"


def local_check(job: JobSpec, environ: Mapping[str, str] = os.environ) -> list[str]:
    """Every problem visible without the cluster: missing image/venv/script, a recipe whose dataset is not in its
    data dir or that wants CUDA without GPUs, a command the job will not find on its PATH."""
    from hpctrain.recipes import get_recipe
    from hpctrain.schedulers.slurm.checks import check_here
    from hpctrain.schedulers.slurm.scheduler import requirements

    problems = local_problems(job)
    if job.is_recipe:
        cfg = recipe_config(list(job.command[2:]))
        try:
            get_recipe(cfg.workload, cfg.recipe).check_data(cfg)
        except UserError as err:
            problems.append(str(err))
        r = job.resources
        if cfg.device == "cuda" and not (r.gpus_per_node or r.shards_per_node):
            problems.append("train --device cuda, but the job asks for no GPUs: add --gpus-per-node N "
                            "(or --gres shard:N), or train with --device cpu")
    problems += check_here(requirements(job))
    problems += program_problems(job, environ)
    return problems


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


def program_problems(job: JobSpec, environ: Mapping[str, str]) -> list[str]:
    """Programs the job starts by name that its PATH will not have. sbatch passes this shell's PATH on to the job
    (plus --setenv PATH, plus the venv's or conda prefix's bin/); with modules or a container, nothing is known."""
    from hpctrain.schedulers.slurm.environments import get_environment

    problems = []
    if job.python is not None and not os.access(os.path.expanduser(job.python), os.X_OK):
        problems.append(f"python {job.python} is not an executable here, so the job cannot start it either; fix the "
                        "path, or remove python from the job file to run with the Python that submits")
    dirs = get_environment(job.environment).search_path(dict(job.env).get("PATH", environ.get("PATH", os.defpath)))
    if dirs is None:
        return problems
    names = ["torchrun"] if job.launcher == "torchrun" and job.python is None else []
    first = job.command[0]
    if "/" not in first and not (first == "hpctrain" and job.python is not None):
        names.append(first)
    search = os.pathsep.join(os.path.expanduser(d) for d in dirs)
    for name in dict.fromkeys(names):
        if shutil.which(name, path=search) is not None:
            continue
        if name.startswith("python"):
            fix = f"name the interpreter by its absolute path (e.g. -- {sys.executable} ...)"
        elif job.environment.kind == "none":
            fix = ("activate the environment that has it before submitting, name that environment (--venv DIR or "
                   "--conda-env), or give the program's absolute path")
        else:
            fix = "install it into that environment, or give the program's absolute path"
        where = "this shell's PATH, which sbatch passes on" if job.environment.kind == "none" else (
            f"{dirs[0]} and this shell's PATH")
        problems.append(f"`{name}` is not on the PATH the job will have ({where}), so the job would fail with "
                        f"`execve(): {name}: No such file or directory`; {fix}")
    return problems


def cluster_check(job: JobSpec) -> list[str]:
    """Ask the live cluster whether it can run the job (hpctrain.schedulers.slurm.checks)."""
    from hpctrain.schedulers import get_scheduler

    return get_scheduler("slurm").check(job)


def job_warnings(job: JobSpec) -> list[str]:
    """What is allowed but most likely not meant."""
    return [w for w in (mem_warning(job.resources.mem),) if w]


SKIPPED_IN_DRY_RUN = ("--dry-run skipped the checks that need the live cluster (partition, time limit, nodes and their "
                      "GPUs, CPUs and memory); `hpctrain check` with the same options runs them")


def report_problems(command: str, problems: list[str]) -> None:
    for line in problems:
        print(f"hpctrain {command}: {line}", file=sys.stderr)


def report_warnings(command: str, job: JobSpec) -> None:
    for line in job_warnings(job):
        print(f"hpctrain {command}: warning: {line}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    submission = submission_from_args(args, dry_run=args.dry_run)
    if submission.scheduler == "slurm":
        return _run_slurm(args, submission.job)
    return _run_backend(args, submission)


def _run_slurm(args: argparse.Namespace, job: JobSpec) -> int:
    from hpctrain.schedulers.slurm import render as slurm

    script = slurm.render_sbatch(job)
    report_warnings("submit", job)
    problems = local_check(job)
    if args.dry_run:
        # The script is shown whatever the checks say (it is what the user asked to read); the exit status is a
        # real submit's verdict on everything that can be checked without the cluster.
        sys.stdout.write(redact(slurm.dry_run_text(job, script)))  # the files keep the values: they are 0600
        problems, notes = dry_run_notes(job, problems)
        verdict = ["a real submit would refuse this job (exit status 2)"] if problems else []
        report_problems("submit", problems + verdict + notes + [SKIPPED_IN_DRY_RUN])
        return 2 if problems else 0
    if not args.no_check:
        problems += (cluster_problems := cluster_check(job))
    else:
        cluster_problems = []
    if problems:
        hint = " (fix the above, or pass --no-check to skip the cluster checks)" if cluster_problems else " (fix the above)"
        report_problems("submit", problems + ["nothing was submitted" + hint])
        return 2
    job_id = slurm.submit(job, script)
    run_dir = Path(job.run_dir.replace("%j", job_id)) if job.run_dir else None
    if run_dir is not None:
        _record(run_dir, job, script)
    print(job_id, flush=True)
    where = f"; script and job description in {run_dir}/" if run_dir else ""
    print(f"hpctrain submit: job {job_id} queued{where}", file=sys.stderr, flush=True)
    if not (args.wait or args.follow):
        return 0
    from hpctrain.schedulers.slurm.jobs import wait_for_job

    def show(info) -> None:
        why = f" ({info.reason})" if info.pending and info.reason and info.reason != "None" else ""
        again = f", attempt {info.restarts + 1}" if info.restarts else ""
        print(f"hpctrain submit: job {job_id} {info.state}{why}{again}", file=sys.stderr, flush=True)

    if args.follow:
        _follow_slurm_job(job_id, show)
    info = wait_for_job(job_id, on_change=None if args.follow else show)
    code = info.exit_code if info.exit_code is not None else 1
    if code == 0 and str(info.state).upper() != "COMPLETED":
        code = 1
    print(f"hpctrain submit: job {job_id} ended {info.state} with exit status {code}", file=sys.stderr)
    return code


def _follow_slurm_job(job_id: str, show: Any) -> None:
    """Copy the job's output file to stdout as it grows until the job ends, saying each state change on stderr."""
    from hpctrain.schedulers.slurm.jobs import get_job
    from hpctrain.schedulers.slurm.output import follow, output_candidates

    seen: list[tuple[str, int]] = []
    first = get_job(job_id)
    target = output_candidates(job_id, first, "stdout")[0]

    def finished() -> bool:
        info = get_job(job_id)
        if info is None:
            return True
        if not seen or seen[-1] != (info.state, info.restarts):
            seen.append((info.state, info.restarts))
            show(info)
        return info.finished

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    follow(target, write, finished)


KUBERNETES_DRY_RUN_NOTE = ("--dry-run checked the job here and skipped the checks that need the live cluster "
                           "(namespace, node room, quota, volumes, CRD); `hpctrain check --scheduler kubernetes` with the "
                           "same options runs them")


def _run_backend(args: argparse.Namespace, submission: Submission) -> int:
    """Kubernetes (and any backend whose CLI needs nothing of its own): render, check, submit through the
    Scheduler interface."""
    from hpctrain.schedulers import base

    job = submission.job
    sched = get_backend(args, submission.scheduler, submission.kubernetes)
    rendered = sched.render(job)  # pure; what it cannot express fails here, before anything is sent
    report_warnings("submit", job)
    if args.dry_run:
        sys.stdout.write(redact(rendered.text))  # URL passwords (--setenv HTTPS_PROXY=...) stay off the screen
        problems = sched.local_check(job) if hasattr(sched, "local_check") else []
        verdict = ["a real submit would refuse this job (exit status 2)"] if base.blocking(problems) else []
        report_problems("submit", problems + verdict + [KUBERNETES_DRY_RUN_NOTE])
        return 2 if verdict else 0
    local = sched.local_check(job) if hasattr(sched, "local_check") else []
    if base.blocking(local):
        report_problems("submit", base.blocking(local) + ["nothing was submitted (fix the above)"])
        return 2
    if not args.no_check:
        problems = sched.check(job)
        report_problems("submit", [p for p in problems if p.startswith(base.WARNING_PREFIX)])
        if blocking := base.blocking(problems):
            report_problems("submit", blocking + ["nothing was submitted (fix the above, or pass --no-check to skip "
                                                  "the cluster checks)"])
            return 2
    job_id = sched.submit(job, rendered)
    where = _record_rendered(job, rendered, submission, sched)
    print(job_id, flush=True)
    print(f"hpctrain submit: {rendered.payload['kind'] if isinstance(rendered.payload, dict) else 'job'} {job_id} "
          f"created in namespace {sched.namespace}{where}", file=sys.stderr, flush=True)
    if hasattr(sched, "command"):  # the flags that find it again, whatever the defaults are later
        print(f"hpctrain submit: follow it with `{sched.command('status', job_id)}` (and logs, cancel)",
              file=sys.stderr, flush=True)
    if args.follow:
        print(f"hpctrain submit: --follow prints Slurm jobs' output; here it waits like --wait (the log: "
              f"`{sched.command('logs', job_id)} -f`)", file=sys.stderr, flush=True)
    if not (args.wait or args.follow):
        return 0
    return wait_and_report(sched, job_id, "submit")


def wait_and_report(sched: Any, job_id: str, command: str, poll_s: float = 2.0) -> int:
    """Poll `status` until the job ends, saying each change; the job's exit status (1 when it did not succeed
    and none is known)."""
    from hpctrain.schedulers import base

    last: tuple[str, int] | None = None
    while True:
        try:
            status = sched.status(job_id)
        except base.JobNotFound:
            if last is None:
                raise
            print(f"hpctrain {command}: job {job_id} is gone (deleted before it ended)", file=sys.stderr)
            return 1
        if (status.state, status.restarts) != last:
            why = f" ({'; '.join(status.pending_reasons)})" if status.pending_reasons else ""
            again = f", {status.restarts} restart(s)" if status.restarts else ""
            print(f"hpctrain {command}: job {job_id} {status.state}{why}{again}", file=sys.stderr, flush=True)
            last = (status.state, status.restarts)
        if status.finished:
            break
        time.sleep(poll_s)
    code = status.exit_code if status.exit_code is not None else (0 if status.state == base.SUCCEEDED else 1)
    if code == 0 and status.state != base.SUCCEEDED:
        code = 1
    print(f"hpctrain {command}: job {job_id} ended {status.state} with exit status {code}", file=sys.stderr)
    return code


def _record_rendered(job: JobSpec, rendered: Any, submission: Submission, sched: Any) -> str:
    """Keep the manifest and the job description (job.yaml; resubmit with --job-file) in the run directory, where
    it is really visible here: a relative run dir (recorded in this directory), or one on a --volume whose path
    this machine sees too (a host: volume's host path). Never at a container path that does not exist here.
    Both files hold the --setenv values: readable by the owner only. Returns a note for the submit message."""
    import yaml

    from hpctrain.fsutil import write_atomic

    if job.run_dir is None:
        return ""
    pod_path = job.run_dir.replace("%j", job.name)
    if pod_path.startswith("/"):
        here, why = sched.path_here(pod_path)
        if here is None:
            return (f"; the manifest and job description were not recorded here ({why}): "
                    f"`kubectl get {rendered.payload['kind'].lower()} -n {sched.namespace} {job.name} -o yaml` shows them")
        directory = Path(here)
    else:
        directory = Path(pod_path)
    description = job.to_dict()
    if job.is_recipe:
        del description["run_dir"]  # derived from the recipe's options; a job file must not repeat it
    description["scheduler"] = submission.scheduler
    description["kubernetes"] = {k: list(v) if isinstance(v, tuple) else v for k, v in submission.kubernetes.items()}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_atomic(directory / rendered.filename, rendered.text.encode(), mode=0o600)
        write_atomic(directory / "job.yaml", yaml.safe_dump(description, sort_keys=False).encode(), mode=0o600)
    except OSError as err:
        print(f"hpctrain submit: warning: could not record the manifest in {directory} ({err.strerror or err}); "
              f"`kubectl get -o yaml` shows what was created", file=sys.stderr)
        return ""
    seen = f" (the pods' {pod_path})" if pod_path.startswith("/") and str(directory) != pod_path else ""
    return f"; manifest and job description in {directory}/{seen}"


def _record(run_dir: Path, job: JobSpec, script: str) -> None:
    """Keep what was submitted beside the run's results (provenance; resubmit with --job-file job.yaml)."""
    import yaml

    from hpctrain.schedulers.slurm.render import write_script

    description = job.to_dict()
    if job.is_recipe:
        del description["run_dir"]  # derived from the recipe's options; a job file must not repeat it
    run_dir.mkdir(parents=True, exist_ok=True)
    write_script(run_dir / "job.sbatch", script)
    from hpctrain.fsutil import write_atomic

    write_atomic(run_dir / "job.yaml", yaml.safe_dump(description, sort_keys=False).encode(), mode=0o600)  # --setenv values
