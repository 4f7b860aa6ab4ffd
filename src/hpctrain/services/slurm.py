"""A service in a Slurm batch job: render the script (pure), submit it (thin), wait until the server answers.

The job picks a free port on its node, writes `endpoint.json` (job id, node, port) into the service's state
directory, and starts the server as a job step, so that containers (apptainer, pyxis) and the environment
strategies of hpctrain.launch apply exactly as for training. The script runs with `umask 077`: everything it
writes is private to the user. Secrets are never on a command line: the script reads them from 0600 files into
environment variables the server reads (visible only to the user, unlike argv in `ps`).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from hpctrain.errors import UserError
from hpctrain.schedulers.slurm.environments import get_environment
from hpctrain.distributed.ports import PORT_BASE, PORT_SPAN, PORT_TRIES
from hpctrain.jobs.spec import EnvironmentSpec, JobSpec, Resources
from hpctrain.schedulers.slurm.render import sbatch_directives, step_command
from hpctrain.schedulers.slurm.render import submit as sbatch_submit
from hpctrain.services.common import Endpoint, read_json

ENDPOINT_FILE = "endpoint.json"


@dataclass(frozen=True)
class ServiceJob:
    """One server process on one node. `command` runs inside the job step, where $HPCTRAIN_PORT holds the
    chosen port; `setup` are trusted shell lines (rendered by hpctrain, values quoted) run before it."""

    name: str
    state_dir: str
    command: tuple[str, ...]
    resources: Resources = field(default_factory=Resources)
    environment: EnvironmentSpec = field(default_factory=EnvironmentSpec)
    setup: tuple[str, ...] = ()
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    port: int | None = None
    """A fixed port; None: a free one from a random start."""

    def job_spec(self) -> JobSpec:
        """The JobSpec whose #SBATCH lines and srun step this service uses (validates every value)."""
        return JobSpec(
            command=self.command, name=self.name, partition=self.partition, account=self.account, time=self.time,
            resources=replace(self.resources, nodes=1, nproc_per_node=1), environment=self.environment,
            launcher="single", output=str(Path(self.state_dir) / "slurm-%j.out"), signal_grace=0,
        )


def port_lines(port: int | None) -> list[str]:
    if port is not None:
        return [f"port={int(port)}"]
    return [
        "# A random start, then up past ports in use (another session on this node).",
        f"port=$(({PORT_BASE} + RANDOM % {PORT_SPAN}))",
        "tries=0",
        'while (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null; do',
        "    port=$((port + 1)); tries=$((tries + 1))",
        f'    if [ "$tries" -ge {PORT_TRIES} ]; then echo "hpctrain: no free port found on $(hostname)" >&2; exit 1; fi',
        "done",
    ]


def render_service_script(service: ServiceJob) -> str:
    """The batch script. Pure: the same ServiceJob gives the same text."""
    job = service.job_spec()
    env = get_environment(job.environment)
    state = shlex.quote(service.state_dir)
    out = ["#!/bin/bash", f"# Rendered by hpctrain: service {service.name}.",
           "# The server's command is single-quoted on purpose: $HPCTRAIN_PORT expands in the job step.",
           "# shellcheck disable=SC2016"]
    out += sbatch_directives(job)
    out += ["", "set -uo pipefail", "umask 077", f"state_dir={state}",
            "# slurmd created the output file before this script ran: make it private too.",
            'chmod 600 "$state_dir/slurm-${SLURM_JOB_ID}.out" 2>/dev/null || true', ""]
    out += env.setup_lines()
    out += port_lines(service.port)
    out += ["export HPCTRAIN_PORT=\"$port\"", *service.setup, ""]
    out += [
        "# Where the server listens, for hpctrain on the login node (written atomically).",
        "node=\"${SLURMD_NODENAME:-$(hostname)}\"",
        f'printf \'{{"job_id": "%s", "node": "%s", "port": %d}}\\n\' "$SLURM_JOB_ID" "$node" "$port" > "$state_dir/.{ENDPOINT_FILE}.tmp"',
        f'mv "$state_dir/.{ENDPOINT_FILE}.tmp" "$state_dir/{ENDPOINT_FILE}"',
        'echo "hpctrain: serving on ${node}:${port} (job ${SLURM_JOB_ID})"',
        "",
        "step_pid=\"\"",
        "trap 'if [ -n \"$step_pid\" ]; then kill -TERM \"$step_pid\" 2>/dev/null; fi' TERM INT",
        " ".join(step_command(job)) + " &",
        "step_pid=$!",
        'wait "$step_pid"; status=$?',
        "# A trap interrupts the first wait: wait again while the step stops.",
        'if kill -0 "$step_pid" 2>/dev/null; then wait "$step_pid"; status=$?; fi',
        f'rm -f "$state_dir/{ENDPOINT_FILE}"',
        'exit "$status"',
    ]
    return "\n".join(out) + "\n"


def submit(service: ServiceJob, script: str) -> str:
    """sbatch the script; returns the job id."""
    return sbatch_submit(service.job_spec(), script)


def read_endpoint(state_dir: Path, job_id: str) -> Endpoint | None:
    data = read_json(state_dir / ENDPOINT_FILE)
    if not data or str(data.get("job_id")) != str(job_id):
        return None
    try:
        return Endpoint(node=str(data["node"]), port=int(data["port"]))
    except (KeyError, TypeError, ValueError):
        return None


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
    from hpctrain.schedulers.slurm.jobs import get_job

    deadline = time.monotonic() + timeout_s
    last_state = None
    while True:
        info = get_job(job_id)
        state = info.state if info is not None else "GONE"
        if state != last_state and on_state is not None:
            on_state(state if not (info and info.reason and info.pending) else f"{state} ({info.reason})")
        last_state = state
        if info is None or info.finished:
            raise UserError(f"job {job_id} ended ({state}) before its server answered:\n{output_tail(state_dir, job_id)}")
        endpoint = read_endpoint(state_dir, job_id) if state == "RUNNING" else None
        if endpoint is not None and ready(endpoint):
            return endpoint
        if time.monotonic() >= deadline:
            raise UserError(f"job {job_id} is {state} but its server did not answer within {timeout_s:g} s; it is left "
                            f"running: wait longer with --wait, look at {state_dir}/slurm-{job_id}.out, or stop it")
        time.sleep(poll_s)


def output_tail(state_dir: Path, job_id: str, lines: int = 15) -> str:
    path = state_dir / f"slurm-{job_id}.out"
    try:
        text = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return f"(no output file {path})"
    return "\n".join(f"  | {line}" for line in text[-lines:])
