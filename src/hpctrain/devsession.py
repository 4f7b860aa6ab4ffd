"""Interactive development sessions: JupyterLab (or sshd) on a compute node or in a pod, reached through a tunnel.

    cfg = DevConfig(name="explore", cpus=4, gpus_per_node=1, mem="16G", environment=EnvironmentSpec("venv", venv="~/venvs/t"))
    script = render_dev_script(cfg, state_dir)       # pure: what `hpctrain dev start --dry-run` prints
    session = start_slurm(cfg, ...)                  # submit, wait until the server answers with the token
    sessions = list_sessions(root)                   # state, age, idle time from Jupyter's /api/status
    stop(session)                                    # scancel (or delete the pod): the node is free again

State lives in HPCTRAIN_HOME/dev/NAME (0700): `token` and `connection.json` (0600), the batch script, the job's
output, and `endpoint.json` written by the job. The token is made here (secrets.token_urlsafe), read by the job
from its 0600 file into JUPYTER_TOKEN, and never appears on a command line.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.jobs.spec import EnvironmentSpec, Resources
from hpctrain.services import slurm as service_slurm
from hpctrain.services.common import Endpoint, http_get, private_dir, read_json, state_root, tcp_banner, write_private

SERVICES = ("jupyter", "ssh")
CONNECTION_FILE = "connection.json"
TOKEN_FILE = "token"
JUPYTER_POD_PORT = 8888
DEFAULT_TIME = "04:00:00"
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")

JUPYTER_COMMAND = (
    "bash", "-c",
    'root=""; if [ "$(id -u)" = 0 ]; then root=--allow-root; fi; '
    'exec jupyter lab --no-browser --ip=0.0.0.0 --port="$HPCTRAIN_PORT" --port-retries=0 $root',
)
SSHD_COMMAND = (
    "bash", "-c",
    'exec "$(command -v sshd || echo /usr/sbin/sshd)" -D -e -f /dev/null -p "$HPCTRAIN_PORT" '
    '-h "$HPCTRAIN_STATE_DIR/ssh_host_ed25519_key" -o PidFile=none -o UsePAM=no '
    '-o PasswordAuthentication=no -o AuthorizedKeysFile=.ssh/authorized_keys',
)


@dataclass(frozen=True)
class DevConfig:
    name: str
    service: str = "jupyter"
    resources: Resources = field(default_factory=lambda: Resources(cpus_per_task=2))
    environment: EnvironmentSpec = field(default_factory=EnvironmentSpec)
    time: str | None = DEFAULT_TIME
    partition: str | None = None
    account: str | None = None

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.service not in SERVICES:
            raise UserError(f"--service {self.service!r} is unknown: use jupyter or ssh")

    @property
    def job_name(self) -> str:
        return f"dev-{self.name}"


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise UserError(f"session name {name!r}: use lower-case letters, digits and -, at most 40 characters (e.g. explore-1)")
    return name


def session_dir(name: str, root: Path | None = None) -> Path:
    return (root or state_root("dev")) / check_name(name)


# ---- Slurm --------------------------------------------------------------------------------------------------


def service_job(cfg: DevConfig, state_dir: Path) -> service_slurm.ServiceJob:
    setup = [f"export HPCTRAIN_STATE_DIR=\"$state_dir\""]
    if cfg.service == "jupyter":
        setup += [
            "# The token comes from a private file into the environment: never on a command line.",
            f'JUPYTER_TOKEN="$(cat "$state_dir/{TOKEN_FILE}")"',
            "export JUPYTER_TOKEN",
            'export JUPYTER_RUNTIME_DIR="$state_dir/runtime"',
        ]
        command = JUPYTER_COMMAND
    else:
        setup += [
            "# A host key for this session only; log in with your own key (~/.ssh/authorized_keys).",
            'if [ ! -f "$state_dir/ssh_host_ed25519_key" ]; then',
            '    ssh-keygen -q -t ed25519 -N "" -f "$state_dir/ssh_host_ed25519_key"',
            "fi",
        ]
        command = SSHD_COMMAND
    return service_slurm.ServiceJob(
        name=cfg.job_name, state_dir=str(state_dir), command=command, resources=cfg.resources,
        environment=cfg.environment, setup=tuple(setup), partition=cfg.partition, account=cfg.account, time=cfg.time,
    )


def render_dev_script(cfg: DevConfig, state_dir: Path) -> str:
    """The batch script of a session. Pure."""
    return service_slurm.render_service_script(service_job(cfg, state_dir))


def jupyter_ready(token: str) -> Callable[[Endpoint], bool]:
    return lambda ep: http_get(f"http://{ep.node}:{ep.port}/api/status", token)[0] == 200


def ssh_ready(ep: Endpoint) -> bool:
    return tcp_banner(ep.node, ep.port).startswith(b"SSH-")


def _refuse_running(state_dir: Path) -> None:
    """A session of this name that still runs must be stopped first; a stale one is cleared away."""
    conn = read_json(state_dir / CONNECTION_FILE)
    if conn is None:
        return
    if _alive(conn):
        where = f"job {conn.get('job_id')}" if conn.get("scheduler") == "slurm" else f"pod {conn.get('pod')}"
        raise UserError(f"dev session {state_dir.name} is already running ({where}): use it (`hpctrain dev list`) "
                        f"or stop it first (`hpctrain dev stop {state_dir.name}`)")
    (state_dir / CONNECTION_FILE).unlink(missing_ok=True)


def _alive(conn: dict[str, Any]) -> bool:
    if conn.get("scheduler") != "slurm":
        return True  # Kubernetes: the pod's name is taken until it is deleted; create() says so
    from hpctrain.schedulers.slurm.jobs import get_job

    info = get_job(str(conn.get("job_id")))
    return info is not None and not info.finished


def start_slurm(cfg: DevConfig, root: Path | None, login: str, wait_s: float, local_port: int | None,
                say: Callable[[str], None] = print) -> dict[str, Any]:
    """Submit the session, wait until its server answers, record and return its connection details."""
    state_dir = session_dir(cfg.name, root)
    private_dir(state_dir.parent)
    private_dir(state_dir)
    _refuse_running(state_dir)
    token = secrets.token_urlsafe(32)
    write_private(state_dir / TOKEN_FILE, token + "\n")
    for stale in (service_slurm.ENDPOINT_FILE,):
        (state_dir / stale).unlink(missing_ok=True)
    service = service_job(cfg, state_dir)
    script = service_slurm.render_service_script(service)
    write_private(state_dir / "dev.sbatch", script)
    job_id = service_slurm.submit(service, script)
    conn: dict[str, Any] = {"name": cfg.name, "scheduler": "slurm", "service": cfg.service, "job_id": job_id,
                            "login_host": login, "created": _now()}
    write_private(state_dir / CONNECTION_FILE, conn)
    say(f"dev session {cfg.name}: job {job_id} submitted; waiting for {cfg.service} to answer (up to {wait_s:g} s)")
    ready = jupyter_ready(token) if cfg.service == "jupyter" else ssh_ready
    endpoint = service_slurm.wait_ready(state_dir, job_id, ready, wait_s, on_state=lambda s: say(f"  job {job_id}: {s}"))
    local = local_port or endpoint.port
    conn.update(node=endpoint.node, port=endpoint.port, local_port=local, tunnel=endpoint.tunnel_command(login, local))
    if cfg.service == "jupyter":
        conn["url"] = f"http://localhost:{local}/lab?token={token}"
    else:
        conn["ssh"] = f"ssh -p {local} localhost"
    write_private(state_dir / CONNECTION_FILE, conn)
    return conn


# ---- Kubernetes ---------------------------------------------------------------------------------------------


def service_pod(cfg: DevConfig) -> Any:
    from hpctrain.services.kubernetes import ServicePod

    if cfg.service != "jupyter":
        raise UserError("--service ssh runs on Slurm only: on Kubernetes use `kubectl exec -it POD -- bash`")
    if cfg.environment.kind != "none":
        raise UserError("--conda-env/--venv/--module apply to Slurm: on Kubernetes the --image is the environment")
    command = ("jupyter", "lab", "--no-browser", "--ip=0.0.0.0", f"--port={JUPYTER_POD_PORT}", "--port-retries=0")
    return ServicePod(name=cfg.job_name, kind="dev", command=command, port=JUPYTER_POD_PORT, resources=cfg.resources,
                      time=cfg.time, secret_env=(("JUPYTER_TOKEN", "token"),))


def render_dev_pod(cfg: DevConfig, options: Any) -> dict[str, Any]:
    """The session's Pod manifest (its token comes from the Secret of the same name). Pure."""
    from hpctrain.services.kubernetes import render_pod

    return render_pod(service_pod(cfg), options)


