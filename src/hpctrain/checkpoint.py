"""Checkpoints you can trust: atomic writes, a manifest written last, and loading that cannot run code.

Layout of a checkpoint directory::

    checkpoint_epoch_2.pt               torch.save'd dict (model, optimizer, scheduler, counters, RNG, config)
    checkpoint_epoch_2.pt.manifest.json written after the .pt is durable: sha256, size, epoch, step, world size
    latest                              name of the newest complete checkpoint (a convenience; the manifests decide)

A checkpoint counts only if its manifest exists and its checksum matches, so a save killed at any moment
leaves the previous checkpoint as the newest valid one. "Newest" means most recently saved (the manifest's
`written_at`, then the step): a run resumed from an older checkpoint therefore continues its own line, not the
abandoned one with higher step numbers. Users' own scripts can call `save`/`load_latest`, or use
`AsyncCheckpointer` to write in the background while training goes on.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpctrain.errors import UserError
from hpctrain.fsutil import fsync_dir, write_atomic

FORMAT_VERSION = 1
MANIFEST_SUFFIX = ".manifest.json"
LATEST_POINTER = "latest"
_NAME = re.compile(r"^checkpoint_(epoch|step)_(\d+)\.pt$")
# Another host's temporary may belong to a live save on a shared filesystem: only this old is it surely stale.
FOREIGN_TEMPORARY_MAX_AGE_S = 3600.0

log = logging.getLogger(__name__)


class CheckpointError(UserError):
    """A checkpoint that is missing, incomplete, corrupt or not ours."""


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
    directory.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(directory)
    path = directory / name
    tmp = _temporary(path)
    try:
        with open(tmp, "wb") as handle:
            # Hash while writing: reading a large checkpoint back just to checksum it would double the I/O.
            writer = _HashingWriter(handle)
            torch.save(state, writer)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
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
    write_atomic(_manifest_path(path), json.dumps(manifest, indent=1).encode(), _temporary(_manifest_path(path)))
    write_atomic(directory / LATEST_POINTER, (name + "\n").encode(), _temporary(directory / LATEST_POINTER))
    fsync_dir(directory)
    if keep is not None:
        _prune(directory, keep, newest_valid=path)
    return path


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
    info = verify(Path(path))
    try:
        state = torch.load(info.path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises several types for a bad pickle or zip
        raise CheckpointError(f"{info.path} cannot be loaded ({err}); resume from an earlier checkpoint") from err
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{info.path} is not an hpctrain checkpoint (no 'model' entry)")
    return state


def verify(path: Path) -> CheckpointInfo:
    """Raise CheckpointError unless `path` has a matching manifest and checksum."""
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}; check the path or drop it to resume from the newest one")
    manifest_path = _manifest_path(path)
    try:
        manifest = json.loads(manifest_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} has no manifest ({manifest_path.name}): its save did not finish; "
            "resume from an earlier checkpoint"
        ) from None
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{manifest_path} is unreadable ({err}); resume from an earlier checkpoint") from err
    try:
        version = int(manifest["format_version"])
        expected_size = int(manifest["size"])
        expected_digest = str(manifest["sha256"])
        info_fields = (int(manifest["epoch"]), int(manifest["step"]), int(manifest.get("world_size", 1)))
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{manifest_path} lacks a field ({err}); resume from an earlier checkpoint") from err
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has format version {version}, newer than this hpctrain understands ({FORMAT_VERSION}); "
            "upgrade hpctrain"
        )
    size = path.stat().st_size
    if size != expected_size:
        raise CheckpointError(
            f"{path} is {size} bytes but its manifest says {expected_size}: truncated or overwritten; "
            "resume from an earlier checkpoint"
        )
    digest, _ = _sha256(path)
    if digest != expected_digest:
        raise CheckpointError(f"{path} fails its checksum: corrupt; resume from an earlier checkpoint")
    return CheckpointInfo(path, *info_fields, digest, size)


def candidates(directory: str | Path) -> list[Path]:
    """Checkpoint files in `directory`, newest (most recently saved; then highest step, epoch-end first) first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match:
            found.append((*_order_of(path, match), path))
    return [path for *_, path in sorted(found, reverse=True)]


def find_latest(directory: str | Path) -> CheckpointInfo | None:
    """The newest valid checkpoint; invalid newer ones are reported (logged) and skipped."""
    for path in candidates(directory):
        try:
            return verify(path)
        except CheckpointError as err:
            log.warning("skipping checkpoint: %s", err)
    return None


def load_latest(directory: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any] | None:
    """Load the newest valid checkpoint in `directory`, or None when there is none."""
    for path in candidates(directory):
        try:
            return load(path, map_location)
        except CheckpointError as err:
            log.warning("skipping checkpoint: %s", err)
    return None


def prune(directory: str | Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints; the newest valid one is never deleted."""
    if keep < 1:
        raise CheckpointError(f"keep={keep}: at least 1 checkpoint must be kept; pass a keep of 1 or more")
    newest_valid = find_latest(directory)
    _prune(directory, keep, newest_valid.path if newest_valid is not None else None)


def _prune(directory: str | Path, keep: int, newest_valid: Path | None) -> None:
    for path in candidates(directory)[keep:]:
        if path == newest_valid:
            continue
        # Manifest first: a prune killed half-way leaves an invalid file, never a valid-looking one.
        _manifest_path(path).unlink(missing_ok=True)
        path.unlink(missing_ok=True)


def _order_of(path: Path, match: re.Match) -> tuple[float, int, bool]:
    """(saved at, step, is epoch-end): from the manifest where it says; else the file's mtime and the name."""
    is_epoch = match.group(1) == "epoch"
    saved_at: float | None = None
    step = int(match.group(2)) if not is_epoch else -1
    try:
        manifest = json.loads(_manifest_path(path).read_text())
        step = int(manifest["step"])
        saved_at = float(manifest["written_at"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # verify() rejects a checkpoint without a usable manifest; it is listed so that it gets reported
    if saved_at is None:
        try:
            saved_at = path.stat().st_mtime
        except OSError:
            saved_at = 0.0
    return saved_at, step, is_epoch


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

    def write(self, data) -> int:
        self.digest.update(data)
        self.size += memoryview(data).nbytes
        return self._handle.write(data)

    def flush(self) -> None:
        self._handle.flush()


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
