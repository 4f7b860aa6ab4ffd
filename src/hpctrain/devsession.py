"""Interactive development sessions: JupyterLab, an sshd of the user's own, or a VS Code tunnel on a compute node
(JupyterLab also in a pod), reached through a tunnel.

    cfg = DevConfig(name="explore", cpus=4, gpus_per_node=1, mem="16G", environment=EnvironmentSpec("venv", venv="~/venvs/t"))
    script = render_dev_script(cfg, state_dir)       # pure: what `hpctrain dev start --dry-run` prints
    session = start_slurm(cfg, ...)                  # submit, wait until the server answers with the token
    sessions = list_sessions(root)                   # state, age, idle time from Jupyter's /api/status
    stop(session)                                    # scancel (or delete the pod): the node is free again

State lives in HPCTRAIN_HOME/dev/NAME (0700): `token` and `connection.json` (0600), the batch script, the job's
output, and `endpoint.json` written by the job. The token is made here (secrets.token_urlsafe), read by the job
from its 0600 file into JUPYTER_TOKEN, and never appears on a command line.

--service ssh: start makes a host key for the session (ssh-keygen, on the login node, so that the host key is known
before the first login: `known_hosts` and the printed fingerprint), copies the user's public key (--ssh-key, else
the first of ~/.ssh/id_ed25519.pub, id_ecdsa.pub, id_rsa.pub) to `authorized_keys`, and writes `sshd_config`; the
job runs `sshd -D -f sshd_config` as the user on a free port (as root too, where clusters run jobs as root: then
only that user may log in, with a key).

--service code: the job runs `code tunnel --accept-server-license-terms --name NAME` (the VS Code CLI, which must be
on the compute node's PATH); start shows its device-login line and waits for its vscode.dev URL.
"""

from __future__ import annotations

import datetime as dt
import os
import getpass
import hashlib
import json
import re
import secrets
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.fsutil import FileRefused, read_regular
from hpctrain.jobs.spec import EnvironmentSpec, Resources
from hpctrain.services import slurm as service_slurm
from hpctrain.services.common import Endpoint, http_get, private_dir, read_json, state_root, tcp_banner, write_private

SERVICES = ("jupyter", "ssh", "code")
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
    'exec "$(command -v sshd || echo /usr/sbin/sshd)" -D -e -f "$HPCTRAIN_STATE_DIR/sshd_config" -p "$HPCTRAIN_PORT"',
)
CODE_COMMAND = (
    "bash", "-c",
    'if ! command -v code >/dev/null 2>&1; then '
    'echo "hpctrain: the VS Code CLI (code) is not on PATH on $(hostname): install it there (the standalone CLI from '
    'the VS Code download page), load its module with --module, or use --service ssh" >&2; exit 127; fi; '
    'exec code tunnel --accept-server-license-terms --name "$HPCTRAIN_TUNNEL_NAME"',
)
SSH_HOST_KEY = "ssh_host_ed25519_key"
SSH_PUBLIC_KEYS = ("id_ed25519.pub", "id_ecdsa.pub", "id_rsa.pub")
MAX_PUBLIC_KEY_BYTES = 1 << 20  # an authorized_keys-style list of public keys; a key is under 1 KiB
"""Looked for in ~/.ssh, in this order, when --ssh-key is not given."""
CODE_LOGIN_RE = re.compile(r"To grant access to the server, please log into (?P<url>\S+) and use code (?P<code>\S+)")
CODE_URL_RE = re.compile(r"Open this link in your browser (?P<url>https://\S+)")
TUNNEL_NAME_MAX = 20