def start_kubernetes(cfg: DevConfig, options: Any, core: Any, root: Path | None, wait_s: float,
                     local_port: int | None, say: Callable[[str], None] = print) -> dict[str, Any]:
    from hpctrain.services import kubernetes as k8s

    state_dir = session_dir(cfg.name, root)
    private_dir(state_dir.parent)
    private_dir(state_dir)
    spec = service_pod(cfg)
    pod = k8s.render_pod(spec, options)
    token = secrets.token_urlsafe(32)
    k8s.create(core, pod, k8s.render_secret(spec, options, {"token": token}))
    write_private(state_dir / TOKEN_FILE, token + "\n")
    local = local_port or JUPYTER_POD_PORT
    conn: dict[str, Any] = {
        "name": cfg.name, "scheduler": "kubernetes", "service": cfg.service, "namespace": options.namespace,
        "pod": spec.name, "created": _now(), "local_port": local,
        "port_forward": k8s.port_forward_command(options.namespace, spec.name, local, JUPYTER_POD_PORT),
        "url": f"http://localhost:{local}/lab?token={token}",
    }
    write_private(state_dir / CONNECTION_FILE, conn)
    say(f"dev session {cfg.name}: pod {spec.name} created in namespace {options.namespace}")
    deadline = time.monotonic() + wait_s
    while wait_s > 0:
        state = k8s.pod_state(core.read_namespaced_pod(spec.name, options.namespace))
        if state == "Running":
            break
        if state in ("Succeeded", "Failed") or time.monotonic() >= deadline:
            raise UserError(f"pod {spec.name} is {state} after {wait_s:g} s: see `kubectl describe pod -n "
                            f"{options.namespace} {spec.name}`; stop it with `hpctrain dev stop {cfg.name} --scheduler kubernetes`")
        time.sleep(2.0)
    return conn


