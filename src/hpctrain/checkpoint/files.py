"""One checkpoint file and its manifest: their names, verifying and loading a checkpoint, setting one aside.

A checkpoint counts only if its manifest (NAME.manifest.json) exists and the file's size and sha256 match it;
`load` then reads it with weights_only=True, so a checkpoint cannot run code. The file is opened once, without
following a symbolic link, and the bytes loaded are the bytes verified: both come from that one descriptor (a file
renamed into its place after the check is never loaded), and a file changed in place meanwhile is refused.
`validity` sorts a file into valid, unfinished (no manifest: a save a kill cut short) or damaged. Nothing here
writes a checkpoint (see `writing`) or chooses among several (see `discovery`).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import stat
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

import torch

from hpctrain.errors import UserError
from hpctrain.fsutil import file_kind, fsync_dir
from hpctrain.readback import BadRunFile, read_json

FORMAT_VERSION = 1
MANIFEST_SUFFIX = ".manifest.json"
LATEST_POINTER = "latest"
CORRUPT_SUFFIX = ".corrupt"  # a damaged checkpoint moved aside
INCOMPLETE_SUFFIX = ".incomplete"  # a checkpoint whose save did not finish (no manifest), moved aside
ABANDONED_SUFFIX = ".abandoned"  # a valid checkpoint moved aside: a run resumed from an older one took its place
BEST_NAME = "checkpoint_best.pt"  # a copy of the best epoch's checkpoint: outside the pruned, resumable series
MAX_MANIFEST_BYTES = 1 << 20  # a manifest is a few hundred bytes; read back at most this much
NAME_PATTERN = re.compile(r"^checkpoint_(epoch|step)_(\d+)\.pt$")  # the numbered, resumable series

# One logger for the package (hpctrain.checkpoint.log): the training loop silences it while it looks ahead.
log = logging.getLogger("hpctrain.checkpoint")


class CheckpointError(UserError):
    """A checkpoint that is missing, incomplete, corrupt or not ours; `reason` says what is wrong without the path
    or the fix (for lists of rejected files)."""

    def __init__(self, message: str, reason: str | None = None, unfinished: bool = False) -> None:
        super().__init__(message)
        self.reason = reason or message
        self.unfinished = unfinished  # a save that never finished (what a kill leaves), not damage


def _rejected(
    path: Path, reason: str, fix: str = "resume from an earlier checkpoint", *, unfinished: bool = False
) -> CheckpointError:
    return CheckpointError(f"{path} {reason}; {fix}", reason, unfinished)


class Rejected(NamedTuple):
    path: Path
    reason: str
    unfinished: bool  # its save never finished (no manifest): what a kill leaves, not damage


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    epoch: int
    step: int
    world_size: int
    sha256: str
    size: int


def checkpoint_name(epoch: int, step: int, end_of_epoch: bool) -> str:
    return f"checkpoint_epoch_{epoch}.pt" if end_of_epoch else f"checkpoint_step_{step}.pt"


def load(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Verify the manifest and checksum, then load with weights_only=True (a checkpoint cannot run code): the bytes
    loaded are the bytes verified, read through one descriptor opened without following a link."""
    return typing.cast("dict[str, Any]", verify_and_load(Path(path), map_location)[1])


def verify(path: Path) -> CheckpointInfo:
    """Raise CheckpointError unless `path` (not a symbolic link) has a matching manifest and checksum."""
    return verify_and_load(path, None)[0]


def verify_and_load(
    path: Path, map_location: str | torch.device | None
) -> tuple[CheckpointInfo, dict[str, Any] | None]:
    """`verify`, then (with a `map_location`) `load` the very bytes that were verified: one open of `path`,
    without following a link, the checksum computed from it, the descriptor rewound and given to torch.load. A
    file changed in place while it was read is refused too (its size or mtime moved)."""
    path = Path(path)
    _check_kind(path)
    with _open_checkpoint(path) as handle:
        before = os.fstat(handle.fileno())
        info = _check_manifest_and_size(path, before.st_size)
        digest = hashlib.sha256()
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
        if digest.hexdigest() != info.sha256:
            raise _rejected(path, "fails its checksum: corrupt")
        state = None
        if map_location is not None:
            handle.seek(0)
            state = _load_from(handle, path, map_location)
        if _identity(os.fstat(handle.fileno())) != _identity(before):
            raise _rejected(
                path, "changed while it was being read (another process writes it in place)", "resume again"
            )
    return info, state


def _identity(info: os.stat_result) -> tuple[int, ...]:
    """What a write to the open file changes (not its ctime: renaming another file over its name changes that,
    and leaves the bytes this descriptor reads as they were)."""
    return (info.st_ino, info.st_size, info.st_mtime_ns)


