"""Checkpoints you can trust: atomic writes, a manifest written last, and loading that cannot run code.

Layout of a checkpoint directory::

    checkpoint_epoch_2.pt               torch.save'd dict (model, optimizer, scheduler, counters, RNG, config)
    checkpoint_epoch_2.pt.manifest.json written after the .pt is durable: sha256, size, epoch, step, world size
    latest                              name of the newest complete checkpoint (a convenience; the manifests decide)

A checkpoint counts only if its manifest exists and its checksum matches, so a save killed at any moment
leaves the previous checkpoint as the newest valid one. "Newest" means furthest in training: the manifest's
(epoch, step), an epoch-end checkpoint before a mid-epoch one of the same step; never a clock, which can be
wrong. A damaged file is never overwritten or pruned: a save that would replace one moves it aside first
(NAME.corrupt), and pruning keeps the newest `keep` *valid* checkpoints and leaves damaged ones alone (pruning
judges by the manifest and the size, not the checksum, so it never re-reads the kept files; a same-size bit flip
is caught when loading). A file without a manifest is not damage but a save a kill cut short (it never counted):
pruning removes it once a valid checkpoint is newer. Users' own
scripts can call `save`/`load_latest`, or use `AsyncCheckpointer` to write in the background while training goes on.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from hpctrain.errors import UserError
from hpctrain.fsutil import free_bytes, fsync_dir, is_no_space, refuse_symlinks, write_atomic

FORMAT_VERSION = 1
MANIFEST_SUFFIX = ".manifest.json"
LATEST_POINTER = "latest"
CORRUPT_SUFFIX = ".corrupt"  # a damaged checkpoint moved aside
INCOMPLETE_SUFFIX = ".incomplete"  # a checkpoint whose save did not finish (no manifest), moved aside
ABANDONED_SUFFIX = ".abandoned"  # a valid checkpoint moved aside: a run resumed from an older one took its place
BEST_NAME = "checkpoint_best.pt"  # a copy of the best epoch's checkpoint: outside the pruned, resumable series
_NAME = re.compile(r"^checkpoint_(epoch|step)_(\d+)\.pt$")
# Another host's temporary may belong to a live save on a shared filesystem: only this old is it surely stale.
FOREIGN_TEMPORARY_MAX_AGE_S = 3600.0

log = logging.getLogger(__name__)


class CheckpointError(UserError):
    """A checkpoint that is missing, incomplete, corrupt or not ours; `reason` says what is wrong without the path
    or the fix (for lists of rejected files)."""

    def __init__(self, message: str, reason: str | None = None, unfinished: bool = False) -> None:
        super().__init__(message)
        self.reason = reason or message
        self.unfinished = unfinished  # a save that never finished (what a kill leaves), not damage


def _rejected(path: Path, reason: str, fix: str = "resume from an earlier checkpoint", *,
              unfinished: bool = False) -> CheckpointError:
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


def save(
    state: dict[str, Any],
    directory: str | Path,
    name: str,
    *,
    epoch: int,
    step: int,
    world_size: int = 1,
    keep: int | None = None,
) -> Path:
    """Write `state` as directory/name atomically, then its manifest, then the `latest` pointer.

    Keeps the newest `keep` checkpoints when `keep` is given (never the one just written).
    """
    _check_arguments(name, keep)
    directory = Path(directory)
    refuse_symlinks(directory.parent, (directory.name,))  # checkpoints are never written through a linked folder
    directory.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(directory)
    path = directory / name
    if (path.exists() or path.is_symlink()) and _validity(path) == "damaged":
        set_aside(path, CORRUPT_SUFFIX)  # a damaged file is evidence: never overwrite it
    tmp = _temporary(path)
    writer = None
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
        with open(fd, "wb") as handle:
            # Hash while writing: reading a large checkpoint back just to checksum it would double the I/O.
            writer = _HashingWriter(handle)
            torch.save(state, writer)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        # torch reports a failed write as its own RuntimeError ("unexpected pos"); the writer saw the real cause.
        cause = writer.error if writer is not None and writer.error is not None else err
        if is_no_space(cause):
            raise _disk_full(path, cause) from err
        raise
    manifest = {
        "format_version": FORMAT_VERSION,
        "file": name,
        "sha256": writer.digest.hexdigest(),
        "size": writer.size,
        "epoch": epoch,
        "step": step,
        "world_size": world_size,
        "written_at": time.time(),
    }
    try:
        write_atomic(_manifest_path(path), json.dumps(manifest, indent=1).encode(),
                     _temporary(_manifest_path(path)))
    except BaseException as err:
        path.unlink(missing_ok=True)  # without its manifest it is no checkpoint; leave no half-save behind
        if is_no_space(err):
            raise _disk_full(path, err) from err
        raise
    try:
        write_atomic(directory / LATEST_POINTER, (name + "\n").encode(), _temporary(directory / LATEST_POINTER))
    except OSError as err:  # only a convenience: the checkpoint itself is complete
        log.warning("could not update %s (%s)", directory / LATEST_POINTER, err)
    fsync_dir(directory)
    if keep is not None:
        _prune(directory, keep, newest_valid=path)
    return path


def copy_checkpoint(source: Path, target: Path) -> Path:
    """Copy a verified checkpoint to `target` atomically, with its own manifest (same digest, size and position).

    For names outside the numbered series (checkpoint_best.pt): `latest` is not touched and pruning never sees it.
    """
    info = verify(source)
    tmp = _temporary(target)
    try:
        shutil.copyfile(source, tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if is_no_space(err):
            raise _disk_full(target, err) from err
        raise
    manifest = json.loads(_manifest_path(source).read_text())
    manifest.update(file=target.name, sha256=info.sha256, size=info.size, written_at=time.time())
    write_atomic(_manifest_path(target), json.dumps(manifest, indent=1).encode(), _temporary(_manifest_path(target)))
    fsync_dir(target.parent)
    return target


def _disk_full(path: Path, err: BaseException) -> CheckpointError:
    free = free_bytes(path.parent)
    room = f", {free / 2**20:.1f} MiB free" if free is not None else ""
    return CheckpointError(
        f"no space left on the device holding {path.parent} ({os.strerror(getattr(err, 'errno', 0) or 0)}{room}) "
        f"while writing checkpoint {path.name}; the checkpoints written before it are intact. Free space there "
        "(or lower --keep-checkpoints), or move the run to a larger file system, then continue with --resume"
    )


def _check_arguments(name: str, keep: int | None) -> None:
    if not _NAME.match(name):
        raise CheckpointError(
            f"checkpoint name {name!r} is not of the form checkpoint_epoch_N.pt or checkpoint_step_N.pt, so "
            "find_latest() would never see it; build it with checkpoint_name(epoch, step, end_of_epoch)"
        )
    if keep is not None and keep < 1:
        raise CheckpointError(f"keep={keep}: at least 1 checkpoint must be kept; pass a keep of 1 or more")


def load(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Verify the manifest and checksum, then load with weights_only=True (a checkpoint cannot run code)."""
    return _read(verify(Path(path)), map_location)


