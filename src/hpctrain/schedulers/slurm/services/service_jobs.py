"""The services around the jobs on Slurm (hpctrain.schedulers.service_api.Services), what `dev`, `tensorboard
--on-cluster`, `top` and `debug stacks` ask of this backend: SlurmServices, reached through SlurmScheduler.services().

Each service is a server in a Slurm batch job: render the script (pure), submit it (thin), wait until the server
answers. Dev sessions (JupyterLab, sshd, a VS Code tunnel; their views and stopping in dev.py) and TensorBoard are
such jobs; `top`'s probe runs as a step beside the job's own (monitoring.py).

The job picks a free port on its node, writes `endpoint.json` (job id, node, port) into the service's state
directory, and starts the server as a job step, so that containers (apptainer, pyxis) and the environment
strategies of hpctrain.launch apply exactly as for training. The script runs with `umask 077`: everything it
writes is private to the user. Secrets are never on a command line: the script reads them from 0600 files into
environment variables the server reads (visible only to the user, unlike argv in `ps`).
"""

from __future__ import annotations

import secrets
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hpctrain import program_text
from hpctrain.distributed.ports import job_port_lines
from hpctrain.errors import UserError
from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.jobs.values import parse_time_limit
from hpctrain.schedulers.slurm.batch.environments import get_environment
from hpctrain.schedulers.slurm.grammar import read_gres_request
from hpctrain.schedulers.slurm.batch.options import EnvironmentSpec, SlurmOptions, checked_for_job
from hpctrain.schedulers.slurm.batch.script import sbatch_directives, step_command
from hpctrain.schedulers.slurm.batch.script import submit as sbatch_submit
from hpctrain.schedulers.slurm.services.top_probe import sample
from hpctrain.schedulers.slurm.queries.run_dir import run_dir_of
from hpctrain.schedulers.service_api import OnStep, Placement, RemoteStacks, ServiceAccess, Step
from hpctrain.servers import code, jupyter, ssh
from hpctrain.servers import tensorboard as tbserver
from hpctrain.readback import BadRunFile, bounds, parse_record, read_json, read_tail
from hpctrain.servers.common import Endpoint, login_host, private_dir, state_root, write_private
from hpctrain.servers.sessions import (
    CONNECTION_FILE,
    TOKEN_FILE,
    DevConfig,
    SaveOutcome,
    SessionView,
    forget,
    make_session_dir,
    now,
    session_dir,
)
from hpctrain.servers.top import TopSample
from hpctrain.schedulers.slurm.services import dev_sessions, dev_save

ENDPOINT_FILE = "endpoint.json"
MAX_ENDPOINT_BYTES = 4096  # {"job_id": ..., "node": ..., "port": ...}: under 300 bytes


@dataclass(frozen=True)
class ServiceJob:
    """One server process on one node. `command` runs inside the job step, where $HPCTRAIN_PORT holds the
    chosen port; `setup` are trusted shell lines (rendered by hpctrain, values quoted) run before it."""

    name: str
    state_dir: str
    command: tuple[str, ...]
    resources: Resources = field(default_factory=Resources)
    options: SlurmOptions = field(default_factory=SlurmOptions)
    """Where the service runs (partition, account), with which software (environment), its GPU type or shards."""
    setup: tuple[str, ...] = ()
    time: str | None = None
    port: int | None = None
    """A fixed port; None: the first free one from the job's port (hpctrain.distributed.ports)."""

    def job_spec(self) -> JobSpec:
        """The JobSpec whose #SBATCH lines and srun step this service uses (validates every value)."""
        return JobSpec(
            command=self.command,
            name=self.name,
            time_limit_s=None if self.time is None else parse_time_limit(self.time),
            resources=replace(self.resources, nodes=1, nproc_per_node=1),
            signal_grace=0,
        )

    def slurm_options(self) -> SlurmOptions:
        """One process, its output in the state folder, where the user asked for it."""
        return replace(self.options, launcher="single", output=str(Path(self.state_dir) / "slurm-%j.out"))


