"""`hpctrain submit`: describe a job (flags and/or a job file), check it, render it, and queue it with sbatch.

    hpctrain submit [job options] train mnist [train options]     # a built-in recipe
    hpctrain submit [job options] -- python my_train.py --lr 0.1   # any command

The job options are shared with `hpctrain check` (add_job_arguments / job_from_args).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.jobs import load_job_file
from hpctrain.jobs.spec import (
    ENVIRONMENT_KINDS,
    LAUNCHERS,
    JobSpec,
    from_mapping,
    local_problems,
    mem_warning,
)


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Job options; every one left out keeps the job file's value (or the default)."""
    g = parser.add_argument_group("job")
    g.add_argument("--job-file", metavar="PATH", help="YAML or TOML job description; flags given here override it")
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
    r = parser.add_argument_group("resources (per node)")
    r.add_argument("--nodes", "-N", type=int, metavar="N")
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
    e.add_argument("--image", metavar="IMAGE", help="apptainer .sif, or enroot image for pyxis")
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
    parser.add_argument("job_command", metavar="COMMAND", nargs=argparse.REMAINDER,
                        help="`train RECIPE [train options]`, or `-- COMMAND ...` for your own program")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_job_arguments(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="check the job here (not against the cluster), print the sbatch command and the script; submit nothing")
    parser.add_argument("--wait", action="store_true", help="block until the job ends; exit with its exit status")
    parser.add_argument("--no-check", action="store_true", help="skip the checks against the live cluster")


_RESOURCE_FLAGS = ("nodes", "nproc_per_node", "gpus_per_node", "gpu_type", "gres", "cpus_per_task", "mem")
_JOB_FLAGS = ("name", "partition", "account", "qos", "time", "output", "error", "launcher", "run_dir", "rdzv_port",
              "signal_grace", "max_requeues", "max_preemptions", "max_restarts")
_ENV_FLAGS = ("kind", "modules", "conda_env", "venv", "image", "mounts", "workdir")


def job_from_args(args: argparse.Namespace) -> JobSpec:
    """Job file, then flags on top; then the command (a recipe is validated like `hpctrain train` would)."""
    data: dict[str, Any] = load_job_file(args.job_file) if args.job_file else {}
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
        data["run_dir"] = _recipe_run_dir(cmd[2:])
        if "name" not in data:  # squeue then says what runs, rather than "hpctrain"
            cfg = recipe_config(cmd[2:])
            data["name"] = f"{cfg.workload}-{cfg.dataset}"
    elif data.get("run_dir") is None and isinstance(data.get("name", "hpctrain"), str):
        data["run_dir"] = f"runs/{_path_safe(data.get('name', 'hpctrain'))}-%j"
    if _environment_kind(data.get("environment")) == "none" and data.get("python") is None:
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


def _recipe_run_dir(train_argv: list[str]) -> str:
    """The run dir that the training inside the job will use, with %j for the job id (see config.default_run_dir)."""
    cfg = recipe_config(train_argv)
    if cfg.run_dir is not None:
        return cfg.run_dir
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
    from hpctrain.schedulers.slurm.checks import check_here
    from hpctrain.schedulers.slurm.scheduler import requirements

    problems = local_problems(job)
    if job.is_recipe:
        from hpctrain.data import find_dataset_files, get_dataset_spec

        cfg = recipe_config(list(job.command[2:]))
        try:
            find_dataset_files(get_dataset_spec(cfg.dataset), cfg.data_dir)
        except UserError as err:
            problems.append(str(err))
        r = job.resources
        if cfg.device == "cuda" and not (r.gpus_per_node or r.shards_per_node):
            problems.append("train --device cuda, but the job asks for no GPUs: add --gpus-per-node N "
                            "(or --gres shard:N), or train with --device cpu")
    problems += check_here(requirements(job))
    problems += program_problems(job, environ)
    return problems


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
    from hpctrain.schedulers.slurm import render as slurm

    job = job_from_args(args)
    script = slurm.render_sbatch(job)
    report_warnings("submit", job)
    problems = local_check(job)
    if args.dry_run:
        # The script is shown whatever the checks say (it is what the user asked to read); the exit status is a
        # real submit's verdict on everything that can be checked without the cluster.
        sys.stdout.write(slurm.dry_run_text(job, script))
        verdict = ["a real submit would refuse this job (exit status 2)"] if problems else []
        report_problems("submit", problems + verdict + [SKIPPED_IN_DRY_RUN])
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
    if not args.wait:
        return 0
    from hpctrain.schedulers.slurm.jobs import wait_for_job

    def show(info) -> None:
        why = f" ({info.reason})" if info.pending and info.reason and info.reason != "None" else ""
        again = f", attempt {info.restarts + 1}" if info.restarts else ""
        print(f"hpctrain submit: job {job_id} {info.state}{why}{again}", file=sys.stderr, flush=True)

    info = wait_for_job(job_id, on_change=show)
    code = info.exit_code if info.exit_code is not None else 1
    if code == 0 and str(info.state).upper() != "COMPLETED":
        code = 1
    print(f"hpctrain submit: job {job_id} ended {info.state} with exit status {code}", file=sys.stderr)
    return code


def _record(run_dir: Path, job: JobSpec, script: str) -> None:
    """Keep what was submitted beside the run's results (provenance; resubmit with --job-file job.yaml)."""
    import yaml

    from hpctrain.schedulers.slurm.render import write_script

    description = job.to_dict()
    if job.is_recipe:
        del description["run_dir"]  # derived from the recipe's options; a job file must not repeat it
    run_dir.mkdir(parents=True, exist_ok=True)
    write_script(run_dir / "job.sbatch", script)
    (run_dir / "job.yaml").write_text(yaml.safe_dump(description, sort_keys=False), encoding="utf-8")
