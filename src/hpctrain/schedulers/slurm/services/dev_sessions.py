"""A dev session on Slurm beside its job (which services.py renders, submits and starts): whether its environment
has JupyterLab, whether a session of its name still runs, how to reach it, its row in `dev list` (state, age, idle
time), and cancelling its job."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.servers import jupyter, ssh
from hpctrain.servers.sessions import CONNECTION_FILE, DevConfig, SessionView, read_connection, read_token, session_dir


def check_program(cfg: DevConfig, environment: Any, environ: Mapping[str, str] = os.environ) -> None:
    """Refuse, before queueing, a JupyterLab session whose environment has no JupyterLab: the job would wait in the
    queue only to fail with `jupyter: not found`. sbatch passes this shell's PATH on, plus the --venv's or conda
    prefix's bin/ (as `submit` checks its programs); with modules or a container the PATH is not known here."""
    from hpctrain.extras import install_command
    from hpctrain.schedulers.slurm.batch.environments import get_environment

    if cfg.service != "jupyter":
        return
    dirs = get_environment(environment).search_path(environ.get("PATH", os.defpath))
    if dirs is None or shutil.which("jupyter-lab", path=os.pathsep.join(os.path.expanduser(d) for d in dirs)):
        return
    where = (
        f"{dirs[0]} or this shell's PATH"
        if environment.kind in ("venv", "conda")
        else "this shell's PATH, which the job inherits"
    )
    raise UserError(
        f"JupyterLab is not in the session's environment (no jupyter-lab on {where}), so the job would fail "
        f"with `jupyter: not found`: install it there ({install_command('jupyter')}), name the environment "
        "that has it (--venv DIR or --conda-env PREFIX), or use --service ssh"
    )


def refuse_running(state_dir: Path) -> None:
    """A session of this name that still runs must be stopped first; a stale one is cleared away."""
    conn = read_connection(state_dir)
    if conn is None:
        return
    if _alive(conn):
        where = f"job {conn.get('job_id')}" if conn.get("scheduler") == "slurm" else f"pod {conn.get('pod')}"
        raise UserError(
            f"dev session {state_dir.name} is already running ({where}): use it (`hpctrain dev list`) "
            f"or stop it first (`hpctrain dev stop {state_dir.name}`)"
        )
    (state_dir / CONNECTION_FILE).unlink(missing_ok=True)


def _alive(conn: dict[str, Any]) -> bool:
    if conn.get("scheduler") != "slurm":
        return True  # Kubernetes: the pod's name is taken until it is deleted; create() says so
    from hpctrain.schedulers.slurm.queries.job_states import get_job

    info = get_job(str(conn.get("job_id")))
    return info is not None and not info.finished


def instructions(cfg: DevConfig, conn: dict[str, Any], root: Path | None = None) -> list[str]:
    """How to reach the session, as `dev start` prints it."""
    if cfg.service == "code":
        lines = [
            f"\nThe VS Code tunnel {conn['tunnel_name']} is up (job {conn['job_id']} on {conn['node']}). Open:",
            f"  {conn['url']}",
            f"or in VS Code: Remote Explorer > Tunnels > {conn['tunnel_name']} (signed in with the same account)",
        ]
        if conn.get("login_prompt"):
            lines.append(f"(it asked you to sign in: {conn['login_prompt']})")
    elif cfg.service == "ssh":
        lines = [
            f"\nsshd is up on {conn['node']}:{conn['port']} (job {conn['job_id']}). Log in through the login node:",
            f"  {conn['ssh']}",
            f"Its host key, made for this session: {conn['host_key_fingerprint']} (ED25519). For VS Code Remote-SSH, "
            f"add to ~/.ssh/config:\n",
            conn["ssh_config"],
            f"and to ~/.ssh/known_hosts:\n  {conn['known_hosts']}\nthen connect to {ssh.alias(cfg.name)}.",
            f"(or, with a tunnel: {conn['tunnel']}, then ssh -p {conn['local_port']} {conn['user']}@localhost)",
        ]
    else:
        lines = [
            f"\n{cfg.service} is up on {conn['node']}:{conn['port']} (job {conn['job_id']}). On your machine, "
            "open the tunnel:",
            f"  {conn['tunnel']}",
            f"then open:\n  {conn['url']}",
        ]
    return lines + [
        f"Details (private): {session_dir(cfg.name, root) / CONNECTION_FILE}",
        f"Stop it when done, so that it stops holding the node: hpctrain dev stop {cfg.name}",
    ]


def view(state_dir: Path, conn: dict[str, Any], probe: bool = True) -> SessionView:
    """The session's row in `dev list`: the job's state and age, and Jupyter's idle time when `probe` reaches it."""
    from hpctrain.schedulers.slurm.queries.job_states import GONE, TERMINAL_STATES, get_job

    job_id = str(conn.get("job_id"))
    info = get_job(job_id)
    state = info.state if info else GONE
    age = info.elapsed_s if info else None
    endpoint = f"{conn['node']}:{conn['port']}" if conn.get("node") else None
    idle = None
    if probe and state == "RUNNING" and conn.get("service") == "jupyter" and conn.get("node"):
        idle = jupyter.idle_seconds(conn["node"], int(conn["port"]), read_token(state_dir))
    return SessionView(
        str(conn.get("name", state_dir.name)),
        "slurm",
        job_id,
        state,
        age,
        endpoint,
        idle,
        conn,
        ended=state == GONE or state in TERMINAL_STATES,
    )


def stop_job(job_id: str, wait_s: float) -> str:
    from hpctrain.schedulers.slurm.commands import poll_until
    from hpctrain.schedulers.slurm.queries.job_states import cancel, get_job

    info = get_job(job_id)
    if info is None or info.finished:
        return f"job {job_id} had already ended"
    cancel(job_id)
    info, ended = poll_until(lambda: get_job(job_id), lambda i: i is None or i.finished, timeout_s=wait_s)
    if not ended and info is not None:
        return f"job {job_id} cancelled; Slurm is still stopping it ({info.state})"
    return f"job {job_id} cancelled; its node is free"
