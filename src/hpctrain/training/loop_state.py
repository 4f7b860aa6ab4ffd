"""The loop's checkpoints: what one holds, writing it (every rank writes its own part, rank 0 the rest), restoring
a position from it, and keeping the best one. Choosing which checkpoint a run continues from is `resume.py`'s job;
the files' format and atomic writes are `hpctrain.checkpoint`'s."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hpctrain import checkpoint
from hpctrain.distributed import all_reduce, barrier
from hpctrain.distributed.failures import collective
from hpctrain.errors import UserError
from hpctrain.training import rng
from hpctrain.training.parts import Parts
from hpctrain.training.recorded import check_part
from hpctrain.training.run import Position, Run
from hpctrain.training.rundir import checkpoint_dir
from hpctrain.training.stopping import vote_group
from hpctrain.training.workload import Optimization
from hpctrain.channel import note

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "hpctrain-train-v1"
OWN_PART = "own_part"  # where `resume` puts this rank's part of a job's checkpoint once loaded (never saved)
# What a `hpctrain train` checkpoint holds besides the model.
TRAIN_STATE_KEYS = (
    "optimizer",
    "scheduler",
    "epoch",
    "step",
    "step_in_epoch",
    "epoch_train_seconds",
    "ranks",
    "config",
)


def save(
    run: Run, parts: Parts, position: Position, end_of_epoch: bool, durable: bool = False, best: bool = False
) -> None:
    """Every rank saves its own state (RNG streams, loss sum, threads) as its part of the checkpoint
    (`checkpoint.save_part`), then one small all-reduce tells every rank that all parts are written, whether rank 0
    still holds the run directory's lock, and the ranks' mean loss sum; only then does rank 0 write the checkpoint,
    in the background unless `durable` (the run is about to stop) or --sync-checkpoints. Nothing here grows with
    the world size on one rank (the parts were once gathered to every rank: N RNG states each). A single process
    keeps its state in the checkpoint file, as "ranks": [state]. `best`: the checkpoint is also kept as
    checkpoint_best.pt (never pruned, never `latest`): by the background writer after its write, or before the
    barrier when writing in the foreground, so no rank waits for rank 0 outside the checkpoint's long phase."""
    mine: dict[str, Any] = {"rng": rng.capture(), "loss_sum": position.loss_sum, "threads": torch.get_num_threads()}
    name = checkpoint.checkpoint_name(position.epoch, position.step, end_of_epoch)
    path = checkpoint_dir(run.run_dir) / name
    lost = run.lock.lost() if run.is_main and run.lock is not None else None
    if run.env.is_distributed:
        ranks, lost_by_rank_0 = _save_parts(run, path, mine, lost, position.step)
        lost = lost or ("lost" if lost_by_rank_0 else None)
    else:
        ranks = [mine]
    if lost:
        raise UserError(
            f"{run.lock.path if run.lock else 'the run directory lock'} was {lost} while this run held "
            f"it (a clean-up of stale locks?): another run may now be writing {run.run_dir}, so this "
            f"one stops without writing its checkpoint at step {position.step}. Make sure no other run "
            "uses that directory, then continue with --resume"
        )
    if run.is_main:
        state = {
            "format": CHECKPOINT_FORMAT,
            "model": parts.model.state_dict(),
            "optimizer": parts.optimization.optimizer.state_dict(),
            "scheduler": parts.optimization.scheduler.state_dict(),
            "epoch": position.epoch,
            "step": position.step,
            "step_in_epoch": position.step_in_epoch,
            "epoch_train_seconds": position.epoch_train_seconds,
            "best_accuracy": position.best_accuracy,
            "world_size": run.env.world_size,
            "ranks": ranks,
            "config": run.cfg.to_dict(),
        }
        if parts.optimization.scaler is not None:  # float16: the loss scale and its growth counter
            state["scaler"] = parts.optimization.scaler.state_dict()
        also_as = checkpoint.BEST_NAME if best else None
        where = dict(
            epoch=position.epoch, step=position.step, world_size=run.env.world_size, keep=run.cfg.keep_checkpoints
        )
        if run.writer is not None:
            run.writer.save(state, checkpoint_dir(run.run_dir), name, also_as=also_as, **where)
            if durable:
                run.writer.wait()
        else:
            path = checkpoint.save(state, checkpoint_dir(run.run_dir), name, **where)
            if also_as:
                checkpoint.copy_checkpoint(path, path.with_name(also_as))
    if run.env.is_distributed:
        with collective(f"the barrier after the checkpoint at step {position.step}"):
            barrier()  # nobody runs ahead of the save (or exits before a durable one)