def _open_checkpoint(path: Path) -> IO[bytes]:
    """`path` open for reading: a regular file, reached without following a link at its name."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CheckpointError(
            f"no checkpoint at {path}; check the path or drop it to resume from the newest one", "does not exist"
        ) from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _rejected(
                path,
                "is a symbolic link: hpctrain never reads a run's files through one",
                "pass the file it points to, or put that file in its place",
            ) from None
        raise _rejected(path, f"cannot be read ({err.strerror or err})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _rejected(path, f"is not a regular file ({file_kind(mode)})", "pass a checkpoint_*.pt file")
    return open(fd, "rb")


def _load_from(handle: IO[bytes], path: Path, map_location: str | torch.device) -> dict[str, Any]:
    try:
        state = torch.load(handle, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises several types for a bad pickle or zip
        raise _rejected(path, f"cannot be loaded ({_load_failure(err)})") from None
    if not isinstance(state, dict) or "model" not in state:
        raise _rejected(
            path, "is not an hpctrain checkpoint (no 'model' entry)", "pass a checkpoint written by hpctrain"
        )
    return state


def _load_failure(err: Exception) -> str:
    """What went wrong, in a line, without torch's advice to load with weights_only=False (which would let the
    file run code: hpctrain never does that)."""
    text = str(err)
    refused = re.search(r"WeightsUnpickler error: (.*?)(?: was not an allowed global|\. |\n|$)", text)
    if refused:
        return f"it holds Python objects that safe loading refuses: {refused.group(1).strip()}"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if not first or "weights_only" in first:
        return f"{type(err).__name__}: the file is damaged or not a torch checkpoint"
    return first[:300]


def _check_kind(path: Path) -> None:
    """What `path` is when it is not a checkpoint file, in words that name the fix (a link: `_open_checkpoint`'s)."""
    if path.is_symlink():
        return
    if path.name == LATEST_POINTER and path.is_file():
        raise _rejected(
            path,
            "is the pointer to the newest checkpoint (it holds a file name), not a checkpoint",
            f"pass its directory {path.parent} (or the run directory) to resume from the newest valid checkpoint in it",
        )
    if path.is_dir():
        raise _rejected(
            path,
            "is a directory, not a checkpoint file",
            "pass a checkpoint_*.pt file, or resume from the newest one in a run directory with --resume",
        )


def _check_manifest_and_size(path: Path, size: int) -> CheckpointInfo:
    """verify() without the checksum, for the checkpoint `path` of `size` bytes."""
    if size == 0:
        raise _rejected(path, "is empty (0 bytes): its save never wrote anything, or it is not a checkpoint")
    manifest_file = manifest_path(path)
    try:
        manifest = read_manifest(path)
    except FileNotFoundError:
        if not NAME_PATTERN.match(path.name):
            raise _rejected(
                path,
                f"is not an hpctrain checkpoint (it has no manifest {manifest_file.name})",
                "pass a checkpoint_*.pt file written by hpctrain, or the run directory",
            ) from None
        raise _rejected(
            path, f"has no manifest ({manifest_file.name}): its save did not finish", unfinished=True
        ) from None
    except BadRunFile as err:
        raise _rejected(path, f"has an unreadable manifest: {manifest_file.name} is unreadable ({err.reason})") from err
    except OSError as err:
        raise _rejected(path, f"has an unreadable manifest: {manifest_file.name} is unreadable ({err})") from err
    try:
        if not isinstance(manifest, dict):
            raise TypeError("not an object")
        version = int(manifest["format_version"])
        expected_size = int(manifest["size"])
        expected_digest = str(manifest["sha256"])
        info_fields = (int(manifest["epoch"]), int(manifest["step"]), int(manifest.get("world_size", 1)))
    except (KeyError, TypeError, ValueError) as err:
        raise _rejected(path, f"has a manifest that lacks a field ({err})") from err
    if version > FORMAT_VERSION:
        raise _rejected(
            path,
            f"has format version {version}, newer than this hpctrain understands ({FORMAT_VERSION})",
            "upgrade hpctrain",
        )
    if size != expected_size:
        raise _rejected(path, f"is {size} bytes but its manifest says {expected_size}: truncated or overwritten")
    return CheckpointInfo(path, *info_fields, expected_digest, size)


def read_manifest(path: Path) -> Any:
    """The parsed manifest of the checkpoint `path`: FileNotFoundError without one, BadRunFile for one that cannot
    be read (a link, a special file, over MAX_MANIFEST_BYTES, not UTF-8 or not JSON). Its fields are the caller's
    to check."""
    manifest = manifest_path(path)
    return read_json(manifest, MAX_MANIFEST_BYTES, within=manifest.parent)


def set_aside(path: Path, suffix: str) -> Path:
    """Rename a checkpoint and its manifest out of the way (NAME+suffix, numbered if taken): no longer a
    candidate, never overwritten, never pruned. Returns the new path of the checkpoint."""
    target = path.with_name(path.name + suffix)
    number = 1
    while target.exists() or target.is_symlink():
        target = path.with_name(f"{path.name}{suffix}.{number}")
        number += 1
    manifest = manifest_path(path)
    if manifest.exists() or manifest.is_symlink():
        os.replace(manifest, target.with_name(target.name + MANIFEST_SUFFIX))
    os.replace(path, target)
    fsync_dir(path.parent)
    return target


def validity(path: Path, thorough: bool = True) -> str:
    """ "valid", "unfinished" (no manifest: a save cut short) or "damaged" (anything else that fails `verify`).
    Not `thorough`: the manifest and the size only, no checksum (pruning after every save must not re-read every
    kept checkpoint; truncation and unfinished saves are what kills and full disks leave)."""
    try:
        if thorough:
            verify(path)
        else:
            _check_kind(path)
            with _open_checkpoint(path) as handle:
                _check_manifest_and_size(path, os.fstat(handle.fileno()).st_size)
    except CheckpointError as err:
        return "unfinished" if err.unfinished else "damaged"
    except OSError:
        return "damaged"
    return "valid"


def manifest_path(path: Path) -> Path:
    return path.with_name(path.name + MANIFEST_SUFFIX)
