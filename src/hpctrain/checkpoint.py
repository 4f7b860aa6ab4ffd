"""Checkpoints you can trust: atomic writes, a manifest written last, and loading that cannot run code.

Layout of a checkpoint directory::

    checkpoint_epoch_2.pt               torch.save'd dict (model, optimizer, scheduler, counters, RNG, config)
    checkpoint_epoch_2.pt.manifest.json written after the .pt is durable: sha256, size, epoch, step, world size
    latest                              name of the newest complete checkpoint (a convenience; the manifests decide)

A checkpoint counts only if its manifest exists and its checksum matches, so a save killed at any moment
leaves the previous checkpoint as the newest valid one. Users' own scripts can call `save`/`load_latest`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpctrain.errors import UserError

FORMAT_VERSION = 1
MANIFEST_SUFFIX = ".manifest.json"
LATEST_POINTER = "latest"
_NAME = re.compile(r"^checkpoint_(epoch|step)_(\d+)\.pt$")

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

    Keeps the newest `keep` checkpoints (by step) when `keep` is given.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(directory)
    path = directory / name
    tmp = _temporary(path)
    torch.save(state, tmp)
    _fsync_file(tmp)
    digest, size = _sha256(tmp)
    os.replace(tmp, path)
    manifest = {
        "format_version": FORMAT_VERSION,
        "file": name,
        "sha256": digest,
        "size": size,
        "epoch": epoch,
        "step": step,
        "world_size": world_size,
        "written_at": time.time(),
    }
    _write_atomic(_manifest_path(path), json.dumps(manifest, indent=1).encode())
    _write_atomic(directory / LATEST_POINTER, (name + "\n").encode())
    _fsync_dir(directory)
    if keep is not None:
        prune(directory, keep)
    return path


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
    """Checkpoint files in `directory`, newest (highest step, epoch-end after mid-epoch) first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match:
            found.append((_step_of(path), match.group(1) == "epoch", path))
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
    paths = candidates(directory)
    newest_valid = find_latest(directory)
    for path in paths[keep:]:
        if newest_valid is not None and path == newest_valid.path:
            continue
        _manifest_path(path).unlink(missing_ok=True)
        path.unlink(missing_ok=True)


def _step_of(path: Path) -> int:
    """Step from the manifest when there is one, so epoch and step checkpoints order correctly."""
    try:
        return int(json.loads(_manifest_path(path).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        match = _NAME.match(path.name)
        # No manifest: order by the name's number; verify() will reject it anyway.
        return int(match.group(2)) if match and match.group(1) == "step" else -1


def _manifest_path(path: Path) -> Path:
    return path.with_name(path.name + MANIFEST_SUFFIX)


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _remove_stale_temporaries(directory: Path) -> None:
    """Temporaries left by a save that was killed; never ones of a live process in this directory."""
    for tmp in directory.glob(".*.tmp-*"):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = _temporary(path)
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
