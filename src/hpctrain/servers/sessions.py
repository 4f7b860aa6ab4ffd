"""What a dev session is, whatever runs it: its configuration, its name, its private state folder and the files
in it, and the row `hpctrain dev list` shows."""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hpctrain.errors import UserError
from hpctrain.jobs.spec import Resources
from hpctrain.readback import BadRunFile, read_json, read_text
from hpctrain.servers.common import private_dir, state_root

SERVICES = ("jupyter", "ssh", "code")
CONNECTION_FILE = "connection.json"
MAX_CONNECTION_BYTES = 64 << 10  # a few hundred bytes of names, ports and commands
TOKEN_FILE = "token"
START_LOCK = "start.lock"
DEFAULT_TIME = "04:00:00"
_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")


@dataclass(frozen=True)
class DevConfig:
    name: str
    service: str = "jupyter"
    resources: Resources = field(default_factory=lambda: Resources(cpus_per_task=2))
    """The neutral resources; where it runs and with which software (a partition, a venv, volumes) is the
    backend's, from hpctrain.schedulers.service_api.Placement."""
    time: str | None = DEFAULT_TIME
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
    ended: bool = False
    """The scheduler says the session's job or pod has ended or is gone (`dev list` notes that `dev stop` forgets
    it): each backend knows its own states."""


SAVE_ADVICE = (
    "Most work needs no saved image: keep your code and data on the shared file system (the NAS), which every "
    "job and session sees, and save an image only for software installed into the environment itself."
)


@dataclass(frozen=True)
class SaveOutcome:
    """What `dev save` did: `saved` (the image file is written), `submitted` (a build job or pod makes it, `job`
    names it), `rendered` (--dry-run: `lines` are what would run or be submitted), or `steps` (this cluster cannot
    save this session: `lines` are the exact steps to do it by hand)."""

    kind: Literal["saved", "submitted", "rendered", "steps"]
    image: str
    lines: tuple[str, ...]
    job: str = ""


IDLE_WARN = "1:00:00"
"""`dev list --idle-warn`'s default, and the console's."""


def parse_time_s(text: str, flag: str) -> int:
    """A time in the one grammar of hpctrain's times (--time's: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM:SS)."""
    from hpctrain.jobs.values import duration_s

    try:
        return duration_s(text)
    except ValueError:
        raise UserError(f"{flag} {text!r}: give a time as --time takes it, e.g. 30 (minutes), 2:00:00 or 1-0") from None


def idle_too_long(view: SessionView, limit_s: int) -> bool:
    """The one idle rule (`dev list --idle-warn`, the console's warning): idle, as Jupyter tells, past the limit."""
    return view.idle_s is not None and view.idle_s > limit_s


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise UserError(
            f"session name {name!r}: use lower-case letters, digits and -, at most 40 characters (e.g. explore-1)"
        )
    return name


def session_dir(name: str, root: Path | None = None) -> Path:
    return (root or state_root("dev")) / check_name(name)


def make_session_dir(name: str, root: Path | None = None) -> Path:
    """The session's state folder, created 0700 (and its parent): it will hold the token."""
    state_dir = session_dir(name, root)
    private_dir(state_dir.parent)
    return private_dir(state_dir)


@contextmanager
def starting(name: str, root: Path | None = None) -> Iterator[Path]:
    """Hold the session's start lock (an exclusive flock on STATE/start.lock) while it starts: a second `dev start`
    of the same name at the same time is refused before it submits anything, instead of submitting a second job
    that shares the first's token file and record. The kernel lets go of the lock when this process ends."""
    state_dir = make_session_dir(name, root)
    path = state_dir / START_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as err:
        raise UserError(
            f"dev session {name}: cannot open its lock {path} ({err.strerror or err}): remove what is "
            "there (it must be a plain file)"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(
                f"dev session {name} is being started right now by another `hpctrain dev start`: wait "
                f"for it, then see `hpctrain dev list`; or start this one under another name"
            ) from None
        except OSError as err:  # a file system without locks
            raise UserError(
                f"dev session {name}: cannot lock {path} ({err.strerror or err}): point HPCTRAIN_HOME at "
                "a file system with file locks"
            ) from None
        yield state_dir
    finally:
        os.close(fd)


def connection(name: str, root: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """The state folder and recorded connection of session `name`; an error naming the fix when there is none."""
    state_dir = session_dir(name, root)
    conn = read_connection(state_dir)
    if conn is None:
        raise UserError(f"no dev session named {name!r}: see `hpctrain dev list`")
    return state_dir, conn


def recorded(root: Path | None = None) -> Iterator[tuple[Path, dict[str, Any]]]:
    """(state folder, connection) of every session recorded under root, by name."""
    root = root or state_root("dev")
    for conn_path in sorted(root.glob(f"*/{CONNECTION_FILE}")):
        conn = read_connection(conn_path.parent)
        if conn is not None:
            yield conn_path.parent, conn


def read_connection(state_dir: Path) -> dict[str, Any] | None:
    """The session's connection.json (what `dev start` recorded, then the job's node and port); None when there is
    none. Read as every file a job's side may have touched is: bounded, no link, validated (readback)."""
    path = state_dir / CONNECTION_FILE
    try:
        conn = read_json(path, MAX_CONNECTION_BYTES, within=state_dir)
    except FileNotFoundError:
        return None
    if not isinstance(conn, dict):
        raise BadRunFile(path, f"holds no JSON object; remove {state_dir} to forget the session")
    return conn


def read_token(state_dir: Path) -> str | None:
    try:
        return read_text(state_dir / TOKEN_FILE, 4096, within=state_dir).strip()
    except (OSError, BadRunFile):
        return None


def forget(state_dir: Path, files: Iterable[str] = ()) -> None:
    """Remove the session's connection, token and secrets (`files`: a backend's or service's own), so that the
    name is free again and nothing secret is left behind."""
    for name in (CONNECTION_FILE, TOKEN_FILE, *files):
        (state_dir / name).unlink(missing_ok=True)
    shutil.rmtree(state_dir / "runtime", ignore_errors=True)


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