def port_lines(port: int | None) -> list[str]:
    if port is not None:
        return [f"port={int(port)}"]
    return job_port_lines("port", "hpctrain: no free port found on $(hostname)")


def render_service_script(service: ServiceJob) -> str:
    """The batch script. Pure: the same ServiceJob gives the same text."""
    job = service.job_spec()
    options = checked_for_job(service.slurm_options(), job)
    env = get_environment(service.options.environment)
    state = shlex.quote(service.state_dir)
    out = [
        "#!/bin/bash",
        f"# Rendered by hpctrain: service {service.name}.",
        "# The server's command is single-quoted on purpose: $HPCTRAIN_PORT expands in the job step.",
        "# shellcheck disable=SC2016",
    ]
    out += sbatch_directives(job, options)
    out += [
        "",
        "set -uo pipefail",
        "umask 077",
        f"state_dir={state}",
        "# slurmd created the output file before this script ran: make it private too.",
        'chmod 600 "$state_dir/slurm-${SLURM_JOB_ID}.out" 2>/dev/null || true',
        "",
    ]
    out += env.setup_lines()
    out += port_lines(service.port)
    out += ['export HPCTRAIN_PORT="$port"', *service.setup, ""]
    # Then the server: its endpoint written for the login node, the step, its end (programs/serve.sh).
    out += program_text.lines(
        __package__,
        "serve.sh",
        ENDPOINT_FILE=ENDPOINT_FILE,
        STEP_COMMAND=" ".join(step_command(job, options)),
    )
    return "\n".join(out) + "\n"


def submit(service: ServiceJob, script: str) -> str:
    """sbatch the script; returns the job id."""
    return sbatch_submit(service.job_spec(), script)


@dataclass(frozen=True)
class _EndpointRecord:
    """endpoint.json, as the job writes it."""

    job_id: str = field(metadata=bounds(1, 64))
    node: str = field(metadata=bounds(1, 255))
    port: int = field(metadata=bounds(1, 65535))


def read_endpoint(state_dir: Path, job_id: str) -> Endpoint | None:
    """Where the job's server listens; None until the job has written it (an earlier job's file is not its)."""
    path = state_dir / ENDPOINT_FILE
    try:
        record = parse_record(_EndpointRecord, read_json(path, MAX_ENDPOINT_BYTES, within=state_dir), path)
    except FileNotFoundError:
        return None
    return Endpoint(node=record.node, port=record.port) if record.job_id == str(job_id) else None


def wait_ready(
    state_dir: Path,
    job_id: str,
    ready: Callable[[Endpoint], bool],
    timeout_s: float,
    on_state: Callable[[str], None] | None = None,
    poll_s: float = 1.0,
) -> Endpoint:
    """Poll until the job runs, has written its endpoint, and `ready(endpoint)` holds. Raises UserError when the
    job ends first (with the tail of its output) or when timeout_s passes (the job is left queued or running)."""
    from hpctrain.schedulers.slurm.commands import poll_until
    from hpctrain.schedulers.slurm.queries.job_states import get_job

    states: list[str] = []

    def probe() -> tuple[str, Endpoint | None]:
        info = get_job(job_id)
        state = info.state if info is not None else "GONE"
        if (not states or state != states[-1]) and on_state is not None:
            on_state(state if not (info and info.reason and info.pending) else f"{state} ({info.reason})")
        states[:] = [state]
        if info is None or info.finished:
            raise UserError(
                f"job {job_id} ended ({state}) before its server answered:\n{output_tail(state_dir, job_id)}"
            )
        endpoint = read_endpoint(state_dir, job_id) if state == "RUNNING" else None
        return state, endpoint if endpoint is not None and ready(endpoint) else None

    (state, endpoint), _ = poll_until(probe, lambda seen: seen[1] is not None, timeout_s=timeout_s, poll_s=poll_s)
    if endpoint is None:
        raise UserError(
            f"job {job_id} is {state} but its server did not answer within {timeout_s:g} s; it is left "
            f"running: wait longer with --wait, look at {state_dir}/slurm-{job_id}.out, or stop it"
        )
    return endpoint