def _read(info: CheckpointInfo, map_location: str | torch.device) -> dict[str, Any]:
    try:
        state = torch.load(info.path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises several types for a bad pickle or zip
        raise _rejected(info.path, f"cannot be loaded ({_load_failure(err)})") from None
    if not isinstance(state, dict) or "model" not in state:
        raise _rejected(info.path, "is not an hpctrain checkpoint (no 'model' entry)",
                        "pass a checkpoint written by hpctrain")
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


def verify(path: Path) -> CheckpointInfo:
    """Raise CheckpointError unless `path` has a matching manifest and checksum."""
    info = _check_manifest_and_size(path)
    digest, _ = _sha256(path)
    if digest != info.sha256:
        raise _rejected(path, "fails its checksum: corrupt")
    return info


def _check_manifest_and_size(path: Path) -> CheckpointInfo:
    """verify() without the checksum."""
    if path.name == LATEST_POINTER and path.is_file():
        raise _rejected(path, "is the pointer to the newest checkpoint (it holds a file name), not a checkpoint",
                        f"pass its directory {path.parent} (or the run directory) to resume from the newest "
                        "valid checkpoint in it")
    if path.is_dir():
        raise _rejected(path, "is a directory, not a checkpoint file",
                        "pass a checkpoint_*.pt file, or resume from the newest one in a run directory with --resume")
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}; check the path or drop it to resume from the newest one",
                              "does not exist")
    size = path.stat().st_size
    if size == 0:
        raise _rejected(path, "is empty (0 bytes): its save never wrote anything, or it is not a checkpoint")
    manifest_path = _manifest_path(path)
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        if not _NAME.match(path.name):
            raise _rejected(path, f"is not an hpctrain checkpoint (it has no manifest {manifest_path.name})",
                            "pass a checkpoint_*.pt file written by hpctrain, or the run directory") from None
        raise _rejected(path, f"has no manifest ({manifest_path.name}): its save did not finish",
                        unfinished=True) from None
    except (OSError, ValueError) as err:
        raise _rejected(path, f"has an unreadable manifest: {manifest_path.name} is unreadable ({err})") from err
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
        raise _rejected(path, f"has format version {version}, newer than this hpctrain understands "
                        f"({FORMAT_VERSION})", "upgrade hpctrain")
    if size != expected_size:
        raise _rejected(path, f"is {size} bytes but its manifest says {expected_size}: truncated or overwritten")
    return CheckpointInfo(path, *info_fields, expected_digest, size)


