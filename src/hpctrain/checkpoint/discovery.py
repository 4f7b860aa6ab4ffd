"""Which checkpoint in a directory is the newest usable one: ordering the candidates and searching them.

"Newest" means furthest in training: the manifest's (epoch, step), an epoch-end checkpoint before a mid-epoch one
of the same step; never a clock, which can be wrong. A file without a usable manifest is ordered by its name.
`search` walks the candidates newest first and returns the first that verifies (and loads), with every newer one
it refused; `find_latest` and `load_latest` are its two common questions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpctrain.checkpoint.files import (
    NAME_PATTERN,
    CheckpointError,
    CheckpointInfo,
    Rejected,
    log,
    read_manifest,
    verify_and_load,
)
from hpctrain.readback import BadRunFile


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
            info, state = verify_and_load(path, map_location if load_state else None)
            return Found(info, state, rejected)
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
    match = NAME_PATTERN.match(path.name)
    return _order_of(path, match) if match else None


def _ordered(directory: Path) -> list[tuple[tuple[int, int, bool], Path]]:
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = NAME_PATTERN.match(path.name)
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
        manifest = read_manifest(path)
        return int(manifest["epoch"]), int(manifest["step"]), is_epoch
    except (OSError, BadRunFile, ValueError, KeyError, TypeError):
        return (number, -1, True) if is_epoch else (-1, number, False)