@dataclass(frozen=True)
class DevConfig:
    name: str
    service: str = "jupyter"
    resources: Resources = field(default_factory=lambda: Resources(cpus_per_task=2))
    environment: EnvironmentSpec = field(default_factory=EnvironmentSpec)
    time: str | None = DEFAULT_TIME
    partition: str | None = None
    account: str | None = None
    port: int | None = None
    """The server's port: None picks a free one on Slurm and 8888 in a pod."""
    ssh_key: Path | None = None
    """--service ssh: the public key to log in with; None: the first of ~/.ssh/SSH_PUBLIC_KEYS."""

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.service not in SERVICES:
            raise UserError(f"--service {self.service!r} is unknown: use {', '.join(SERVICES)}")
        if self.port is not None and not 1024 <= self.port <= 65535:
            raise UserError(f"--port {self.port}: use a port from 1024 to 65535")
        if self.ssh_key is not None and self.service != "ssh":
            raise UserError("--ssh-key is for --service ssh: drop it, or add --service ssh")

    @property
    def job_name(self) -> str:
        return f"dev-{self.name}"


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise UserError(f"session name {name!r}: use lower-case letters, digits and -, at most 40 characters (e.g. explore-1)")
    return name


def session_dir(name: str, root: Path | None = None) -> Path:
    return (root or state_root("dev")) / check_name(name)


def tunnel_name(session: str) -> str:
    """The VS Code tunnel's name: `dev-SESSION`, cut to the CLI's 20 characters with a short hash of the session
    name in place of the cut, so that two long names stay apart. Session names are [a-z0-9-], valid here too."""
    name = f"dev-{check_name(session)}"
    if len(name) <= TUNNEL_NAME_MAX:
        return name
    digest = hashlib.sha256(session.encode()).hexdigest()[:4]
    return f"{name[:TUNNEL_NAME_MAX - 5].rstrip('-')}-{digest}"


# ---- Slurm --------------------------------------------------------------------------------------------------


def service_job(cfg: DevConfig, state_dir: Path) -> service_slurm.ServiceJob:
    setup = ["export HPCTRAIN_STATE_DIR=\"$state_dir\""]
    if cfg.service == "jupyter":
        setup += [
            "# The token comes from a private file into the environment: never on a command line.",
            f'JUPYTER_TOKEN="$(cat "$state_dir/{TOKEN_FILE}")"',
            "export JUPYTER_TOKEN",
            'export JUPYTER_RUNTIME_DIR="$state_dir/runtime"',
        ]
        command = JUPYTER_COMMAND
    elif cfg.service == "ssh":
        setup += [
            "# sshd run by root wants its privilege-separation folder (made by the package's service unit).",
            'if [ "$(id -u)" = 0 ] && [ ! -d /run/sshd ]; then mkdir -m 0755 /run/sshd; fi',
        ]
        command = SSHD_COMMAND
    else:
        setup += [f"export HPCTRAIN_TUNNEL_NAME={shlex.quote(tunnel_name(cfg.name))}"]
        command = CODE_COMMAND
    return service_slurm.ServiceJob(
        name=cfg.job_name, state_dir=str(state_dir), command=command, resources=cfg.resources,
        environment=cfg.environment, setup=tuple(setup), partition=cfg.partition, account=cfg.account, time=cfg.time,
        port=cfg.port,
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


def find_public_key(given: Path | None, home: Path | None = None) -> Path:
    """--ssh-key, else the first of ~/.ssh/id_ed25519.pub, id_ecdsa.pub, id_rsa.pub; checked to be a public key."""
    if given is None:
        ssh_dir = (home or Path.home()) / ".ssh"
        found = [ssh_dir / n for n in SSH_PUBLIC_KEYS if (ssh_dir / n).is_file()]
        if not found:
            raise UserError(f"no SSH public key in {ssh_dir} ({', '.join(SSH_PUBLIC_KEYS)}): make one with "
                            "`ssh-keygen -t ed25519`, or name yours with --ssh-key FILE.pub")
        given = found[0]
    try:
        text = read_regular(given.expanduser(), MAX_PUBLIC_KEY_BYTES).decode("utf-8")
    except FileRefused as err:
        raise UserError(f"--ssh-key {given}: {err.reason}: give the public key file (FILE.pub)") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"--ssh-key {given}: cannot read it ({err}): give the public key file (FILE.pub)") from None
    keys = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if "PRIVATE KEY" in text or not keys or not all(_PUBKEY_RE.match(k) for k in keys):
        raise UserError(f"--ssh-key {given}: not an OpenSSH public key: give the .pub file (one line such as "
                        "`ssh-ed25519 AAAA... you@laptop`), never the private key")
    return given.expanduser()