# ---- list and stop ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionView:
    name: str
    scheduler: str
    where: str
    """job id or namespace/pod"""
    state: str
    age_s: int | None
    endpoint: str | None
    idle_s: int | None
    """Seconds since Jupyter's last activity (kernels, terminals, API use); None when unknown."""
    connection: dict[str, Any]


def recorded_schedulers(root: Path | None = None) -> set[str]:
    root = root or state_root("dev")
    return {str((read_json(p) or {}).get("scheduler")) for p in root.glob(f"*/{CONNECTION_FILE}")}


def list_sessions(root: Path | None = None, core: Any = None, probe: bool = True) -> list[SessionView]:
    """Every session recorded under root, with its live state (and idle time when `probe` reaches Jupyter)."""
    root = root or state_root("dev")
    out = []
    for conn_path in sorted(root.glob(f"*/{CONNECTION_FILE}")):
        conn = read_json(conn_path)
        if conn is None:
            continue
        out.append(_view(conn_path.parent, conn, core, probe))
    return out


def _view(state_dir: Path, conn: dict[str, Any], core: Any, probe: bool) -> SessionView:
    name = str(conn.get("name", state_dir.name))
    if conn.get("scheduler") == "kubernetes":
        from hpctrain.services.kubernetes import pod_state

        where = f"{conn.get('namespace')}/{conn.get('pod')}"
        state, age = "UNKNOWN", None
        if core is not None:
            from kubernetes.client.rest import ApiException

            try:
                pod = core.read_namespaced_pod(conn["pod"], conn["namespace"])
                state = pod_state(pod).upper()
                created = pod.metadata.creation_timestamp
                age = int((dt.datetime.now(dt.timezone.utc) - created).total_seconds()) if created else None
            except ApiException as err:
                state = "GONE" if err.status == 404 else f"UNKNOWN ({err.status})"
        return SessionView(name, "kubernetes", where, state, age, None, None, conn)
    from hpctrain.schedulers.slurm.jobs import get_job

    job_id = str(conn.get("job_id"))
    info = get_job(job_id)
    state = info.state if info else "GONE"
    age = info.elapsed_s if info else None
    endpoint = f"{conn['node']}:{conn['port']}" if conn.get("node") else None
    idle = None
    if probe and state == "RUNNING" and conn.get("service") == "jupyter" and conn.get("node"):
        idle = jupyter_idle_seconds(conn["node"], int(conn["port"]), _token(state_dir))
    return SessionView(name, "slurm", job_id, state, age, endpoint, idle, conn)


