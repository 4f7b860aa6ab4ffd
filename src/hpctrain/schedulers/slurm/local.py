"""The checks of a Slurm job on the submit host: what the login node can tell because it shares the nodes' file
system and (through sbatch) passes on its PATH. `submit`, `submit --dry-run`, `submit --no-check` and `check` run
them (SlurmScheduler.local_check); checks.py holds those against the live cluster.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from typing import Any

from hpctrain.errors import UserError
from hpctrain.jobs.spec import JobSpec, local_problems
from hpctrain.schedulers.slurm.checks import Requirements, check_here
from hpctrain.schedulers.slurm.environments import get_environment


def local_check(job: JobSpec, requirements: Requirements, recipe: Any = None,
                environ: Mapping[str, str] = os.environ) -> list[str]:
    """Every problem visible without the cluster: missing image/venv/script, a recipe (`recipe`, its TrainConfig)
    whose dataset is not in its data dir or that wants CUDA without GPUs, a command the job will not find on its
    PATH."""
    problems = local_problems(job)
    if recipe is not None:
        from hpctrain.recipes import check_data

        try:
            check_data(recipe)
        except UserError as err:
            problems.append(str(err))
        r = job.resources
        if recipe.device == "cuda" and not (r.gpus_per_node or r.shards_per_node):
            problems.append("train --device cuda, but the job asks for no GPUs: add --gpus-per-node N "
                            "(or --gres shard:N), or train with --device cpu")
    problems += check_here(requirements)
    problems += program_problems(job, environ)
    return problems


def program_problems(job: JobSpec, environ: Mapping[str, str]) -> list[str]:
    """Programs the job starts by name that its PATH will not have. sbatch passes this shell's PATH on to the job
    (plus --setenv PATH, plus the venv's or conda prefix's bin/); with modules or a container, nothing is known."""
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
