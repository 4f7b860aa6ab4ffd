"""Slurm behind hpctrain's scheduler interface.

    render.py        the sbatch script from a JobSpec (pure) and `sbatch --parsable` (thin)
    torchrun_shim.py the lines of Python the script runs torchrun through, on every torch from the floor up
    environments.py  how the script prepares a node: modules, conda, venv, apptainer, pyxis
    checks.py        can this cluster run the job (partition, time limit, nodes, GPUs, paths)
    query.py         partitions and nodes (scontrol), gres.py their GPUs and shards
    jobs.py          one job or the queue (scontrol, squeue, sacct), wait, scancel
    output.py        where a job's output file is, following it as it grows
    local.py         the checks on the submit host: paths, programs on the job's PATH, a recipe's dataset
    display.py       what `hpctrain status` and `cluster` show, as data (a View: records, tables, lines)
    preempt.py       `hpctrain debug preempt`: the time-limit warning of the job's own script, sent now
                     (nothing here prints: the CLI formats what these return, hpctrain.cli.views)
    records.py       Slurm's record and duration formats;  commands.py  runs the Slurm client commands
    scheduler.py     SlurmScheduler: the interface, delegating to the modules above

Nothing here imports torch or the Kubernetes client.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from hpctrain.schedulers.base import BackendInfo


def client_version() -> str | None:
    """`sinfo --version` (e.g. "slurm 23.11.4"), or None where the Slurm client is not installed or does not answer."""
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return None
    try:
        proc = subprocess.run([sinfo, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


INFO = BackendInfo(
    name="slurm",
    title="Slurm",
    flags={
        # submit and check: the job
        "partition": "--partition", "account": "--account", "qos": "--qos", "output": "--output", "error": "--error",
        "sbatch_extra": "--sbatch", "gpu_type": "--gpu-type", "gres": "--gres", "kind": "--env-kind",
        "modules": "--module", "conda_env": "--conda-env", "venv": "--venv", "mounts": "--mount",
        "workdir": "--container-workdir", "launcher": "--launcher", "rdzv_port": "--rdzv-port",
        "max_requeues": "--max-requeues", "max_preemptions": "--max-preemptions",
        "max_hang_restarts": "--max-hang-restarts",
        # status, logs, cancel (cluster's --partition is the job's)
        "all_users": "--all-users", "err": "--err", "signal": "--signal", "full": "--full",
    },
    shares_file_system=True,
    client_version=client_version,
)


def create(context: str | None = None, **options: Any):
    """The registry's entry point: `get_scheduler("slurm")`. Slurm takes its options (partition, account, ...)
    from the JobSpec, so there are none here but the command runner tests may inject (`run=`); it has no
    contexts (the CLI refuses --context before it gets here)."""
    from hpctrain.schedulers.slurm.scheduler import SlurmScheduler

    return SlurmScheduler(**options)


__all__ = ["INFO", "create"]