def output_tail(state_dir: Path, job_id: str, lines: int = 15) -> str:
    path = state_dir / f"slurm-{job_id}.out"
    try:
        text = read_tail(path, 64 << 10, within=state_dir).decode("utf-8", "replace").splitlines()
    except (OSError, BadRunFile):
        return f"(no output file {path})"
    return "\n".join(f"  | {line}" for line in text[-lines:])


# ---- TensorBoard as a service job ----------------------------------------------------------------------------------

TENSORBOARD_COMMAND = (
    "bash",
    "-c",
    'exec python3 -m tensorboard.main --logdir_spec="$HPCTRAIN_TB_SPEC" --host 0.0.0.0 '
    '--port "$HPCTRAIN_PORT" --reload_interval 30',
)


@dataclass(frozen=True)
class ClusterTensorBoard:
    """TensorBoard's job: the runs' --logdir_spec (paths as the job sees them), its environment and limits."""

    spec: str
    options: SlurmOptions = SlurmOptions()
    """Where it runs (partition, account) and with which software (environment)."""
    time: str | None = "08:00:00"
    mem_bytes: int | None = 2 << 30


def tensorboard_job(tb: ClusterTensorBoard, state_dir: Path) -> ServiceJob:
    return ServiceJob(
        name="tensorboard",
        state_dir=str(state_dir),
        command=TENSORBOARD_COMMAND,
        resources=Resources(cpus_per_task=1, mem_bytes=tb.mem_bytes),
        options=tb.options,
        setup=(f"export HPCTRAIN_TB_SPEC={shlex.quote(tb.spec)}",),
        time=tb.time,
    )


def new_state_dir() -> Path:
    root = private_dir(state_root("tensorboard"))
    return private_dir(root / time.strftime(f"%Y%m%d-%H%M%S-{secrets.token_hex(3)}"))


def start_tensorboard(tb: ClusterTensorBoard, wait_s: float, on_step: OnStep) -> tuple[str, Endpoint]:
    """Submit TensorBoard's job and wait until it answers (each step told to `on_step`); its job id and endpoint."""
    state_dir = new_state_dir()
    service = tensorboard_job(tb, state_dir)
    job_id = submit(service, render_service_script(service))
    waiting = f"waiting for it to answer (up to {wait_s:g} s)"
    on_step(Step("submitted", f"tensorboard: job {job_id} submitted; {waiting}", job_id))
    endpoint = wait_ready(
        state_dir,
        job_id,
        lambda ep: tbserver.ready(ep.node, ep.port),
        wait_s,
        on_state=lambda s: on_step(Step("state", s, job_id)),
    )
    return job_id, endpoint


# ---- what `dev`, `tensorboard --on-cluster`, `top` and `debug stacks` ask of Slurm --------------------------------