_PUBKEY_RE = re.compile(r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-\S+|sk-\S+)\s+[A-Za-z0-9+/=]+(\s.*)?$")


def render_sshd_config(state_dir: Path, user: str) -> str:
    """The session's sshd_config. Pure. Only `user` may log in, only with the keys in `authorized_keys`.
    StrictModes is off because it checks every folder above the key file up to the home folder, and HPCTRAIN_HOME
    may live elsewhere (scratch): the file is hpctrain's own copy in its 0700 folder."""
    if any(c in str(state_dir) for c in '"\\\n'):
        raise UserError(f"{state_dir}: sshd cannot read a path with quotes, backslashes or newlines: set HPCTRAIN_HOME "
                        "to a plain folder")
    keys = str(state_dir / "authorized_keys").replace("%", "%%")
    return "\n".join([
        "# Rendered by hpctrain for one dev session: an sshd of the user's own, on the job's node.",
        f'HostKey "{state_dir / SSH_HOST_KEY}"',
        f'AuthorizedKeysFile "{keys}"',
        f"AllowUsers {user}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "StrictModes no",
        "UsePAM no",
        "PidFile none",
        "PrintMotd no",
        "X11Forwarding no",
        "AllowTcpForwarding yes",
        "Subsystem sftp internal-sftp",
        "",
    ])


def _prepare_ssh(cfg: DevConfig, state_dir: Path) -> str:
    """authorized_keys, a fresh host key and sshd_config in the state folder; returns the host's public key line."""
    if shutil.which("ssh-keygen") is None:
        raise UserError("ssh-keygen is not on PATH: install the OpenSSH client (openssh-client), or use --service jupyter")
    public = find_public_key(cfg.ssh_key)
    write_private(state_dir / "authorized_keys", public.read_text(encoding="utf-8").strip() + "\n")
    host_key = state_dir / SSH_HOST_KEY
    for old in (host_key, host_key.with_name(host_key.name + ".pub")):
        old.unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"hpctrain-dev-{cfg.name}", "-f", str(host_key)],
                   check=True, capture_output=True)
    write_private(state_dir / "sshd_config", render_sshd_config(state_dir, getpass.getuser()))
    return host_key.with_name(host_key.name + ".pub").read_text(encoding="utf-8").strip()


def ssh_alias(name: str) -> str:
    return f"hpctrain-dev-{name}"


def ssh_config_snippet(name: str, node: str, port: int, user: str, login: str) -> str:
    """The ~/.ssh/config block for the session (VS Code Remote-SSH reads it too). Pure."""
    lines = [f"Host {ssh_alias(name)}", f"    HostName {node}", f"    Port {port}", f"    User {user}",
             f"    ProxyJump {login}", f"    HostKeyAlias {ssh_alias(name)}"]
    return "\n".join(lines) + "\n"


class CodeTunnelWatch:
    """Readiness of `code tunnel`: its vscode.dev URL in the job's output. Says the device-login line once, as soon
    as it appears, because the URL only comes after the user has logged in."""

    def __init__(self, state_dir: Path, job_id: str, say: Callable[[str], None]) -> None:
        self.path = state_dir / f"slurm-{job_id}.out"
        self.say = say
        self.login: str | None = None
        self.url: str | None = None

    def __call__(self, endpoint: Endpoint) -> bool:
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
        login = CODE_LOGIN_RE.search(text)
        if login and self.login is None:
            self.login = login.group(0)
            self.say(f"  VS Code asks you to log in: open {login['url']} and enter the code {login['code']}")
        url = CODE_URL_RE.search(text)
        self.url = url["url"] if url else None
        return self.url is not None


