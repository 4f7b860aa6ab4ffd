"""Slurm behind hpctrain's scheduler interface.

    scheduler.py     SlurmScheduler: the interface, delegating to the modules below
    flags.py         the flags Slurm owns, and the environment and interpreter it adds to a job
    commands.py      the one runner of Slurm's client commands, with its deadline
    grammar.py       Slurm's value grammars: printed durations and sizes, GRES entries, the --mem form
    batch/           the batch script: script.py renders it from a JobSpec and resolved SlurmOptions (pure), top to
                     bottom (#SBATCH lines, traps, budgets, rendezvous, the step, the requeues), and submits it
                     (`sbatch --parsable`, thin); options.py holds SlurmOptions (partition, account, qos, GPU type,
                     shards, the environment and interpreter, launcher, budgets) and the checks of their values;
                     environments.py prepares a node (modules, conda, venv, apptainer, pyxis); torchrun_shim.py and
                     programs/ are what the script carries
    checks/          can this cluster run the job (live.py), what the submit host can tell (login_node.py), the
                     job's interpreter (interpreter.py)
    queries/         what Slurm prints and its parsers: records, job states and tables, the cluster, GRES, the
                     views of `status` and `cluster` (display.py), a job's output, its run directory
    services/        the jobs around a job: dev sessions, dev save, TensorBoard, top's probe, `debug preempt`
                     (nothing here prints: the faces format what these return)

Nothing here imports torch or the Kubernetes client.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from hpctrain.schedulers.base import BackendInfo
from hpctrain.errors import UserError
from hpctrain.schedulers.slurm.commands import slurm
from hpctrain.schedulers.slurm.flags import add_arguments, complete_job
from hpctrain.schedulers.slurm.batch.options import EARLIER_DEFAULTS, FILE_KEYS, SlurmOptions, read_file_section


def client_version() -> str | None:
    """`sinfo --version` (e.g. "slurm 23.11.4"), or None where the Slurm client is not installed or does not answer."""
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return None
    try:
        proc = slurm([sinfo, "--version"], check=False, timeout=10)
    except (OSError, UserError):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def local_run_dir(run_dir: str) -> Path:
    """The login node shares the nodes' file system: a job's run directory is read here as it is."""
    return Path(run_dir)


INFO = BackendInfo(
    name="slurm",
    title="Slurm",
    flags={
        # submit and check: the job
        "partition": "--partition",
        "account": "--account",
        "qos": "--qos",
        "output": "--output",
        "error": "--error",
        "sbatch_extra": "--sbatch",
        "gpu_type": "--gpu-type",
        "gres": "--gres",
        "kind": "--env-kind",
        "modules": "--module",
        "conda_env": "--conda-env",
        "venv": "--venv",
        "mounts": "--mount",
        "workdir": "--container-workdir",
        "launcher": "--launcher",
        "rdzv_port": "--rdzv-port",
        "max_requeues": "--max-requeues",
        "max_preemptions": "--max-preemptions",
        "max_hang_restarts": "--max-hang-restarts",
        # status, logs, cancel (cluster's --partition is the job's)
        "all_users": "--all-users",
        "stream": "--err",
        "signal": "--signal",
        "full": "--full",
    },
    option_fields={name: name for name in FILE_KEYS},  # SlurmOptions fields (and gres), flags by the same dest
    file_section=read_file_section,
    file_keys=FILE_KEYS,
    earlier_defaults=EARLIER_DEFAULTS,
    add_arguments=add_arguments,
    complete_job=complete_job,
    probe_options={"max_hang_restarts": 0},
    run_dir_pattern=lambda stem: f"{stem}-%j",
    local_run_dir=local_run_dir,
    client_version=client_version,
)


def create(options: SlurmOptions | None = None, context: str | None = None, run: Any = None, **fields: Any):
    """The registry's entry point: `get_scheduler("slurm", partition="gpu")` or `get_scheduler("slurm",
    options=SlurmOptions(...))`; `run` is the command runner tests may inject. Slurm has no contexts (the CLI
    refuses --context before it gets here)."""
    from hpctrain.schedulers.slurm.scheduler import SlurmScheduler

    if options is None:
        options = SlurmOptions(**fields)
    elif fields:
        raise TypeError("give SlurmOptions or its fields, not both")
    return SlurmScheduler(options) if run is None else SlurmScheduler(options, run=run)


__all__ = ["INFO", "SlurmOptions", "create"]
