"""Writing checkpoints: `save` (atomic, then its manifest, then the `latest` pointer), `copy_checkpoint`, `prune`.

The .pt file is written under a temporary name (host, pid and thread in it), hashed while it is written, fsynced
and renamed; its manifest is written after it, the same way. A damaged file is never overwritten or pruned: a
save that would replace one moves it aside first (NAME.corrupt), and pruning keeps the newest `keep` *valid*
checkpoints and leaves damaged ones alone (it judges by the manifest and the size, not the checksum, so it never
re-reads the kept files). A file without a manifest is a save a kill cut short: pruning removes it once a valid
checkpoint is newer. Temporaries of killed saves are removed, never those a live process may still be writing.
A checkpoint's per-rank parts (NAME.ranks/, `ranks`) go with it when it is pruned, unless checkpoint_best.pt, a
copy of it, still names them; they go when that copy is replaced by a newer best.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

import torch

from hpctrain.checkpoint.discovery import candidates
from hpctrain.checkpoint.files import (
    BEST_NAME,
    CORRUPT_SUFFIX,
    FORMAT_VERSION,
    LATEST_POINTER,
    NAME_PATTERN,
    CheckpointError,
    log,
    manifest_path,
    read_manifest,
    set_aside,
    validity,
    verify,
)
from hpctrain.checkpoint.ranks import RANKS_SUFFIX, rank_dir
from hpctrain.fsutil import format_bytes, free_bytes, fsync_dir, is_no_space, refuse_symlinks, write_atomic

# Another host's temporary may belong to a live save on a shared filesystem: only this old is it surely stale.
FOREIGN_TEMPORARY_MAX_AGE_S = 3600.0


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
    check_arguments(name, keep)
    directory = Path(directory)
    refuse_symlinks(directory.parent, (directory.name,))  # checkpoints are never written through a linked folder
    directory.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(directory)
    path = directory / name
    if (path.exists() or path.is_symlink()) and validity(path) == "damaged":
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
    if rank_dir(path).is_dir():  # the ranks' own parts (`ranks`), all written before this save began
        manifest["ranks"] = rank_dir(path).name
    try:
        write_atomic(manifest_path(path), json.dumps(manifest, indent=1).encode(), _temporary(manifest_path(path)))
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
    The copy is a hard link where the file system has them (no data is copied; a checkpoint file is never changed
    in place, only replaced, so the two names cannot diverge, and pruning the source leaves the copy whole).
    """
    info = verify(source)
    tmp = _temporary(target)
    try:
        try:
            os.link(source, tmp, follow_symlinks=False)
        except OSError as err:
            if is_no_space(err):
                raise
            shutil.copyfile(source, tmp)  # no hard links here (or not across these names): a real copy
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if is_no_space(err):
            raise _disk_full(target, err) from err
        raise
    replaced = _parts_named_by(target)
    manifest = read_manifest(source)  # hpctrain's own, just verified; its "ranks" (the parts) stays the source's
    manifest.update(file=target.name, sha256=info.sha256, size=info.size, written_at=time.time())
    write_atomic(manifest_path(target), json.dumps(manifest, indent=1).encode(), _temporary(manifest_path(target)))
    fsync_dir(target.parent)
    if replaced and replaced != manifest.get("ranks"):
        _remove_parts(target.parent, replaced, target)  # the copy it replaced held the last use of those parts
    return target


def _parts_named_by(path: Path) -> str | None:
    """The folder of per-rank parts a checkpoint's manifest names (its own, or for a copy its source's)."""
    try:
        manifest = read_manifest(path)
    except Exception:  # no manifest, or not one of ours: it names nothing
        return None
    name = manifest.get("ranks") if isinstance(manifest, dict) else None
    return name if isinstance(name, str) and name.endswith(RANKS_SUFFIX) and "/" not in name else None


def _remove_parts(directory: Path, name: str, user: Path | None) -> None:
    """Remove the per-rank parts folder `name` once neither its own checkpoint nor the copy `user` names it."""
    own = directory / name.removesuffix(RANKS_SUFFIX)
    if (own.exists() and _parts_named_by(own) == name) or (user is not None and _parts_named_by(user) == name):
        return
    shutil.rmtree(directory / name, ignore_errors=True)


def _disk_full(path: Path, err: BaseException) -> CheckpointError:
    free = free_bytes(path.parent)
    room = f", {format_bytes(free)} free" if free is not None else ""
    return CheckpointError(
        f"no space left on the device holding {path.parent} ({os.strerror(getattr(err, 'errno', 0) or 0)}{room}) "
        f"while writing checkpoint {path.name}; the checkpoints written before it are intact. Free space there "
        "(or lower --keep-checkpoints), or move the run to a larger file system, then continue with --resume"
    )


def check_arguments(name: str, keep: int | None) -> None:
    if not NAME_PATTERN.match(name):
        raise CheckpointError(
            f"checkpoint name {name!r} is not of the form checkpoint_epoch_N.pt or checkpoint_step_N.pt, so "
            "find_latest() would never see it; build it with checkpoint_name(epoch, step, end_of_epoch)"
        )
    if keep is not None and keep < 1:
        raise CheckpointError(f"keep={keep}: at least 1 checkpoint must be kept; pass a keep of 1 or more")


def prune(directory: str | Path, keep: int) -> None:
    """Delete all but the newest `keep` valid checkpoints; damaged files are left alone and take no slot."""
    if keep < 1:
        raise CheckpointError(f"keep={keep}: at least 1 checkpoint must be kept; pass a keep of 1 or more")
    _prune(Path(directory), keep, None)


def _prune(directory: Path, keep: int, newest_valid: Path | None) -> None:
    kept = 0
    for path in candidates(directory):
        judged = "valid" if path == newest_valid else validity(path, thorough=False)
        if judged == "damaged":
            continue  # a damaged file is evidence, not a slot
        if judged == "unfinished" and kept == 0:
            continue  # newer than every valid checkpoint: left for a resume to report and move aside
        if judged == "valid" and (kept < keep or path == newest_valid):  # the save just made is never deleted
            kept += 1
            continue
        # Older valid ones beyond `keep`, and saves a kill cut short before them (they can never become valid).
        # Manifest first: a prune killed half-way leaves an invalid file, never a valid-looking one.
        parts = _parts_named_by(path) or (rank_dir(path).name if rank_dir(path).is_dir() else None)  # or a cut save's
        manifest_path(path).unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        if parts:  # its ranks' parts, unless the best checkpoint's copy still uses them
            _remove_parts(directory, parts, directory / BEST_NAME)


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