def jupyter_idle_seconds(host: str, port: int, token: str | None, now: dt.datetime | None = None) -> int | None:
    """Seconds since the server's last_activity (Jupyter's /api/status: the latest of kernel, terminal and API
    activity); None when it does not answer."""
    status, body = http_get(f"http://{host}:{port}/api/status", token)
    if status != 200:
        return None
    try:
        last = parse_iso(json.loads(body)["last_activity"])
    except (ValueError, KeyError, TypeError):
        return None
    now = now or dt.datetime.now(dt.timezone.utc)
    return max(0, int((now - last).total_seconds()))


def parse_iso(text: str) -> dt.datetime:
    """Jupyter's timestamps: ISO 8601 with `Z` or an offset."""
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def _token(state_dir: Path) -> str | None:
    try:
        return (state_dir / TOKEN_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return None


def stop(name: str, root: Path | None = None, core: Any = None, wait_s: float = 60.0) -> str:
    """Cancel the job (or delete the pod and its secret) and forget the session's secrets; returns what happened."""
    state_dir = session_dir(name, root)
    conn = read_json(state_dir / CONNECTION_FILE)
    if conn is None:
        raise UserError(f"no dev session named {name!r}: see `hpctrain dev list`")
    if conn.get("scheduler") == "kubernetes":
        from hpctrain.services.kubernetes import delete

        if core is None:
            raise UserError(f"dev session {name} runs on Kubernetes: add --scheduler kubernetes")
        found = delete(core, conn["namespace"], conn["pod"])
        what = f"pod {conn['namespace']}/{conn['pod']} deleted" if found else f"pod {conn['pod']} was already gone"
    else:
        what = _stop_job(str(conn["job_id"]), wait_s)
    _forget(state_dir)
    return what


def _stop_job(job_id: str, wait_s: float) -> str:
    from hpctrain.schedulers.slurm.jobs import cancel, get_job

    info = get_job(job_id)
    if info is None or info.finished:
        return f"job {job_id} had already ended"
    cancel(job_id)
    deadline = time.monotonic() + wait_s
    while info is not None and not info.finished and time.monotonic() < deadline:
        time.sleep(1.0)
        info = get_job(job_id)
    if info is not None and not info.finished:
        return f"job {job_id} cancelled; Slurm is still stopping it ({info.state})"
    return f"job {job_id} cancelled; its node is free"


def _forget(state_dir: Path) -> None:
    for name in (CONNECTION_FILE, TOKEN_FILE, service_slurm.ENDPOINT_FILE):
        (state_dir / name).unlink(missing_ok=True)
    shutil.rmtree(state_dir / "runtime", ignore_errors=True)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