class SlurmServices:
    """Slurm's hpctrain.schedulers.service_api.Services, on the SlurmScheduler that made it."""

    name = "slurm"

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def dev_render(self, cfg: DevConfig, placement: Placement) -> str:
        return render_dev_script(cfg, session_dir(cfg.name), placement)

    def dev_start(
        self, cfg: DevConfig, placement: Placement, wait_s: float, local_port: int | None, on_step: OnStep
    ) -> list[str]:
        login = placement.options.get("login_host") or login_host()
        conn = start(cfg, None, login, wait_s, local_port, on_step, placement)
        return dev_sessions.instructions(cfg, conn)

    def dev_view(self, state_dir: Path, conn: dict[str, Any], probe: bool) -> SessionView:
        return dev_sessions.view(state_dir, conn, probe)

    def dev_stop(self, state_dir: Path, conn: dict[str, Any]) -> str:
        return stop(state_dir, conn)

    def dev_save(self, state_dir: Path, conn: dict[str, Any], image: str, dry_run: bool) -> SaveOutcome:
        return dev_save.save(str(conn.get("name", state_dir.name)), conn, image, dry_run)

    def tensorboard(
        self, run_dirs: list[str], time: str, placement: Placement, wait_s: float, port: int | None, on_step: OnStep
    ) -> ServiceAccess:
        if placement.options.get("gpu_type") or placement.options.get("gres"):
            raise UserError("TensorBoard runs on CPUs: drop --gpu-type/--gres")
        tb = ClusterTensorBoard(spec=tbserver.logdir_spec(run_dirs), options=service_options(placement), time=time)
        job_id, endpoint = start_tensorboard(tb, wait_s, on_step)
        local = port or endpoint.port
        return ServiceAccess(
            service="TensorBoard",
            job=job_id,
            forward=endpoint.tunnel_command(placement.options.get("login_host") or login_host(), local),
            url=f"http://localhost:{local}/",
            stop=f"hpctrain cancel {job_id}",
            endpoint=endpoint,
        )

    def top(self, job: str, find_run_dir: bool) -> TopSample:
        info, samples = sample(job)
        run_dir = run_dir_of(info.job_id, info.work_dir) if find_run_dir else None
        return TopSample(f"job {info.job_id}", samples, run_dir)

    def stacks(self, job: str, wait_s: float) -> RemoteStacks:
        raise UserError(f"cannot tell the run directory of {job}: give it with --run-dir")

    def run_dir(self, job: str) -> Path | None:
        from hpctrain.schedulers.slurm.queries.job_states import get_job

        info = get_job(job)
        if info is None:
            raise UserError(f"job {job} not found: check the id with `hpctrain status`")
        return run_dir_of(info.job_id, info.work_dir)

    def stop(self, name: str) -> str | None:
        return None  # every service is a batch job: scancel stops it


def environment(placement: Placement) -> EnvironmentSpec:
    """--image/--conda-env/--venv/--module/--mount -> EnvironmentSpec; the Kubernetes flags are refused."""
    from hpctrain.images import docker_pull_hint

    own = placement.options
    if own.get("shm") or own.get("volumes"):
        raise UserError("--shm/--volume apply to Kubernetes: on Slurm use --mount with a container --image")
    conda_env, venv = own.get("conda_env"), own.get("venv")
    chosen = [f for f, v in (("--image", placement.image), ("--conda-env", conda_env), ("--venv", venv)) if v]
    if len(chosen) > 1:
        raise UserError(f"{' and '.join(chosen)}: choose one environment")
    modules, mounts = tuple(own.get("modules", ())), tuple(own.get("mounts", ()))
    if placement.image:
        hint = docker_pull_hint(placement.image)
        if hint:
            raise UserError(hint)
        # a .sif file, or an apptainer sandbox directory (DIR/, which `dev save` can build into a .sif); else enroot
        kind = "apptainer" if placement.image.endswith((".sif", "/")) else "pyxis"
        return EnvironmentSpec(kind=kind, image=placement.image, modules=modules, mounts=mounts)
    if conda_env:
        return EnvironmentSpec(kind="conda", conda_env=conda_env, modules=modules, mounts=mounts)
    if venv:
        return EnvironmentSpec(kind="venv", venv=venv, modules=modules, mounts=mounts)
    return EnvironmentSpec(kind="modules" if modules else "none", modules=modules, mounts=mounts)


def service_options(placement: Placement) -> SlurmOptions:
    """Slurm's options of a service job from the placement's: partition, account, environment, and a GPU type or
    shards (`dev start --gres shard:N`; whole GPUs are the neutral --gpus-per-node)."""
    own = placement.options
    gres = own.get("gres")
    shards = 0
    if gres:
        gpus, _, shards = read_gres_request(gres)
        if gpus:
            raise UserError(f"--gres {gres}: ask for whole GPUs with --gpus-per-node N; --gres is for shard:N")
    return SlurmOptions(
        partition=own.get("partition"),
        account=own.get("account"),
        gpu_type=own.get("gpu_type"),
        shards_per_node=shards,
        environment=environment(placement),
    )


# ---- dev sessions as jobs (their views and stopping: dev.py) ------------------------------------------------------

COMMANDS = {"jupyter": jupyter.COMMAND, "ssh": ssh.COMMAND, "code": code.COMMAND}