def candidates(directory: str | Path) -> list[Path]:
    """Checkpoint files in `directory`, newest (furthest in training: epoch, then step, epoch-end first) first."""
    return [path for _, path in _ordered(Path(directory))]


@dataclass
class Found:
    """The outcome of looking for the newest usable checkpoint in a directory."""

    info: CheckpointInfo | None  # the newest usable checkpoint, None if there is none
    state: dict[str, Any] | None  # its contents, when loaded
    rejected: list[Rejected]  # newer files that were refused, newest first


def search(directory: str | Path, *, load_state: bool = True, map_location: str | torch.device = "cpu") -> Found:
    """The newest checkpoint that verifies (and, with `load_state`, also loads), and every newer one refused."""
    rejected: list[Rejected] = []
    for path in candidates(directory):
        try:
            info = verify(path)
            return Found(info, _read(info, map_location) if load_state else None, rejected)
        except CheckpointError as err:
            if not (path.exists() or path.is_symlink()):
                continue  # moved aside by rank 0 while this rank was looking: it was never a candidate
            log.warning("skipping checkpoint: %s", err)
            rejected.append(Rejected(path, err.reason, err.unfinished))
    return Found(None, None, rejected)


def find_latest(directory: str | Path) -> CheckpointInfo | None:
    """The newest valid checkpoint; invalid newer ones are reported (logged) and skipped."""
    return search(directory, load_state=False).info


def load_latest(directory: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any] | None:
    """Load the newest valid checkpoint in `directory`, or None when there is none."""
    return search(directory, map_location=map_location).state


def position_of(path: Path) -> tuple[int, int, bool] | None:
    """(epoch, step, is epoch-end) of a checkpoint as its manifest (else its name) says; None if neither does."""
    match = _NAME.match(path.name)
    return _order_of(path, match) if match else None


def set_aside(path: Path, suffix: str) -> Path:
    """Rename a checkpoint and its manifest out of the way (NAME+suffix, numbered if taken): no longer a
    candidate, never overwritten, never pruned. Returns the new path of the checkpoint."""
    target = path.with_name(path.name + suffix)
    number = 1
    while target.exists() or target.is_symlink():
        target = path.with_name(f"{path.name}{suffix}.{number}")
        number += 1
    manifest = _manifest_path(path)
    if manifest.exists() or manifest.is_symlink():
        os.replace(manifest, target.with_name(target.name + MANIFEST_SUFFIX))
    os.replace(path, target)
    fsync_dir(path.parent)
    return target


def prune(directory: str | Path, keep: int) -> None:
    """Delete all but the newest `keep` valid checkpoints; damaged files are left alone and take no slot."""
    if keep < 1:
        raise CheckpointError(f"keep={keep}: at least 1 checkpoint must be kept; pass a keep of 1 or more")
    _prune(Path(directory), keep, None)


