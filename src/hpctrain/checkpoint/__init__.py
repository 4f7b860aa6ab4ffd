"""Checkpoints you can trust: atomic writes, a manifest written last, and loading that cannot run code.

Layout of a checkpoint directory::

    checkpoint_epoch_2.pt               torch.save'd dict (model, optimizer, scheduler, counters, RNG, config)
    checkpoint_epoch_2.pt.manifest.json written after the .pt is durable: sha256, size, epoch, step, world size
    checkpoint_epoch_2.pt.ranks/        a job's per-rank parts (RNG, loss sum), each written by its rank (`ranks`)
    latest                              name of the newest complete checkpoint (a convenience; the manifests decide)

A checkpoint counts only if its manifest exists and its checksum matches, so a save killed at any moment
leaves the previous checkpoint as the newest valid one. "Newest" means furthest in training: the manifest's
(epoch, step), an epoch-end checkpoint before a mid-epoch one of the same step; never a clock, which can be
wrong. A damaged file is never overwritten or pruned: a save that would replace one moves it aside first
(NAME.corrupt), and pruning keeps the newest `keep` *valid* checkpoints and leaves damaged ones alone (pruning
judges by the manifest and the size, not the checksum, so it never re-reads the kept files; a same-size bit flip
is caught when loading). A file without a manifest is not damage but a save a kill cut short (it never counted):
pruning removes it once a valid checkpoint is newer. Users' own scripts can call `save`/`load_latest`, or use
`AsyncCheckpointer` to write in the background while training goes on.

Everything public is importable from here. The modules, each importing only those after it:
`background` (AsyncCheckpointer), `writing` (save, copy_checkpoint, prune), `discovery` (candidates, search,
find_latest, load_latest), `ranks` (each rank's own part: save_part, load_part) and `files` (names, manifests,
verify, load, set_aside).
"""

from hpctrain.checkpoint.background import AsyncCheckpointer, snapshot
from hpctrain.checkpoint.discovery import Found, candidates, find_latest, load_latest, position_of, search
from hpctrain.checkpoint.files import (
    ABANDONED_SUFFIX,
    BEST_NAME,
    CORRUPT_SUFFIX,
    FORMAT_VERSION,
    INCOMPLETE_SUFFIX,
    LATEST_POINTER,
    MANIFEST_SUFFIX,
    CheckpointError,
    CheckpointInfo,
    Rejected,
    checkpoint_name,
    load,
    log,
    set_aside,
    verify,
)
from hpctrain.checkpoint.ranks import load_part, part_path, rank_dir, save_part
from hpctrain.checkpoint.writing import FOREIGN_TEMPORARY_MAX_AGE_S, copy_checkpoint, prune, save

__all__ = [
    "ABANDONED_SUFFIX",
    "BEST_NAME",
    "CORRUPT_SUFFIX",
    "FOREIGN_TEMPORARY_MAX_AGE_S",
    "FORMAT_VERSION",
    "INCOMPLETE_SUFFIX",
    "LATEST_POINTER",
    "MANIFEST_SUFFIX",
    "AsyncCheckpointer",
    "CheckpointError",
    "CheckpointInfo",
    "Found",
    "Rejected",
    "candidates",
    "checkpoint_name",
    "copy_checkpoint",
    "find_latest",
    "load",
    "load_latest",
    "load_part",
    "log",
    "position_of",
    "part_path",
    "prune",
    "rank_dir",
    "save",
    "save_part",
    "search",
    "set_aside",
    "snapshot",
    "verify",
]
