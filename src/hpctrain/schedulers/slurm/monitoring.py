"""The services on Slurm that watch training: TensorBoard on the runs as a small batch job (a ServiceJob of
services.py), and `top`'s probe, a step beside the job's own (`srun --jobid=JOB --overlap`, one task per node,
`--label`d so that each line names its task). SlurmServices (services.py) answers `tensorboard --on-cluster` and
`top` with them.
"""

from __future__ import annotations

import secrets
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.jobs.spec import EnvironmentSpec, Resources
from hpctrain.schedulers.slurm.services import ServiceJob, render_service_script, submit, wait_ready
from hpctrain.servers import tensorboard as tbserver
from hpctrain.servers.common import Endpoint, private_dir, state_root
from hpctrain.servers.top import PROBE, JobNotRunning, NodeSample, parse_probe

TENSORBOARD_COMMAND = (
    "bash",
    "-c",
    'exec python3 -m tensorboard.main --logdir_spec="$HPCTRAIN_TB_SPEC" --host 0.0.0.0 '
    '--port "$HPCTRAIN_PORT" --reload_interval 30',
)


# ---- TensorBoard as a job -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterTensorBoard:
    """TensorBoard's job: the runs' --logdir_spec (paths as the job sees them), its environment and limits."""

    spec: str
    environment: EnvironmentSpec = EnvironmentSpec()
    time: str | None = "08:00:00"
    partition: str | None = None
    account: str | None = None
    mem: str | None = "2G"


def tensorboard_job(tb: ClusterTensorBoard, state_dir: Path) -> ServiceJob:
    return ServiceJob(
        name="tensorboard",
        state_dir=str(state_dir),
        command=TENSORBOARD_COMMAND,
        resources=Resources(cpus_per_task=1, mem=tb.mem),
        environment=tb.environment,
        setup=(f"export HPCTRAIN_TB_SPEC={shlex.quote(tb.spec)}",),
        partition=tb.partition,
        account=tb.account,
        time=tb.time,
    )


def new_state_dir() -> Path:
    root = private_dir(state_root("tensorboard"))
    return private_dir(root / time.strftime(f"%Y%m%d-%H%M%S-{secrets.token_hex(3)}"))


def start_tensorboard(tb: ClusterTensorBoard, wait_s: float, say=print) -> tuple[str, Endpoint]:
    state_dir = new_state_dir()
    service = tensorboard_job(tb, state_dir)
    job_id = submit(service, render_service_script(service))
    say(f"tensorboard: job {job_id} submitted; waiting for it to answer (up to {wait_s:g} s)")
    endpoint = wait_ready(
        state_dir,
        job_id,
        lambda ep: tbserver.ready(ep.node, ep.port),
        wait_s,
        on_state=lambda s: say(f"  job {job_id}: {s}"),
    )
    return job_id, endpoint


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
    from hpctrain.schedulers.slurm.jobs import get_job

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