def _prune(directory: Path, keep: int, newest_valid: Path | None) -> None:
    kept = 0
    for path in candidates(directory):
        validity = "valid" if path == newest_valid else _validity(path, thorough=False)
        if validity == "damaged":
            continue  # a damaged file is evidence, not a slot
        if validity == "unfinished" and kept == 0:
            continue  # newer than every valid checkpoint: left for a resume to report and move aside
        if validity == "valid" and (kept < keep or path == newest_valid):  # the save just made is never deleted
            kept += 1
            continue
        # Older valid ones beyond `keep`, and saves a kill cut short before them (they can never become valid).
        # Manifest first: a prune killed half-way leaves an invalid file, never a valid-looking one.
        _manifest_path(path).unlink(missing_ok=True)
        path.unlink(missing_ok=True)


def _ordered(directory: Path) -> list[tuple[tuple[int, int, bool], Path]]:
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match:
            found.append((_order_of(path, match), path))
    # A step checkpoint without a usable manifest (typically the newest: its save was cut short) belongs to the
    # epoch of the checkpoints before it.
    known = [key for key, _ in found if key[0] >= 0 and key[1] >= 0]
    for i, ((epoch, step, is_epoch), path) in enumerate(found):
        if epoch < 0:
            epoch = max((e for e, s, _ in known if s <= step), default=0)
            found[i] = ((epoch, step, is_epoch), path)
    return sorted(found, key=lambda item: (item[0], item[1].name), reverse=True)


def _order_of(path: Path, match: re.Match) -> tuple[int, int, bool]:
    """(epoch, step, is epoch-end) from the manifest; without a usable one, what the name tells: an epoch-end
    checkpoint N starts epoch N (step -1: before any step checkpoint of that epoch); a step checkpoint's epoch
    is unknown (-1, filled in by `_ordered`)."""
    is_epoch = match.group(1) == "epoch"
    number = int(match.group(2))
    try:
        manifest = json.loads(_manifest_path(path).read_text())
        return int(manifest["epoch"]), int(manifest["step"]), is_epoch
    except (OSError, ValueError, KeyError, TypeError):
        return (number, -1, True) if is_epoch else (-1, number, False)


def _validity(path: Path, thorough: bool = True) -> str:
    """"valid", "unfinished" (no manifest: a save cut short) or "damaged" (anything else that fails `verify`).
    Not `thorough`: the manifest and the size only, no checksum (pruning after every save must not re-read every
    kept checkpoint; truncation and unfinished saves are what kills and full disks leave)."""
    try:
        if thorough:
            verify(path)
        else:
            _check_manifest_and_size(path)
    except CheckpointError as err:
        return "unfinished" if err.unfinished else "damaged"
    except OSError:
        return "damaged"
    return "valid"


def _manifest_path(path: Path) -> Path:
    return path.with_name(path.name + MANIFEST_SUFFIX)


def _temporary(path: Path) -> Path:
    # Host and pid in the name: a later save can tell a dead writer's leftovers from a live one's file.
    return path.with_name(f".{path.name}.tmp-{_HOST}-{os.getpid()}-{threading.get_ident()}")


_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"
_TEMPORARY = re.compile(r"^\..+\.tmp-(?P<host>[A-Za-z0-9._]+)-(?P<pid>\d+)-\d+$")


def _remove_stale_temporaries(directory: Path) -> None:
    """Temporaries left by a save that was killed; never one that a live process may still be writing."""
    for tmp in directory.glob(".*.tmp-*"):
        match = _TEMPORARY.match(tmp.name)
        if match is None:
            continue
        if match["host"] == _HOST:
            stale = int(match["pid"]) != os.getpid() and not _pid_alive(int(match["pid"]))
        else:  # another node (a requeued job moved): its pids mean nothing here, so go by age
            try:
                stale = time.time() - tmp.stat().st_mtime > FOREIGN_TEMPORARY_MAX_AGE_S
            except OSError:
                stale = False
        if stale:
            tmp.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _HashingWriter:
    """File-like wrapper for torch.save: checksums the bytes on their way to disk."""

    def __init__(self, handle) -> None:
        self._handle = handle
        self.digest = hashlib.sha256()
        self.size = 0
        self.error: OSError | None = None  # what the file refused (torch replaces it with its own message)

    def write(self, data) -> int:
        self.digest.update(data)
        self.size += memoryview(data).nbytes
        try:
            return self._handle.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        try:
            self._handle.flush()
        except OSError as err:
            self.error = err
            raise


