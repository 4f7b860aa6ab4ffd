"""Each rank's own part of a checkpoint (its random streams, loss sum, thread count), written by that rank beside
the checkpoint and read back on resume by that rank alone::

    checkpoint_step_400.pt              the model, optimizer, counters (rank 0 writes it)
    checkpoint_step_400.pt.ranks/       rank-0.pt, rank-1.pt, ...: each rank writes its own

Nothing about one rank's part passes through another rank: no rank gathers N parts (memory and traffic that grow
with the world on one rank, N² over a job), and a resumed rank reads one small file, not N. A part is written
atomically (temporary file, fsync, rename) with its sha256 in its first line, and read back once, never through a
symbolic link (the part or its folder), its checksum checked on those bytes and those bytes loaded with
weights_only=True.
The training loop writes every rank's part before rank 0 starts the checkpoint itself, so a checkpoint whose
manifest exists has all its parts. Pruning a checkpoint removes its parts with it (`writing`); the best copy
(checkpoint_best.pt) keeps using the parts of the checkpoint it was copied from (the manifest's "ranks" field).
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import torch

from hpctrain.checkpoint.files import CheckpointError
from hpctrain.fsutil import FileRefused, fsync_dir, refuse_symlinks, write_atomic
from hpctrain.readback import read_bytes

RANKS_SUFFIX = ".ranks"
_HEADER = b"hpctrain rank state, sha256 "  # then 64 hex digits and a newline; torch.save's bytes after it
MAX_PART_BYTES = 64 << 20  # a part is some 15 KB (more with many GPUs' generators): read back at most this much


def rank_dir(checkpoint: Path) -> Path:
    """The folder of the per-rank parts of the checkpoint file `checkpoint`."""
    return checkpoint.with_name(checkpoint.name + RANKS_SUFFIX)


def part_path(folder: Path, rank: int) -> Path:
    return folder / f"rank-{rank}.pt"


def save_part(checkpoint: Path, rank: int, state: dict[str, Any]) -> Path:
    """Write rank `rank`'s part of the checkpoint `checkpoint` (which need not exist yet): atomically, durably."""
    folder = rank_dir(checkpoint)
    refuse_symlinks(folder.parent, (folder.name,))
    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    path = part_path(folder, rank)
    write_atomic(path, _HEADER + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    fsync_dir(folder)
    return path


def load_part(folder: Path, rank: int) -> dict[str, Any]:
    """Rank `rank`'s part from `folder` (a checkpoint's `rank_dir`), checked against its checksum and loaded with
    weights_only=True; CheckpointError naming the file otherwise."""
    path = part_path(folder, rank)
    fix = "resume from an earlier checkpoint (or move this one aside)"
    try:
        data = read_bytes(path, MAX_PART_BYTES, within=folder.parent)  # neither the part nor its folder a link
    except FileRefused as err:
        raise CheckpointError(f"{path}: {err.reason}; {fix}", err.reason) from None
    except OSError as err:
        reason = "is missing" if isinstance(err, FileNotFoundError) else f"cannot be read ({err.strerror})"
        raise CheckpointError(f"rank {rank}'s part of the checkpoint, {path}, {reason}; {fix}", reason) from None
    digest, newline, payload = data[len(_HEADER) :].partition(b"\n")
    if not data.startswith(_HEADER) or not newline:
        raise CheckpointError(f"{path} is not a rank's part of an hpctrain checkpoint; {fix}", "not a rank's part")
    if hashlib.sha256(payload).hexdigest().encode() != digest:
        raise CheckpointError(f"{path} fails its checksum: corrupt; {fix}", "fails its checksum")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a bad pickle
        raise CheckpointError(f"{path} cannot be loaded ({type(err).__name__}); {fix}", "cannot be loaded") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} holds a {type(state).__name__}, not a rank's state; {fix}", "not a state")
    return state