def service_job(cfg: DevConfig, state_dir: Path, placement: Placement = Placement()) -> ServiceJob:
    options = service_options(placement)
    setup = ['export HPCTRAIN_STATE_DIR="$state_dir"', *dev_save.setup_lines(cfg.name, options.environment)]
    if cfg.service == "jupyter":
        setup += jupyter.setup_lines(TOKEN_FILE)
    elif cfg.service == "ssh":
        setup += ssh.SETUP_LINES
    else:
        setup += code.setup_lines(cfg.name)
    return ServiceJob(
        name=cfg.job_name,
        state_dir=str(state_dir),
        command=COMMANDS[cfg.service],
        resources=cfg.resources,
        options=options,
        setup=tuple(setup),
        time=cfg.time,
        port=cfg.port,
    )


def render_dev_script(cfg: DevConfig, state_dir: Path, placement: Placement = Placement()) -> str:
    """The batch script of a session. Pure."""
    return render_service_script(service_job(cfg, state_dir, placement))


def start(
    cfg: DevConfig,
    root: Path | None,
    login: str,
    wait_s: float,
    local_port: int | None,
    on_step: OnStep,
    placement: Placement = Placement(),
) -> dict[str, Any]:
    """Submit the session, wait until its server answers (each step told to `on_step`), record and return its
    connection details."""
    service = service_job(cfg, Path(), placement)  # checked before anything is made
    dev_sessions.check_program(cfg, service.options.environment)
    state_dir = make_session_dir(cfg.name, root)
    dev_sessions.refuse_running(state_dir)
    token = secrets.token_urlsafe(32)
    write_private(state_dir / TOKEN_FILE, token + "\n")
    (state_dir / ENDPOINT_FILE).unlink(missing_ok=True)
    host_key = ssh.prepare(cfg.name, cfg.ssh_key, state_dir) if cfg.service == "ssh" else None
    service = service_job(cfg, state_dir, placement)
    script = render_service_script(service)
    write_private(state_dir / "dev.sbatch", script)
    job_id = submit(service, script)
    conn: dict[str, Any] = {
        "name": cfg.name,
        "scheduler": "slurm",
        "service": cfg.service,
        "job_id": job_id,
        "login_host": login,
        "created": now(),
        "environment": dev_save.record(service.options.environment),
        "gpus": cfg.resources.gpus_per_node,
    }
    write_private(state_dir / CONNECTION_FILE, conn)
    waiting = f"waiting for {cfg.service} to answer (up to {wait_s:g} s)"
    on_step(Step("submitted", f"dev session {cfg.name}: job {job_id} submitted; {waiting}", job_id))
    watch = None
    if cfg.service == "code":
        watch = code.TunnelWatch(state_dir / f"slurm-{job_id}.out", lambda text: on_step(Step("prompt", text, job_id)))
    ready = {"jupyter": jupyter.ready(token), "ssh": ssh.ready}.get(cfg.service, watch)
    endpoint = wait_ready(state_dir, job_id, ready, wait_s, on_state=lambda s: on_step(Step("state", s, job_id)))
    local = local_port or endpoint.port
    conn.update(node=endpoint.node, port=endpoint.port, local_port=local, tunnel=endpoint.tunnel_command(login, local))
    if cfg.service == "jupyter":
        conn["url"] = jupyter.url(local, token)
    elif cfg.service == "ssh":
        assert host_key is not None
        conn.update(ssh.connection(cfg.name, state_dir, host_key, endpoint, login))
    else:
        assert watch is not None
        conn.update(url=watch.url, tunnel_name=code.tunnel_name(cfg.name), login_prompt=watch.login)
        conn.pop("tunnel")  # the VS Code tunnel service carries the traffic: no ssh -L
    write_private(state_dir / CONNECTION_FILE, conn)
    return conn


def stop(state_dir: Path, conn: dict[str, Any], wait_s: float = 60.0) -> str:
    """Cancel the job and forget the session's secrets; returns what happened."""
    what = dev_sessions.stop_job(str(conn["job_id"]), wait_s)
    forget(state_dir, (ENDPOINT_FILE, *ssh.FILES))
    return what
