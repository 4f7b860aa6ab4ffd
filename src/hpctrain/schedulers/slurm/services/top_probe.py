"""`top`'s probe on Slurm: a step beside the job's own (`srun --jobid=JOB --overlap`, one task per node, `--label`d
so that each line names its task). SlurmServices (services.py) answers `top` with it; TensorBoard on the cluster is
a service job of services.py.
"""

from __future__ import annotations

from typing import Any

from hpctrain.errors import UserError
from hpctrain.servers.top import PROBE, JobNotRunning, NodeSample, parse_probe

# ---- top: a probe step beside the job's own -----------------------------------------------------------------------


def probe_argv(job_id: str, nodes: int) -> list[str]:
    return [
        "srun",
        f"--jobid={job_id}",
        "--overlap",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        "--label",
        "bash",
        "-c",
        PROBE,
    ]


def sample(job_id: str) -> tuple[Any, list[NodeSample]]:
    from hpctrain.schedulers.slurm.commands import slurm
    from hpctrain.schedulers.slurm.queries.job_states import get_job

    info = get_job(job_id)
    if info is None:
        raise UserError(f"job {job_id} not found: check the id with `hpctrain status`")
    if info.state != "RUNNING":
        raise JobNotRunning(f"job {job_id} is {info.state}, not running: `hpctrain top` looks at running jobs only")
    result = slurm(probe_argv(info.job_id, info.num_nodes or 1), check=False)
    samples = parse_probe(result.stdout)
    if not samples:
        err = " ".join((result.stderr or "").split()) or f"exit status {result.returncode}"
        raise UserError(f"could not run the probe step in job {job_id} ({err}); the job may be ending")
    return info, samples
