"""Where the console listens, and the lines it prints once to reach it.

Other users of a login node can reach 127.0.0.1, so by default the console listens on a Unix socket in a directory
only its user can enter (mode 0700, checked, never loosened by us: a directory found with other permissions or
another owner is refused), the socket itself made with mode 0600. From a laptop, `ssh -L 8080:SOCKET login-node`
forwards a local port to it. With `--port` it listens on a loopback address (127.0.0.1 unless --host names another
loopback one); any other address is refused with the reason: on it, anyone on the network reaches the console.

We bind the socket here and hand it to the server (uvicorn would make its own socket 0666).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import UserError

SOCKET_DIR_NAME = "hpctrain-web"
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes on Linux, with its NUL
LOOPBACK_NAMES = ("localhost",)


@dataclass(frozen=True)
class Address:
    """A Unix socket path, or a loopback host and port."""

    socket_path: Path | None = None
    host: str = "127.0.0.1"
    port: int | None = None


def new_token() -> str:
    """The secret of one console: 256 random bits, printed once in the URL."""
    return secrets.token_urlsafe(32)


def check_loopback(host: str) -> str:
    """`host` when it is a loopback address (127.0.0.0/8, ::1, localhost); else the UserError that says why not."""
    if host in LOOPBACK_NAMES:
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        address = None  # a name other than localhost: not resolved (it could name any address later)
    if address is None or not address.is_loopback:
        raise UserError(
            f"--host {host} is not a loopback address: anyone who can reach it could try the console, which acts as "
            "you on the cluster; listen on 127.0.0.1 (--port alone) or ::1, or on the default Unix socket and reach "
            "it from elsewhere with `ssh -L`"
        )
    return str(address)


def default_socket_dir(environ: dict[str, str] | None = None) -> Path:
    """$XDG_RUNTIME_DIR/hpctrain-web (a per-user tmpfs the login session owns), else ~/.hpctrain/web."""
    environ = dict(os.environ) if environ is None else environ
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / SOCKET_DIR_NAME
    return Path(environ.get("HOME") or Path.home()) / ".hpctrain" / "web"


def private_dir(path: Path) -> Path:
    """`path` as a directory that only this user can enter: made with mode 0700 when missing; an existing one must
    be a real directory (not a link), owned by this user, with no permission for group or others."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise UserError(f"{path} is not a directory: remove it, or pass --socket PATH in a directory of your own")
    if info.st_uid != os.geteuid():
        raise UserError(f"{path} belongs to another user: pass --socket PATH in a directory of your own")
    if info.st_mode & 0o077:
        raise UserError(
            f"{path} can be entered by other users (mode {stat.S_IMODE(info.st_mode):o}): `chmod 700 {path}`, "
            "then start the console again"
        )
    return path


def socket_address(path: Path | None, environ: dict[str, str] | None = None) -> Address:
    """The Unix socket to listen on: `path`, else one named after this process in default_socket_dir; its directory
    made or checked private."""
    if path is None:
        path = default_socket_dir(environ) / f"console-{os.getpid()}.sock"
    path = Path(os.path.abspath(path))
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise UserError(f"the socket path {path} is longer than {MAX_SOCKET_PATH} bytes: pass a shorter --socket PATH")
    private_dir(path.parent)
    return Address(socket_path=path)


def bind(address: Address) -> socket.socket:
    """The listening socket: a Unix socket with mode 0600 (a stale one of ours at the path replaced), or TCP."""
    if address.socket_path is not None:
        path = address.socket_path
        if path.is_socket():
            path.unlink()  # a console that ended without cleaning up; the directory is ours alone
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(str(path))
        except OSError as err:
            sock.close()
            raise UserError(f"cannot listen on {path}: {err.strerror}; pass another --socket PATH") from None
        finally:
            os.umask(old)
    else:
        family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address.host, address.port))
        except OSError as err:
            sock.close()
            raise UserError(
                f"cannot listen on {address.host} port {address.port}: {err.strerror}; choose another --port"
            ) from None
    sock.listen(128)
    sock.set_inheritable(False)
    return sock


def how_to_reach(address: Address, token: str, login_host: str | None = None) -> list[str]:
    """What the console prints once: where it listens and the URL with the token (as Jupyter does)."""
    if address.socket_path is not None:
        host = login_host or socket.gethostname()
        return [
            f"hpctrain web: listening on {address.socket_path} (only you can connect to it)",
            f"  from your laptop: ssh -N -L 8080:{address.socket_path} {host}",
            f"  then open:        http://localhost:8080/?token={token}",
            "  (here, on this machine: hpctrain web --port 8080, then the same URL)",
        ]
    shown = f"[{address.host}]" if ":" in address.host else address.host
    return [
        f"hpctrain web: listening on {shown}:{address.port}",
        f"  open: http://{shown}:{address.port}/?token={token}",
    ]
