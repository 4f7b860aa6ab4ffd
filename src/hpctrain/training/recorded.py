"""What a checkpoint recorded, checked before a run uses it: its settings (the defaults of --resume and --evaluate)
with the command line's own rules, and its training position and per-rank state (counters, random streams, loss
sums, thread counts) against the shapes `training.loop_state.save` writes.

A checkpoint passes its checksum when it is the file that was written, not when what was written makes sense: one
written by another version, edited, or crafted holds settings of any type. Each is refused here, in one line that
names the checkpoint and the field, before data loads or a process group starts; never as a traceback once the run
has started.
"""

from __future__ import annotations

import math
import typing
from pathlib import Path
from typing import Any

import torch

from hpctrain.config import TrainConfig
from hpctrain.errors import UserError, brief
from hpctrain.readback import check_value
from hpctrain.training import rng

_COUNTERS = ("epoch", "step", "step_in_epoch")


def settings_with(
    cfg: TrainConfig, changes: dict[str, Any], source: Path | None, overridable: tuple[str, ...] = ()
) -> TrainConfig:
    """`cfg` with a checkpoint's recorded settings `changes` (config field -> value) in place, each checked as the
    command line checks its flag: the field's type first, then TrainConfig's own rules on the result. `overridable`:
    the fields a flag given on the command line may replace (named in the fix)."""
    check_types(changes, source, overridable)
    try:
        return cfg.replace(**changes)
    except UserError as err:
        name = next((n for n in changes if f"--{n.replace('_', '-')} " in str(err)), None)
        raise refused(
            source,
            "settings",
            f"fail the command line's check ({str(err).rstrip('.')})",
            name if name in overridable else None,
        ) from None


def check_types(settings: dict[str, Any], source: Path | None, overridable: tuple[str, ...] = ()) -> None:
    """Each of a checkpoint's recorded `settings` (config field -> value) of its TrainConfig field's type."""
    hints = typing.get_type_hints(TrainConfig)
    for name, value in settings.items():
        if name in hints and (problem := check_value(value, hints[name])):
            raise refused(source, f"setting {name}", problem, name if name in overridable else None)


def check_state(state: dict[str, Any], source: Path | None) -> None:
    """The training position and the per-rank state of a `hpctrain train` checkpoint: whole counters, a finite
    training time, one record per saved rank with random streams `rng.restore` takes, a numeric loss sum and a
    positive thread count. UserError naming `source` and the field otherwise."""
    for name in _COUNTERS:
        if type(state.get(name)) is not int or state[name] < 0:
            raise refused(source, name, f"is {brief(state.get(name), 40)}, not a whole number of at least 0")
    for name in ("epoch_train_seconds", "best_accuracy"):
        value = state.get(name, 0.0)
        if not _number(value) or not math.isfinite(float(value)):
            raise refused(source, name, f"is {brief(value, 40)}, not a finite number")
    ranks = state.get("ranks")
    if isinstance(ranks, dict) and "parts" in ranks:  # a job's checkpoint: each rank's part in a file of its own
        check_parts_record(ranks, source)
    elif not isinstance(ranks, list) or not ranks:
        raise refused(
            source,
            "ranks",
            f"is {brief(ranks, 40)}, not a list of the saved processes' states nor a record of their parts",
        )
    for index, rank in enumerate(ranks if isinstance(ranks, list) else []):
        check_part(rank, source, f"ranks[{index}]")
    if not _threads(state["config"].get("threads")):
        raise refused(source, "setting threads", f"is {brief(state['config'].get('threads'), 40)}, not a thread count")


def check_parts_record(ranks: dict[str, Any], source: Path | None) -> None:
    """What a job's checkpoint says of its ranks' parts: their folder beside it, how many ranks, their mean loss sum."""
    parts, world, mean = ranks.get("parts"), ranks.get("world_size"), ranks.get("loss_sum_mean")
    if not (isinstance(parts, str) and parts.endswith(".ranks") and "/" not in parts and parts not in (".", "..")):
        raise refused(source, "ranks.parts", f"is {brief(parts, 40)}, not the name of a folder of ranks' parts")
    if type(world) is not int or world < 1:
        raise refused(source, "ranks.world_size", f"is {brief(world, 40)}, not a number of processes")
    if not _number(mean):
        raise refused(source, "ranks.loss_sum_mean", f"is {brief(mean, 40)}, not a number")


def check_part(rank: Any, source: Path | None, field: str) -> None:
    """One rank's saved state: random streams `rng.restore` takes, a numeric loss sum and a positive thread count."""
    if not isinstance(rank, dict):
        raise refused(source, field, f"is {brief(rank, 40)}, not a process's state")
    if problem := rng.problem(rank.get("rng")):
        raise refused(source, f"{field}.rng", problem)
    if not _number(rank.get("loss_sum")):
        raise refused(source, f"{field}.loss_sum", f"is {brief(rank.get('loss_sum'), 40)}, not a number")
    if not _threads(rank.get("threads")):
        raise refused(source, f"{field}.threads", f"is {brief(rank.get('threads'), 40)}, not a thread count")


def _threads(value: Any) -> bool:
    return value is None or (type(value) is int and value >= 1)


def _number(value: Any) -> bool:
    """A number as a checkpoint may hold one: an int or float (not a bool), or a one-element real tensor."""
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.dtype.is_complex and value.dtype != torch.bool
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def refused(source: Path | None, field: str, problem: str, flag: str | None = None) -> UserError:
    fix = f"give --{flag.replace('_', '-')} on the command line, " if flag else ""
    return UserError(
        f"{source or 'the checkpoint'}: its recorded {field} {problem}; it cannot be resumed as it "
        f"is: {fix}resume from another checkpoint, or start a new --run-dir"
    )