def _sha256(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


# ---------------------------------------------------------------- saving in the background


def snapshot(state: Any) -> Any:
    """A copy of `state` that training cannot change any more: every tensor copied to CPU memory, containers
    rebuilt, other values deep-copied. Tensors shared inside `state` stay shared in the copy."""
    memo: dict[int, torch.Tensor] = {}
    pending_device_copies = [False]
    copied = _snapshot(state, memo, pending_device_copies)
    if pending_device_copies[0]:
        torch.cuda.synchronize()  # the non-blocking device-to-host copies must land before anyone reads them
    return copied


def _snapshot(value: Any, memo: dict[int, torch.Tensor], pending: list[bool]) -> Any:
    if isinstance(value, torch.Tensor):
        key = id(value)
        if key not in memo:
            memo[key] = _copy_to_cpu(value.detach(), pending)
        return memo[key]
    if isinstance(value, OrderedDict):
        return OrderedDict((k, _snapshot(v, memo, pending)) for k, v in value.items())
    if isinstance(value, dict):
        return {k: _snapshot(v, memo, pending) for k, v in value.items()}
    if isinstance(value, list):
        return [_snapshot(v, memo, pending) for v in value]
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_snapshot(v, memo, pending) for v in value))
    if isinstance(value, tuple):
        return tuple(_snapshot(v, memo, pending) for v in value)
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return value
    return copy.deepcopy(value)  # e.g. NumPy arrays in RNG states


def _copy_to_cpu(tensor: torch.Tensor, pending: list[bool]) -> torch.Tensor:
    if tensor.device.type == "cpu":
        return tensor.clone()
    if tensor.device.type == "cuda":
        # Pinned host memory lets the copy run at full bus speed without blocking per tensor; one sync at the end.
        out = torch.empty_like(tensor, device="cpu", pin_memory=True)
        out.copy_(tensor, non_blocking=True)
        pending[0] = True
        return out
    return tensor.to("cpu")


class AsyncCheckpointer:
    """Saves checkpoints in a background thread, so training pauses only for the copy of its state to CPU.

    `save()` takes the same arguments as `checkpoint.save`: it first waits for the previous write (at most one
    is in flight, so memory holds at most one extra copy of the state), copies `state` off the device, starts
    the write (the same atomic save, manifest and pruning) and returns the final path at once. A failed write
    is raised as CheckpointError by the next `save()` or `wait()`. Call `wait()` before relying on the file
    (before exiting, or before a final synchronous checkpoint); `close()` or a `with` block does that too.
    """

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpctrain-checkpoint")
        self._future: Future[Path] | None = None
        self._target: Path | None = None

    @property
    def in_flight(self) -> bool:
        return self._future is not None and not self._future.done()

    def save(
        self,
        state: dict[str, Any],
        directory: str | Path,
        name: str,
        *,
        epoch: int,
        step: int,
        world_size: int = 1,
        keep: int | None = None,
    ) -> Path:
        self.wait()
        _check_arguments(name, keep)  # save() checks too, but here it is before the copy and in the caller's thread
        copied = snapshot(state)
        self._target = Path(directory) / name
        self._future = self._executor.submit(
            save, copied, directory, name, epoch=epoch, step=step, world_size=world_size, keep=keep
        )
        return self._target

    def wait(self) -> Path | None:
        """Block until the write in flight (if any) is durable; return its path, or raise what went wrong."""
        future, target = self._future, self._target
        if future is None:
            return None
        self._future = None
        try:
            return future.result()
        except CheckpointError:
            raise
        except Exception as err:
            raise CheckpointError(
                f"writing checkpoint {target} in the background failed ({err!r}); "
                "check free space and permissions of the checkpoint directory"
            ) from err

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)

    def __enter__(self) -> AsyncCheckpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
