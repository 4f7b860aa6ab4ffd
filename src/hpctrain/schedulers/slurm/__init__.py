"""Slurm behind hpctrain's scheduler interface.

    options.py       SlurmOptions: partition, account, qos, output/error, extra options, GPU type, shards, the
                     environment (EnvironmentSpec) and interpreter, launcher, requeue and hang-restart budgets
    grammar.py       Slurm's value grammars: printed durations and sizes, GRES entries, the --mem form
    flags.py         the flags Slurm owns, and the environment and interpreter it adds to a job
    directives.py    what an #SBATCH line can hold: checks, extra options, quoting
    render.py        the sbatch script from a JobSpec and SlurmOptions (pure) and `sbatch --parsable` (thin)
    torchrun_shim.py the lines of Python the script runs torchrun through, on every torch from the floor up
    environments.py  how the script prepares a node: modules, conda, venv, apptainer, pyxis
    checks.py        can this cluster run the job (partition, time limit, nodes, GPUs, paths)
    query.py         partitions and nodes (scontrol), gres.py their GPUs and shards
    jobs.py          one job or the queue (squeue, sacct), wait, scancel
    output.py        where a job's output file is, following it as it grows
    local.py         the checks on the submit host: paths, programs on the job's PATH, a recipe's dataset
    display.py       what `hpctrain status` and `cluster` show, as data (a View: records, tables, lines)
    preempt.py       `hpctrain debug preempt`: the time-limit warning of the job's own script, sent now
                     (nothing here prints: the CLI formats what these return, hpctrain.cli.views)
    records.py       Slurm's record formats;  commands.py  runs the Slurm client commands
    scheduler.py     SlurmScheduler: the interface, delegating to the modules above

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
