"""The checks of a Slurm job on the submit host: what the login node can tell because it shares the nodes' file
system and (through sbatch) passes on its PATH. `submit`, `submit --dry-run`, `submit --no-check` and `check` run
them (SlurmScheduler.local_check); checks.py holds those against the live cluster.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers.base import TIME_LIMIT_NOTE, Prerequisite
from hpctrain.schedulers.slurm.checks.live import Requirements, check_here
from hpctrain.schedulers.slurm.batch.environments import get_environment
from hpctrain.schedulers.slurm.checks.interpreter import interpreter_problems
from hpctrain.schedulers.slurm.batch.options import SlurmOptions, for_job, uses_gpus


def local_check(
    job: JobSpec,
    options: SlurmOptions,
    requirements: Requirements,
    recipe: Any = None,
    environ: Mapping[str, str] = os.environ,
    check_data: Callable[[Any], None] | None = None,
) -> list[str]:
    """Every problem visible without the cluster: missing image/venv/script or output directory, a recipe
    (`recipe`, its TrainConfig) whose dataset is not in its data dir (`check_data`: the recipes' data check,
    hpctrain.recipes.check_data) or that wants CUDA without GPUs, a command the job will not find on its PATH."""
    missing = [Prerequisite(p) for p in missing_prerequisites(options)]
    problems = missing + output_problems(options)
    if recipe is not None:
        try:
            if check_data is not None:
                check_data(recipe)
        except UserError as err:
            problems.append(str(err))
        problems += earlier_run_problems(job, recipe)
        if recipe.device == "cuda" and not uses_gpus(job, options):
            problems.append(
                "train --device cuda, but the job asks for no GPUs: add --gpus-per-node N "
                "(or --gres shard:N), or train with --device cpu"
            )
    problems += check_here(requirements)
    # while the venv is yet to be made, the programs it would provide are missing with it
    problems += program_problems(
        job, environ, options, venv_missing=options.environment.kind == "venv" and bool(missing)
    )
    return problems + warning_note(job, options, requirements.paths)


def missing_prerequisites(options: SlurmOptions) -> list[str]:
    """The job's environment made once before the first submit (a container image file, a venv) that is not here
    yet: a real submit refuses, a --dry-run only notes it (the script can be read before the image is pulled)."""
    problems = []
    env = options.environment
    if env.kind == "apptainer" and env.image and not Path(env.image).expanduser().is_file():
        problems.append(
            f"apptainer image {env.image} does not exist: build or pull it first (apptainer pull ...) or fix --image"
        )
    if env.kind == "pyxis" and env.image and _looks_like_path(env.image) and not Path(env.image).expanduser().is_file():
        problems.append(f"enroot image {env.image} does not exist: import it first (enroot import ...) or fix --image")
    if env.kind == "venv" and env.venv and not (Path(env.venv).expanduser() / "bin" / "activate").is_file():
        problems.append(f"venv {env.venv} has no bin/activate: create it (python -m venv {env.venv}) or fix --venv")
    return problems


def _looks_like_path(image: str) -> bool:
    return image.startswith(("/", "./", "../", "~")) or image.endswith((".sqsh", ".squashfs"))


def output_problems(options: SlurmOptions) -> list[str]:
    """--output/--error in a directory that does not exist: sbatch would not create it, and the job would fail
    without a word (the submit host shares the file system with the nodes)."""
    problems = []
    for flag, pattern in (("--output", options.output), ("--error", options.error)):
        parent = Path(pattern).expanduser().parent if pattern else None
        if parent is not None and "%" not in str(parent) and not parent.is_dir():
            problems.append(
                f"{flag} {pattern}: directory {parent} does not exist and sbatch will not create it; mkdir -p {parent}"
            )
    return problems


def _python_of(first: str, search: str) -> str | None:
    """The interpreter a command's first word names (`python3`, `/opt/venv/bin/python`), as the job's PATH finds
    it; None for another program."""
    if not os.path.basename(first).startswith("python"):
        return None
    if "/" in first:
        path = os.path.expanduser(first)
        return path if os.access(path, os.X_OK) else None
    return shutil.which(first, path=search)


SCRIPT_SCAN_BYTES = 1 << 20
# hpctrain.checkpoint.files.NAME_PATTERN and training.rundir.CHECKPOINT_DIR (both modules import torch, which the
# submitting host need not have); tests/test_requeue_script.py checks that they agree.
CHECKPOINT_NAME = re.compile(r"^checkpoint_(epoch|step)_(\d+)\.pt$")
CHECKPOINT_DIR = "checkpoints"


def earlier_run_problems(job: JobSpec, recipe: Any) -> list[str]:
    """A recipe's run directory that already holds an earlier run's checkpoints, without --resume: `train` refuses
    it, and so does the check, before the job waits in the queue. (A run directory with %j is new for every job.)"""
    if recipe.resume is not None or job.run_dir is None or "%j" in job.run_dir:
        return []
    run_dir = Path(os.path.expanduser(job.run_dir))
    folder = run_dir if run_dir.name == CHECKPOINT_DIR else run_dir / CHECKPOINT_DIR
    try:
        held = any(CHECKPOINT_NAME.match(entry.name) for entry in os.scandir(folder))
    except OSError:
        return []
    if not held:
        return []
    return [
        f"--run-dir {job.run_dir} already holds checkpoints of an earlier run, which the job's `train` would "
        f"refuse after waiting in the queue: pass --resume (after the recipe: `train {recipe.workload} --resume "
        "...`) to continue it, or choose another --run-dir for a new run"
    ]


def warning_note(job: JobSpec, options: SlurmOptions, paths: tuple[str, ...] = ()) -> list[str]:
    """One line saying what the time-limit warning will do to this job (submit prints it before queueing)."""
    if not job.signal_grace:
        return [f"{TIME_LIMIT_NOTE}no warning (--signal-grace 0): the job ends at its limit, and is not requeued"]
    grace = job.signal_grace
    if job.is_recipe:
        return [
            f"{TIME_LIMIT_NOTE}the run gets SIGUSR1 {grace} s before it, checkpoints and stops, and the "
            f"job requeues itself (at most {options.max_requeues} times, --max-requeues)"
        ]
    if job.run_dir is None:
        return [
            f"{TIME_LIMIT_NOTE}your program gets no SIGUSR1 (the job has no run directory in which it "
            "could say it handles it) and runs until the limit, without a requeue"
        ]
    script = next((p for p in paths if p.endswith(".py")), None)
    if script is not None and _mentions(script, b"StopRequest"):
        return [
            f"{TIME_LIMIT_NOTE}SIGUSR1 {grace} s before it goes to your program once it installs "
            f"hpctrain.training.StopRequest (as {script} does); the job requeues itself only if the program then "
            f"says its state is saved (announce_stop), at most {options.max_requeues} times"
        ]
    said = f"{script} does not use" if script is not None else "only a program that installs"
    return [
        f"{TIME_LIMIT_NOTE}{said} hpctrain.training.StopRequest, which says it handles SIGUSR1; "
        "a program that does not say so gets no SIGUSR1 (it would end it, with nothing saved) and runs until the "
        "limit, without a requeue (docs/slurm.md: your own script)"
    ]


def _mentions(path: str, word: bytes) -> bool:
    try:
        with open(os.path.expanduser(path), "rb") as handle:
            return word in handle.read(SCRIPT_SCAN_BYTES)
    except OSError:
        return False


def program_problems(
    job: JobSpec, environ: Mapping[str, str], options: SlurmOptions | None = None, venv_missing: bool = False
) -> list[str]:
    """Programs the job starts by name that its PATH will not have. sbatch passes this shell's PATH on to the job
    (plus --setenv PATH, plus the venv's or conda prefix's bin/); with modules or a container, nothing is known.
    `venv_missing`: the job's venv is yet to be made, so a program missing from it is a Prerequisite."""
    options = for_job(options, job)
    problems = []
    if options.python is not None and not os.access(os.path.expanduser(options.python), os.X_OK):
        problems.append(
            f"python {options.python} is not an executable here, so the job cannot start it either; fix the "
            "path, or remove python from the job file to run with the Python that submits"
        )
    dirs = get_environment(options.environment).search_path(dict(job.env).get("PATH", environ.get("PATH", os.defpath)))
    if dirs is None:
        return problems
    launcher = options.launcher
    names = ["torchrun"] if launcher == "torchrun" and options.python is None else []
    first = job.command[0]
    if "/" not in first and not (first == "hpctrain" and options.python is not None):
        names.append(first)
    search = os.pathsep.join(os.path.expanduser(d) for d in dirs)
    interpreter = options.python if job.is_recipe else _python_of(first, search)
    if interpreter is not None:
        problems += interpreter_problems(job, interpreter, {**environ, **dict(job.env), "PATH": search})
    for name in dict.fromkeys(names):
        if shutil.which(name, path=search) is not None:
            continue
        if name.startswith("python"):
            fix = f"name the interpreter by its absolute path (e.g. -- {sys.executable} ...)"
        elif options.environment.kind == "none":
            fix = (
                "activate the environment that has it before submitting, name that environment (--venv DIR or "
                "--conda-env), or give the program's absolute path"
            )
        else:
            fix = "install it into that environment, or give the program's absolute path"
        where = (
            "this shell's PATH, which sbatch passes on"
            if options.environment.kind == "none"
            else (f"{dirs[0]} and this shell's PATH")
        )
        problems.append(
            (Prerequisite if venv_missing else str)(
                f"`{name}` is not on the PATH the job will have ({where}), so the job would fail with "
                f"`execve(): {name}: No such file or directory`; {fix}"
            )
        )
    return problems