def check_program(cfg: DevConfig, environ: Mapping[str, str] = os.environ) -> None:
    """Refuse, before queueing, a JupyterLab session whose environment has no JupyterLab: the job would wait in the
    queue only to fail with `jupyter: not found`. sbatch passes this shell's PATH on, plus the --venv's or conda
    prefix's bin/ (as `submit` checks its programs); with modules or a container the PATH is not known here."""
    from hpctrain.extras import install_command
    from hpctrain.schedulers.slurm.environments import get_environment

    if cfg.service != "jupyter":
        return
    dirs = get_environment(cfg.environment).search_path(environ.get("PATH", os.defpath))
    if dirs is None or shutil.which("jupyter-lab", path=os.pathsep.join(os.path.expanduser(d) for d in dirs)):
        return
    where = (f"{dirs[0]} or this shell's PATH" if cfg.environment.kind in ("venv", "conda")
             else "this shell's PATH, which the job inherits")
    raise UserError(f"JupyterLab is not in the session's environment (no jupyter-lab on {where}), so the job would fail "
                    f"with `jupyter: not found`: install it there ({install_command('jupyter')}), name the environment "
                    "that has it (--venv DIR or --conda-env PREFIX), or use --service ssh")


def start_slurm(cfg: DevConfig, root: Path | None, login: str, wait_s: float, local_port: int | None,
                say: Callable[[str], None] = print) -> dict[str, Any]:
    """Submit the session, wait until its server answers, record and return its connection details."""
    check_program(cfg)
    state_dir = session_dir(cfg.name, root)
    private_dir(state_dir.parent)
    private_dir(state_dir)
    _refuse_running(state_dir)
    token = secrets.token_urlsafe(32)
    write_private(state_dir / TOKEN_FILE, token + "\n")
    for stale in (service_slurm.ENDPOINT_FILE,):
        (state_dir / stale).unlink(missing_ok=True)
    host_key = _prepare_ssh(cfg, state_dir) if cfg.service == "ssh" else None
    service = service_job(cfg, state_dir)
    script = service_slurm.render_service_script(service)
    write_private(state_dir / "dev.sbatch", script)
    job_id = service_slurm.submit(service, script)
    conn: dict[str, Any] = {"name": cfg.name, "scheduler": "slurm", "service": cfg.service, "job_id": job_id,
                            "login_host": login, "created": _now()}
    write_private(state_dir / CONNECTION_FILE, conn)
    say(f"dev session {cfg.name}: job {job_id} submitted; waiting for {cfg.service} to answer (up to {wait_s:g} s)")
    watch = CodeTunnelWatch(state_dir, job_id, say) if cfg.service == "code" else None
    ready = {"jupyter": jupyter_ready(token), "ssh": ssh_ready}.get(cfg.service, watch)
    endpoint = service_slurm.wait_ready(state_dir, job_id, ready, wait_s, on_state=lambda s: say(f"  job {job_id}: {s}"))
    local = local_port or endpoint.port
    conn.update(node=endpoint.node, port=endpoint.port, local_port=local, tunnel=endpoint.tunnel_command(login, local))
    if cfg.service == "jupyter":
        conn["url"] = f"http://localhost:{local}/lab?token={token}"
    elif cfg.service == "ssh":
        user = getpass.getuser()
        write_private(state_dir / "known_hosts", f"{ssh_alias(cfg.name)} {' '.join(host_key.split()[:2])}\n")
        conn.update(
            user=user, host_key=host_key, host_key_fingerprint=_fingerprint(state_dir / (SSH_HOST_KEY + ".pub")),
            ssh=shlex.join(["ssh", "-J", login, "-p", str(endpoint.port), f"{user}@{endpoint.node}"]),
            ssh_config=ssh_config_snippet(cfg.name, endpoint.node, endpoint.port, user, login),
            known_hosts=f"{ssh_alias(cfg.name)} {' '.join(host_key.split()[:2])}",
        )
    else:
        assert watch is not None
        conn.update(url=watch.url, tunnel_name=tunnel_name(cfg.name), login_prompt=watch.login)
        conn.pop("tunnel")  # the VS Code tunnel service carries the traffic: no ssh -L
    write_private(state_dir / CONNECTION_FILE, conn)
    return conn


