"""Python stacks of every thread of a rank, written to a file: on a hang (RUN/hang/rank-N.txt) and on request
(`hpctrain debug stacks JOB` leaves RUN/stacks/request; every rank's watchdog answers in RUN/stacks/rank-N.txt).

The request is a file in the run directory rather than a signal, because the run directory is the one thing every
rank of every launcher shares (torchrun's agent would die of a SIGUSR2 meant for its workers, and a Kubernetes pod
cannot be signalled from outside without exec rights). faulthandler writes the stacks without running Python code
in the stuck threads, so a thread blocked in a collective or in I/O shows where it is blocked.

No clock decides what answers what: the request holds a fresh random token, a rank answers a token it has not seen
(one that was there when it started is not for it), and its answer's first line names the token. A login node
whose clock is ahead of the file server's, or of the compute nodes', cannot make an answer look stale.

Others write in RUN/ too (other users, a crashed attempt, a shared file system): every file here is written through
a descriptor of its folder opened without following a link (a linked stacks/ or hang/ is refused), under a fresh
temporary name created exclusively, then renamed over its name, which replaces a link or a FIFO there, never
writes through it. The request is read the same way, bounded, and only when it is a regular file.
"""

from __future__ import annotations

import logging
import errno
import faulthandler
import os
import re
import secrets
import stat
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import UserError
from hpctrain.fsutil import refuse_symlinks

log = logging.getLogger(__name__)

HANG_DIR = "hang"
STACKS_DIR = "stacks"
REQUEST_FILE = "request"
REQUEST_MAX_BYTES = 256
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
ANSWER_PREFIX = "on request "  # an answer's first line names the request's token after this


def capture_stacks() -> str:
    """The Python stacks of all this process's threads, as faulthandler writes them, held in memory: the dump never
    waits on a file system (faulthandler writes holding the interpreter's lock, so a blocked file would stop every
    thread)."""
    try:
        fd = os.memfd_create("hpctrain-stacks")
        handle = open(fd, "w+b")
    except (AttributeError, OSError):
        handle = tempfile.TemporaryFile()
    with handle:
        faulthandler.dump_traceback(file=handle, all_threads=True)
        handle.seek(0)
        return handle.read().decode(errors="replace")


def main_thread_at() -> str | None:
    """Where this process's main thread is now: its innermost frame, as `function (file:line)`."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    if frame is None:
        return None
    inner = traceback.extract_stack(frame, limit=1)[-1]
    return f"{inner.name} ({inner.filename}:{inner.lineno})"


def open_folder(parent: Path, name: str, create: bool = True) -> int:
    """A descriptor of PARENT/NAME, a folder, opened without following a link (UserError for a link or a file)."""
    if create:
        try:
            os.mkdir(parent / name)
        except FileExistsError:
            pass
    try:
        return os.open(parent / name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):  # Linux says ENOTDIR for a link with O_DIRECTORY
            refuse_symlinks(parent, (name,))
            raise UserError(
                f"{parent / name} is not a folder: hpctrain writes stacks there; remove it, or choose another --run-dir"
            ) from None
        raise


def write_in(folder: int, name: str, data: bytes) -> None:
    """Write `data` as NAME in the folder open as `folder`: a fresh temporary, created exclusively and without
    following a link, renamed over NAME."""
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder)
    try:
        with open(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=folder)
        except OSError:
            pass
        raise


def dump_stacks(path: Path, header: str, stacks: str | None = None) -> None:
    """Write `header` and the Python stacks of all this process's threads (or `stacks`, captured before) to `path`,
    replaced whole; its folder is made when missing and refused when it is a link."""
    text = header.rstrip("\n") + "\n\n" + (capture_stacks() if stacks is None else stacks)
    folder = open_folder(path.parent.parent, path.parent.name)
    try:
        write_in(folder, path.name, text.encode())
    finally:
        os.close(folder)


def request_stacks(run_dir: Path) -> str:
    """Ask every rank of the run for its stacks; returns the request's token (give it to `answers`)."""
    token = f"{int(time.time())}-{secrets.token_hex(8)}"  # the time only helps people reading it
    folder = open_folder(run_dir, STACKS_DIR)
    try:
        write_in(folder, REQUEST_FILE, f"{token}\n".encode())
    except IsADirectoryError:
        raise UserError(
            f"{run_dir / STACKS_DIR / REQUEST_FILE} is a folder: remove it (hpctrain writes a file there)"
        ) from None
    finally:
        os.close(folder)
    return token


def answers(run_dir: Path, token: str) -> list[Path]:
    """The ranks' stack files that answer the request `token`."""
    try:
        folder = open_folder(run_dir, STACKS_DIR, create=False)
    except (OSError, UserError):
        return []
    found = []
    try:
        for name in sorted(os.listdir(folder)):
            if re.fullmatch(r"rank-\d{1,9}\.txt", name) and _first_line(folder, name).endswith(ANSWER_PREFIX + token):
                found.append(run_dir / STACKS_DIR / name)
    finally:
        os.close(folder)
    return found


def _read_small(folder: int, name: str, limit: int) -> bytes | None:
    """Up to `limit` bytes of the regular file NAME in `folder`; None for anything else (a link, a FIFO, missing)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _first_line(folder: int, name: str) -> str:
    data = _read_small(folder, name, 4096) or b""
    return data.split(b"\n", 1)[0].decode(errors="replace").rstrip()


@dataclass
class _Seen:
    identity: tuple[int, int, int, int] | None = None  # the request file's inode, size, mtime and ctime
    token: str | None = None


class StackRequests:
    """A rank's side of `request_stacks`: `check()` (from a thread of the watchdog's) answers a new request once."""

    def __init__(self, run_dir: Path, rank: int, host: str) -> None:
        self.run_dir = run_dir
        self.answer = f"rank-{rank}.txt"
        self.who = f"rank {rank} on {host} (pid {os.getpid()})"
        self._seen = _Seen()
        self._refused = False
        self._new_token()  # a request from before this process started is not for it

    def check(self) -> None:
        token = self._new_token()
        if token is None:
            return
        text = f"{self.who}, {ANSWER_PREFIX}{token}\nat {time.strftime('%Y-%m-%d %H:%M:%S')}"
        dump_stacks(self.run_dir / STACKS_DIR / self.answer, text)

    def _new_token(self) -> str | None:
        """The request's token when it is one this rank has not seen; None otherwise (no request, the same one, one
        that is not a regular file or holds no token)."""
        try:
            folder = open_folder(self.run_dir, STACKS_DIR, create=False)
        except UserError as err:
            if not self._refused:  # said once, not every second
                self._refused = True
                log.warning(f"stack requests not answered: {err}")
            return None
        except OSError:
            return None
        try:
            try:
                info = os.stat(REQUEST_FILE, dir_fd=folder, follow_symlinks=False)
            except OSError:
                return None
            identity = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
            if identity == self._seen.identity:
                return None
            self._seen.identity = identity
            data = _read_small(folder, REQUEST_FILE, REQUEST_MAX_BYTES)
        finally:
            os.close(folder)
        token = (data or b"").split(b"\n", 1)[0].decode(errors="replace").strip()
        if not TOKEN_PATTERN.fullmatch(token) or token == self._seen.token:
            return None
        self._seen.token = token
        return token
