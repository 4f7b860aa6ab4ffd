"""Small file-system helpers for writes that must never be seen half done, nor land anywhere but where they say.

Run files are written and read without following symbolic links: a link planted in a run directory (or left by
a copy) must not make a run write into, or read from, the file it points to.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
from pathlib import Path
from typing import NamedTuple

from hpctrain.errors import UserError

# ENOSPC: the disk is full; EDQUOT: the user's quota is.
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}


def write_atomic(
    path: Path, data: bytes, temporary: Path | None = None, mode: int = 0o666, durable: bool = True
) -> None:
    """Write `data` to `path` through a temporary file, fsynced and renamed: readers see the old or the new file.

    The rename replaces a symbolic link at `path` itself (never its target), and the temporary is created afresh
    (O_EXCL), so neither a link nor a FIFO at its name is opened. `mode`: 0o600 for a file that holds secrets (set
    as is; the default 0o666 goes through the umask).
    `durable=False` skips the fsync, for a file rewritten every few seconds that a crash may lose (live progress)."""
    tmp = temporary or path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _unlink_quietly(tmp)  # a stale one of this process's name, or a FIFO planted there: opening it could block
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        if mode != 0o666:
            os.fchmod(fd, mode)  # exactly, past the umask
        with open(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)  # a link there is removed itself, its target untouched
        raise


def remove_temporaries(directory: Path, pattern: str = "*") -> None:
    """Remove the hidden temporaries (`.NAME.tmp-SUFFIX`: write_atomic's SUFFIX is its process id) that writes killed
    before their rename left in `directory`, for the file names `pattern` matches (a glob of our own file names),
    except this process's own. Only for files with one writer at a time: a rank's own progress record; a run
    directory's files when an attempt's rank 0 starts (every process of the attempt before it has ended); the
    output of `prepare`, under its directory's lock."""
    own = f".tmp-{os.getpid()}"
    for tmp in directory.glob(f".{pattern}.tmp-*"):
        if not tmp.name.endswith(own):
            _unlink_quietly(tmp)


def append_line(path: Path, line: str) -> None:
    """Append `line` (and a newline) to `path`, creating it; refuses a symbolic link (OSError ELOOP)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o666)
    with open(fd, "a") as handle:
        handle.write(line + "\n")


def read_text(path: Path) -> str:
    """The text of `path`, read without following a symbolic link (OSError ELOOP for a link)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with open(fd) as handle:
        return handle.read()


class FileRefused(UserError):
    """A file `read_regular` will not read: not a regular file, or larger than the caller's cap. `reason` says
    which, without the path (callers that name the file their own way use it)."""

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        super().__init__(f"{os.fspath(path)}: {reason}")
        self.path = os.fspath(path)
        self.reason = reason


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """The bytes of the regular file `path` (a symbolic link is followed to one), at most `limit` of them.

    Files named by users or found in datasets are read through here: a FIFO would block the read forever and a
    device such as /dev/zero never ends, so anything but a regular file is refused (FileRefused), as is a file
    larger than `limit` (the read never holds more than `limit` + 1 bytes, even if the file grows meanwhile).
    The open does not block on a FIFO (O_NONBLOCK, which changes nothing for a regular file). An OSError is
    raised as it is (missing file, no permission), for the caller to word."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    return read_open_file(fd, path, limit)


def read_open_file(
    fd: int, path: str | os.PathLike, limit: int, refused: type[FileRefused] = FileRefused, hint: str = "; give a file"
) -> bytes:
    """`read_regular` of a file already open as `fd` (closed here), for callers that open it their own way (without
    following links: hpctrain.readback). Refusals are `refused(path, reason)`, a kind other than a regular file's
    reason ending in `hint`."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise refused(path, f"not a regular file ({file_kind(info.st_mode)}){hint}")
        if info.st_size > limit:
            raise refused(path, f"{format_bytes(info.st_size)}, more than the {format_bytes(limit)} read at most")
        chunks, size = [], 0
        while size <= limit:  # os.read: never more than limit + 1 bytes held, even if the file grows meanwhile
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise refused(path, f"grew past the {format_bytes(limit)} read at most while being read")
    return b"".join(chunks)


def file_kind(mode: int) -> str:
    """What a file of this st_mode is, for messages: 'a directory', 'a FIFO', ..."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a special file"


def format_bytes(n: float) -> str:
    """A byte count for people, in binary units to 3 significant digits: 512 B, 1.5 KiB, 977 KiB, 1.91 GiB. The one
    byte formatter of hpctrain's messages and listings (files, downloads, shards, images, caps on reads)."""
    if n < 1024:
        return f"{int(n)} B"
    size, unit = float(n), "B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        size /= 1024
        if size < 1023.5:  # would still read as 1024 when rounded: the next unit
            break
    return f"{size:.3g} {unit}" if size < 999.5 else f"{size:.0f} {unit}"


def refuse_symlinks(directory: Path, names: tuple[str, ...]) -> None:
    """UserError if any of `names` in `directory` is a symbolic link: hpctrain writes those files (and folders)
    itself."""
    for name in names:
        path = directory / name
        if path.is_symlink():
            what = "folder" if path.is_dir() else "file"
            raise UserError(
                f"{path} is a symbolic link (to {os.readlink(path)}); hpctrain writes this {what} itself and never "
                f"through a link. Remove the link (copy the {what} it points to in its place if you need its "
                "contents), or choose another --run-dir"
            )


def is_no_space(err: BaseException) -> bool:
    """Whether `err` says the disk (or the quota) is full."""
    return isinstance(err, OSError) and err.errno in _NO_SPACE


def free_bytes(directory: Path) -> int | None:
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def fsync_dir(directory: Path) -> None:
    """Make renames in `directory` durable; best effort, as some file systems refuse fsync on a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class FileDigest(NamedTuple):
    sha256: str  # hex digest
    size: int  # bytes read


def sha256_file(path: Path) -> FileDigest:
    """The sha256 of the file at `path` and the number of bytes it held, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return FileDigest(digest.hexdigest(), size)


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


# ---------------------------------------------------------------- one run at a time in a directory


class DirectoryInUse(UserError):
    """Another live process holds the directory's lock."""


class LocksUnsupported(OSError):
    """The file system does not support flock (the caller decides whether to go on without a lock)."""


class DirectoryLock:
    """An exclusive `flock` on DIRECTORY/NAME, for as long as this object is held (or the process lives).

    The kernel drops the lock when the process dies, however it dies, so a killed run never leaves a stale lock;
    the file itself may stay behind and means nothing then. The holder writes who it is (host, pid, start time)
    into the file, so a refused process can name it. `release()` removes the file while still holding the lock,
    and `acquire` re-checks after locking that the file it locked is still the one at the path: a process that
    locked a file just removed by its holder tries again instead of believing it holds the lock.

    On NFS, Linux implements flock with the server's byte-range locks (NLM for v3, built in for v4), so the lock
    holds across nodes as long as the file system is mounted with locking (not `nolock`/`local_lock=all`); a
    crashed node's lock lasts until the server's lease expires (about 90 s for NFSv4). Lustre needs the `flock`
    mount option (`localflock` only excludes processes on the same node). Where the file system refuses flock,
    `acquire` raises LocksUnsupported.
    """

    def __init__(self, path: Path, fd: int, created: list[Path]) -> None:
        self.path = path
        self._fd: int | None = fd
        self._created = created  # directories made for the lock, deepest first: removed again if left empty

    @classmethod
    def acquire(cls, directory: Path, name: str, holder: str) -> DirectoryLock:
        """Lock DIRECTORY/NAME, creating DIRECTORY (and its missing parents) if need be; `holder` is what a
        refused process is told about this one."""
        created = [d for d in (directory, *directory.parents) if not d.exists()]
        directory.mkdir(parents=True, exist_ok=True)
        try:
            return cls._acquire(directory, name, holder, created)
        except BaseException:
            _remove_empty(created)
            raise

    @classmethod
    def _acquire(cls, directory: Path, name: str, holder: str, created: list[Path]) -> DirectoryLock:
        path = directory / name
        while True:
            try:  # O_NONBLOCK: a FIFO planted there is opened without waiting for a writer, then refused
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
            except OSError as err:
                if err.errno == errno.ELOOP:
                    refuse_symlinks(directory, (name,))
                if err.errno == errno.EISDIR:
                    raise _not_a_lock(path, "a directory") from None
                raise
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                os.close(fd)
                raise _not_a_lock(path, file_kind(mode))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                current = _read_fd(fd)
                os.close(fd)
                if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    who = current.strip() or "another process that has not yet written its name"
                    raise DirectoryInUse(
                        f"{directory} is in use by another run ({who}); wait for it to finish or stop it, "
                        "or choose another --run-dir"
                    ) from None
                raise LocksUnsupported(
                    f"cannot lock {path} ({os.strerror(err.errno or 0)}): this file system refuses flock, so a "
                    "second run in this directory would not be stopped (on Lustre mount with -o flock; on NFS "
                    "without nolock or local_lock)"
                ) from None
            try:
                same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # its holder removed the file between our open and our lock: lock the new one
        os.ftruncate(fd, 0)
        os.pwrite(fd, (holder + "\n").encode(), 0)
        return cls(path, fd, created)

    def lost(self) -> str | None:
        """Why this lock no longer keeps other processes out, or None while it does: the file at the path was
        removed or replaced (a clean-up of "stale" locks), so a second process can lock a new file there."""
        if self._fd is None:
            return "it was released"
        held = os.fstat(self._fd)
        try:
            now = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return "removed"
        except OSError as err:
            return f"unreadable ({os.strerror(err.errno or 0)})"
        if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            return "replaced by another file"
        return None

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            if self.lost() is None:  # a file that replaced ours is another process's lock: left alone
                self.path.unlink(missing_ok=True)
        except OSError:
            pass
        os.close(self._fd)  # closing drops the lock
        self._fd = None
        _remove_empty(self._created)  # a run refused before it wrote anything leaves no directory behind


def _not_a_lock(path: Path, kind: str) -> UserError:
    return UserError(
        f"{path} is {kind}, not the lock file hpctrain keeps there: something else made it; remove it "
        "(or choose another directory) and run this again"
    )


def _remove_empty(directories: list[Path]) -> None:
    for directory in directories:
        try:
            directory.rmdir()
        except OSError:
            return  # not empty (or not ours to remove): neither are its parents


def _read_fd(fd: int) -> str:
    try:
        return os.pread(fd, 4096, 0).decode(errors="replace")
    except OSError:
        return ""