def _fingerprint(public_key: Path) -> str:
    result = subprocess.run(["ssh-keygen", "-l", "-f", str(public_key)], capture_output=True, text=True, check=False)
    words = result.stdout.split()
    return words[1] if len(words) > 1 else "?"


# ---- Kubernetes ---------------------------------------------------------------------------------------------


def service_pod(cfg: DevConfig) -> Any:
    from hpctrain.services.kubernetes import ServicePod

    if cfg.service != "jupyter":
        raise UserError(f"--service {cfg.service} runs on Slurm only: on Kubernetes use --service jupyter, or "
                        "`kubectl exec -it POD -- bash` in a pod of yours")
    if cfg.environment.kind != "none":
        raise UserError("--conda-env/--venv/--module apply to Slurm: on Kubernetes the --image is the environment")
    port = cfg.port or JUPYTER_POD_PORT
    # The command of Slurm sessions: --allow-root where the image runs as root (many PyTorch images do).
    # /api answers without the token: the kubelet's readiness probe needs none.
    return ServicePod(name=cfg.job_name, kind="dev", command=JUPYTER_COMMAND, port=port, resources=cfg.resources,
                      time=cfg.time, secret_env=(("JUPYTER_TOKEN", "token"),), env=(("HPCTRAIN_PORT", str(port)),),
                      ready_path="/api")


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
    local = local_port or spec.port
    conn: dict[str, Any] = {
        "name": cfg.name, "scheduler": "kubernetes", "service": cfg.service, "namespace": options.namespace,
        "pod": spec.name, "created": _now(), "local_port": local,
        "port_forward": k8s.port_forward_command(options.namespace, spec.name, local, spec.port),
        "url": f"http://localhost:{local}/lab?token={token}",
    }
    write_private(state_dir / CONNECTION_FILE, conn)
    say(f"dev session {cfg.name}: pod {spec.name} created in namespace {options.namespace}; waiting until JupyterLab "
        f"is ready (up to {wait_s:g} s)")
    deadline = time.monotonic() + wait_s
    while wait_s > 0:
        live = core.read_namespaced_pod(spec.name, options.namespace)
        state = k8s.pod_state(live)
        if state == "Running" and k8s.pod_ready(live):
            conn["pod_ip"] = live.status.pod_ip
            write_private(state_dir / CONNECTION_FILE, conn)
            break
        if state in ("Succeeded", "Failed", "Terminating"):
            raise UserError(f"pod {spec.name} is {state} before JupyterLab was ready: see `kubectl logs -n "
                            f"{options.namespace} {spec.name}`; forget it with `hpctrain dev stop {cfg.name} --scheduler kubernetes`")
        if time.monotonic() >= deadline:
            raise UserError(f"pod {spec.name} is {state} and not ready after {wait_s:g} s; it is left in place: wait "
                            f"longer with --wait, see `kubectl describe pod -n {options.namespace} {spec.name}`, or stop "
                            f"it with `hpctrain dev stop {cfg.name} --scheduler kubernetes`")
        time.sleep(1.0)
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
    for name in (CONNECTION_FILE, TOKEN_FILE, service_slurm.ENDPOINT_FILE, SSH_HOST_KEY, SSH_HOST_KEY + ".pub",
                 "authorized_keys", "known_hosts", "sshd_config"):
        (state_dir / name).unlink(missing_ok=True)
    shutil.rmtree(state_dir / "runtime", ignore_errors=True)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
