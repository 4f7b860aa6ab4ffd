"""What every service needs, whatever the scheduler: a private state directory, its files, and readiness checks."""

from __future__ import annotations

import json
import os
import shlex
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.fsutil import write_atomic

HOME_ENV = "HPCTRAIN_HOME"
"""Where hpctrain keeps the state of dev sessions and cluster TensorBoards (default ~/.hpctrain). Jobs write into
it from the compute node, so it must be on a file system the login and compute nodes share (home usually is)."""


def state_root(kind: str, environ: dict[str, str] | None = None) -> Path:
    environ = dict(os.environ) if environ is None else environ
    base = Path(environ.get(HOME_ENV) or Path.home() / ".hpctrain").expanduser()
    return base / kind


def private_dir(path: Path) -> Path:
    """Create `path` (and parents) and make it 0700: it will hold tokens."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def write_private(path: Path, data: Any) -> None:
    """Write text or JSON to a 0600 file, atomically; the temporary file is created 0600 too."""
    text = data if isinstance(data, str) else json.dumps(data, indent=2, sort_keys=True) + "\n"
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.close(fd)
    write_atomic(path, text.encode("utf-8"), temporary=tmp)
    path.chmod(0o600)


def http_get(url: str, token: str | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a GET; status 0 when nothing answers. A token goes in the Authorization header, never
    in the URL, so it stays out of proxies' and servers' access logs."""
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # http URL we built
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, b""
    except (urllib.error.URLError, OSError, ValueError):
        return 0, b""


def tcp_banner(host: str, port: int, timeout: float = 5.0) -> bytes:
    """The first bytes a TCP server sends (an sshd says `SSH-2.0-...`); b"" when it does not answer."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            return conn.recv(64)
    except OSError:
        return b""


def login_host() -> str:
    """This machine's name as users reach it (the login node hpctrain runs on)."""
    name = socket.getfqdn()
    return name if name and name not in ("localhost", "localhost.localdomain") else socket.gethostname()


@dataclass(frozen=True)
class Endpoint:
    """Where a service listens: `host:port` as seen from the login node."""

    node: str
    port: int

    def tunnel_command(self, login: str, local_port: int | None = None) -> str:
        """The exact `ssh -L` command that forwards localhost:LOCAL on the user's machine to the service."""
        local = local_port or self.port
        return shlex.join(["ssh", "-N", "-L", f"{local}:{self.node}:{self.port}", login])
