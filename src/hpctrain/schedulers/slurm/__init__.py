"""Slurm behind hpctrain's scheduler interface.

    render.py        the sbatch script from a JobSpec (pure) and `sbatch --parsable` (thin)
    environments.py  how the script prepares a node: modules, conda, venv, apptainer, pyxis
    checks.py        can this cluster run the job (partition, time limit, nodes, GPUs, paths)
    query.py         partitions and nodes (scontrol), gres.py their GPUs and shards
    jobs.py          one job or the queue (scontrol, squeue, sacct), wait, scancel
    output.py        where a job's output file is, following it as it grows
    display.py       the rich tables of `hpctrain status` and `hpctrain cluster`
    records.py       Slurm's record and duration formats;  commands.py  runs the Slurm client commands
    scheduler.py     SlurmScheduler: the interface, delegating to the modules above

Nothing here imports torch or the Kubernetes client.
"""

from __future__ import annotations

from typing import Any


def create(**options: Any):
    """The registry's entry point: `get_scheduler("slurm")`. Slurm takes its options (partition, account, ...)
    from the JobSpec, so there are none here but the command runner tests may inject (`run=`)."""
    from hpctrain.schedulers.slurm.scheduler import SlurmScheduler

    return SlurmScheduler(**options)


__all__ = ["create"]