def _save_parts(
    run: Run,
    path: Path,
    mine: dict[str, Any],
    lost: str | None,
    step: int,
) -> tuple[dict[str, Any], bool]:
    """Write this rank's part of the checkpoint `path`, then agree with every rank (one all-reduce of three numbers)
    that all parts are written and on rank 0's lock: what the checkpoint records of its parts, and whether rank 0
    said (`lost`) that its lock was lost. A rank that cannot write its part says why; all ranks then stop with the
    same error."""
    failed = 0.0
    try:
        checkpoint.save_part(path, run.env.rank, mine)
    except (OSError, UserError) as err:
        note(log, f"rank {run.env.rank} could not write its part of checkpoint {path.name}: {err}")
        failed = 1.0
    vote = torch.tensor([1.0 if lost else 0.0, failed, float(mine["loss_sum"])], dtype=torch.float64)
    with collective(f"the checkpoint's vote on the ranks' parts at step {step}"):
        all_reduce(vote, op="sum", group=vote_group())  # on the CPU, as the stop vote (gloo even beside NCCL)
    lost_by_rank_0, failures, loss_total = vote.tolist()
    if failures and not lost_by_rank_0:
        raise UserError(
            f"{int(failures)} rank(s) could not write their part of checkpoint {path.name} in "
            f"{path.parent} (each said why above); the checkpoints written before it are intact. Fix "
            "that, then continue with --resume"
        )
    return {
        "parts": checkpoint.rank_dir(path).name,
        "world_size": run.env.world_size,
        "loss_sum_mean": loss_total / run.env.world_size,
    }, bool(lost_by_rank_0)


def load_own_part(state: dict[str, Any], source: Path, rank: int) -> None:
    """For a job's checkpoint (`state`, read from `source`): load this rank's part, the one of rank `rank` modulo
    the ranks that saved it, into state[OWN_PART], checked. Nothing for a checkpoint that holds every rank's part."""
    ranks = state["ranks"]
    if not isinstance(ranks, dict):
        return
    folder = source.parent / ranks["parts"]
    part = checkpoint.load_part(folder, rank % ranks["world_size"])
    check_part(part, checkpoint.part_path(folder, rank % ranks["world_size"]), "state")
    state[OWN_PART] = part


def saved_part(state: dict[str, Any], rank: int) -> tuple[dict[str, Any] | None, int]:
    """This rank's part of the checkpoint `state` (its random streams, loss sum, threads) and the number of ranks
    that saved it. The part is in the file for a single process or a checkpoint of the previous format ("ranks": a
    list of every rank's); a job's ranks each wrote their own, which `resume` loads into state[OWN_PART] (None when
    it has not)."""
    ranks = state["ranks"]
    if isinstance(ranks, dict):
        return state.get(OWN_PART), int(ranks["world_size"])
    return ranks[rank % len(ranks)], len(ranks)


def restore(run: Run, model: nn.Module, optimization: Optimization, state: dict[str, Any]) -> Position:
    """Load `state` (a checkpoint resumed from) into the model, the optimization and this rank's random streams;
    return the loop's position in it."""
    try:
        model.load_state_dict(state["model"])
        optimization.optimizer.load_state_dict(state["optimizer"])
        optimization.scheduler.load_state_dict(state["scheduler"])
        if optimization.scaler is not None and "scaler" in state:
            optimization.scaler.load_state_dict(state["scaler"])
    except (RuntimeError, ValueError, KeyError, TypeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(
            f"the checkpoint does not fit this run's model or optimizer ({first[:300]}); resume with "
            "the --recipe it was written with, or start a new --run-dir"
        ) from None
    mine, saved = saved_part(state, run.env.rank)
    if mine is None:
        raise UserError("this rank's part of the checkpoint was not loaded; resume through hpctrain's resume step")
    if saved != run.env.world_size and run.is_main:
        log.info(
            f"the checkpoint was written by {saved} process(es), this run has "
            f"{run.env.world_size}: the data order continues exactly, random streams (dropout) do not"
        )
    rng.restore(mine["rng"])
    # The epoch's mean divides by every step of it: at another process count, each rank continues from the
    # saved ranks' mean sum, so the mean over the new ranks still counts every earlier step once.
    ranks = state["ranks"]
    loss_sum = (
        mine["loss_sum"]
        if saved == run.env.world_size
        else (ranks["loss_sum_mean"] if isinstance(ranks, dict) else sum(r["loss_sum"] for r in ranks) / len(ranks))
    )
    return Position(
        state["epoch"],
        state["step"],
        state["step_in_epoch"],
        float(state["epoch_train_seconds"]),
        float(loss_sum),
        float(state.get("best_accuracy", -1.0)),
    )
