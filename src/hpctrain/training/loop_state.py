"""The loop's checkpoints: what one holds, writing it (every rank contributes, rank 0 writes), restoring a position
from it, and keeping the best one. Choosing which checkpoint a run continues from is `resume.py`'s job; the files'
format and atomic writes are `hpctrain.checkpoint`'s."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hpctrain import checkpoint
from hpctrain.distributed import all_gather_object, barrier
from hpctrain.distributed.failures import collective
from hpctrain.errors import UserError
from hpctrain.training import rng
from hpctrain.training.parts import Parts
from hpctrain.training.run import Position, Run
from hpctrain.training.rundir import checkpoint_dir
from hpctrain.training.workload import Optimization

CHECKPOINT_FORMAT = "hpctrain-train-v1"
LOCK_LOST = "lock_lost"  # rank 0's word on its run directory lock, in the checkpoint's gather (never saved)
# What a `hpctrain train` checkpoint holds besides the model.
TRAIN_STATE_KEYS = ("optimizer", "scheduler", "epoch", "step", "step_in_epoch", "epoch_train_seconds", "ranks",
                    "config")


def save(run: Run, parts: Parts, position: Position, end_of_epoch: bool, durable: bool = False,
         best: bool = False) -> None:
    """All ranks contribute their own state (RNG streams, loss sum: one gather); rank 0 writes, in the background
    unless `durable` (the run is about to stop) or --sync-checkpoints. `best`: the checkpoint is also kept as
    checkpoint_best.pt (never pruned, never `latest`): by the background writer after its write, or before the
    barrier when writing in the foreground, so no rank waits for rank 0 outside the checkpoint's long phase."""
    per_rank: dict[str, Any] = {"rng": rng.capture(), "loss_sum": position.loss_sum,
                                "threads": torch.get_num_threads()}
    if run.is_main and run.lock is not None:
        per_rank[LOCK_LOST] = run.lock.lost()  # rides on the gather: every rank learns it, no extra collective
    if run.env.is_distributed:
        with collective(f"the checkpoint's gather of rank states at step {position.step}"):
            gathered = all_gather_object(per_rank)
    else:
        gathered = [per_rank]
    lost = [g.pop(LOCK_LOST, None) for g in gathered][0]
    if lost:
        raise UserError(f"{run.lock.path if run.lock else 'the run directory lock'} was {lost} while this run held "
                        f"it (a clean-up of stale locks?): another run may now be writing {run.run_dir}, so this "
                        f"one stops without writing its checkpoint at step {position.step}. Make sure no other run "
                        "uses that directory, then continue with --resume")
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
            "ranks": gathered,
            "config": run.cfg.to_dict(),
        }
        if parts.optimization.scaler is not None:  # float16: the loss scale and its growth counter
            state["scaler"] = parts.optimization.scaler.state_dict()
        name = checkpoint.checkpoint_name(position.epoch, position.step, end_of_epoch)
        also_as = checkpoint.BEST_NAME if best else None
        where = dict(epoch=position.epoch, step=position.step, world_size=run.env.world_size,
                     keep=run.cfg.keep_checkpoints)
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
        raise UserError(f"the checkpoint does not fit this run's model or optimizer ({first[:300]}); resume with "
                        "the --recipe it was written with, or start a new --run-dir") from None
    ranks = state["ranks"]
    if len(ranks) != run.env.world_size and run.is_main:
        print(f"hpctrain: the checkpoint was written by {len(ranks)} process(es), this run has "
              f"{run.env.world_size}: the data order continues exactly, random streams (dropout) do not", flush=True)
    mine = ranks[run.env.rank % len(ranks)]
    rng.restore(mine["rng"])
    # The epoch's mean divides by every step of it: at another process count, each rank continues from the
    # saved ranks' mean sum, so the mean over the new ranks still counts every earlier step once.
    loss_sum = mine["loss_sum"] if len(ranks) == run.env.world_size else sum(r["loss_sum"] for r in ranks) / len(ranks)
    return Position(state["epoch"], state["step"], state["step_in_epoch"], float(state["epoch_train_seconds"]),
                    float(loss_sum), float(state.get("best_accuracy", -1.0)))
