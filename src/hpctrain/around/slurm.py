"""The commands around the job on Slurm (hpctrain.around.base.Services): dev sessions as batch jobs, TensorBoard
as a small CPU job reached through an ssh tunnel, and `top`'s probe as a step beside the job's own
(`srun --jobid=JOB --overlap`, one task per node, `--label`d so that each line names its task)."""

from __future__ import annotations

import secrets
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain import tbserver
from hpctrain.around.base import Placement, RemoteStacks
from hpctrain.errors import UserError
from hpctrain.jobs.spec import EnvironmentSpec, Resources
from hpctrain.services import slurm as service_slurm
from hpctrain.services.common import Endpoint, login_host, private_dir, state_root
from hpctrain.sessions import slurm as sessions
from hpctrain.sessions.config import DevConfig, SessionView, session_dir
from hpctrain.schedulers.slurm.run_dir import run_dir_of
from hpctrain.top import PROBE, JobNotRunning, NodeSample, TopSample, parse_probe

TENSORBOARD_COMMAND = ("bash", "-c", 'exec python3 -m tensorboard.main --logdir_spec="$HPCTRAIN_TB_SPEC" --host 0.0.0.0 '
                                     '--port "$HPCTRAIN_PORT" --reload_interval 30')


def create(scheduler: Any) -> SlurmServices:
    return SlurmServices(scheduler)


class SlurmServices:
    name = "slurm"

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def environment(self, placement: Placement) -> EnvironmentSpec:
        return environment(placement)

    def dev_render(self, cfg: DevConfig, placement: Placement) -> str:
        return sessions.render_dev_script(cfg, session_dir(cfg.name))

    def dev_start(self, cfg: DevConfig, placement: Placement, wait_s: float, local_port: int | None) -> list[str]:
        conn = sessions.start(cfg, None, placement.login_host or login_host(), wait_s, local_port)
        return sessions.instructions(cfg, conn)

    def dev_view(self, state_dir: Path, conn: dict[str, Any], probe: bool) -> SessionView:
        return sessions.view(state_dir, conn, probe)

    def dev_stop(self, state_dir: Path, conn: dict[str, Any]) -> str:
        return sessions.stop(state_dir, conn)

    def tensorboard(self, run_dirs: list[str], time: str, placement: Placement, wait_s: float,
                    port: int | None) -> list[str]:
        tb = ClusterTensorBoard(spec=tbserver.logdir_spec(run_dirs), environment=environment(placement), time=time,
                                partition=placement.partition, account=placement.account)
        job_id, endpoint = start_tensorboard(tb, wait_s)
        local = port or endpoint.port
        return [f"\nTensorBoard is up on {endpoint.node}:{endpoint.port} (job {job_id}). On your machine, open the tunnel:",
                f"  {endpoint.tunnel_command(placement.login_host or login_host(), local)}",
                f"then open:\n  http://localhost:{local}/", f"Stop it with: hpctrain cancel {job_id}"]

    def top(self, job: str, find_run_dir: bool) -> TopSample:
        info, samples = sample(job)
        run_dir = run_dir_of(info.job_id, info.work_dir) if find_run_dir else None
        return TopSample(f"job {info.job_id}", samples, run_dir)

    def stacks(self, job: str, wait_s: float) -> RemoteStacks:
        raise UserError(f"cannot tell the run directory of {job}: give it with --run-dir")

    def run_dir(self, job: str) -> Path | None:
        from hpctrain.schedulers.slurm.jobs import get_job

        info = get_job(job)
        if info is None:
            raise UserError(f"job {job} not found: check the id with `hpctrain status`")
        return run_dir_of(info.job_id, info.work_dir)

    def stop(self, name: str) -> str | None:
        return None  # every service is a batch job: scancel stops it


def environment(placement: Placement) -> EnvironmentSpec:
    """--image/--conda-env/--venv/--module/--mount -> EnvironmentSpec; the Kubernetes flags are refused."""
    from hpctrain.images import docker_pull_hint

    if placement.shm or placement.volumes:
        raise UserError("--shm/--volume apply to Kubernetes: on Slurm use --mount with a container --image")
    chosen = [f for f, v in (("--image", placement.image), ("--conda-env", placement.conda_env),
                             ("--venv", placement.venv)) if v]
    if len(chosen) > 1:
        raise UserError(f"{' and '.join(chosen)}: choose one environment")
    modules, mounts = tuple(placement.modules), tuple(placement.mounts)
    if placement.image:
        hint = docker_pull_hint(placement.image)
        if hint:
            raise UserError(hint)
        kind = "apptainer" if placement.image.endswith(".sif") else "pyxis"
        return EnvironmentSpec(kind=kind, image=placement.image, modules=modules, mounts=mounts)
    if placement.conda_env:
        return EnvironmentSpec(kind="conda", conda_env=placement.conda_env, modules=modules, mounts=mounts)
    if placement.venv:
        return EnvironmentSpec(kind="venv", venv=placement.venv, modules=modules, mounts=mounts)
    return EnvironmentSpec(kind="modules" if modules else "none", modules=modules, mounts=mounts)


# ---- TensorBoard as a job -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterTensorBoard:
    """TensorBoard's job: the runs' --logdir_spec (paths as the job sees them), its environment and limits."""

    spec: str
    environment: EnvironmentSpec = EnvironmentSpec()
    time: str | None = "08:00:00"
    partition: str | None = None
    account: str | None = None
    mem: str | None = "2G"


def tensorboard_job(tb: ClusterTensorBoard, state_dir: Path) -> service_slurm.ServiceJob:
    return service_slurm.ServiceJob(
        name="tensorboard", state_dir=str(state_dir), command=TENSORBOARD_COMMAND,
        resources=Resources(cpus_per_task=1, mem=tb.mem), environment=tb.environment,
        setup=(f"export HPCTRAIN_TB_SPEC={shlex.quote(tb.spec)}",), partition=tb.partition, account=tb.account,
        time=tb.time,
    )


def new_state_dir() -> Path:
    root = private_dir(state_root("tensorboard"))
    return private_dir(root / time.strftime(f"%Y%m%d-%H%M%S-{secrets.token_hex(3)}"))


def start_tensorboard(tb: ClusterTensorBoard, wait_s: float, say=print) -> tuple[str, Endpoint]:
    state_dir = new_state_dir()
    service = tensorboard_job(tb, state_dir)
    job_id = service_slurm.submit(service, service_slurm.render_service_script(service))
    say(f"tensorboard: job {job_id} submitted; waiting for it to answer (up to {wait_s:g} s)")
    endpoint = service_slurm.wait_ready(state_dir, job_id, lambda ep: tbserver.ready(ep.node, ep.port), wait_s,
                                        on_state=lambda s: say(f"  job {job_id}: {s}"))
    return job_id, endpoint


# ---- top: a probe step beside the job's own -------------------------------------------------------------------


def probe_argv(job_id: str, nodes: int) -> list[str]:
    return ["srun", f"--jobid={job_id}", "--overlap", f"--nodes={nodes}", "--ntasks-per-node=1", "--label",
            "bash", "-c", PROBE]


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
