"""One epoch of training: the steps from the run's position to the epoch's end (or to a stop the ranks agree on),
then the epoch's evaluation and metrics record; and the divergence vote."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from hpctrain.data.sampler import mix_seed
from hpctrain.distributed import all_reduce
from hpctrain.distributed.failures import collective
from hpctrain.training.loop_state import save
from hpctrain.training.evaluation import evaluate
from hpctrain.training.metrics import Progress
from hpctrain.training.parts import Parts
from hpctrain.training.run import Position, Run
from hpctrain.training.stopping import StepVote, StopReason, agree
from hpctrain.training.watch import RankWatch


@dataclass
class EpochStats:
    """One attempt's share of an epoch (an epoch interrupted and resumed spans two attempts)."""

    loss_sum: torch.Tensor
    images: int = 0
    seconds_before: float = 0.0  # training seconds the epoch had when this attempt took it up
    data_wait_seconds: float = 0.0  # this attempt's time spent waiting for training input
    bad_images: list[str] = field(default_factory=list)  # this rank's unreadable images (--skip-bad-images)


def train_epoch(
    run: Run,
    parts: Parts,
    position: Position,
    progress: Progress | None,
    watch: RankWatch,
) -> tuple[StopReason, EpochStats]:
    """Train from the position to the end of its epoch, or until the ranks agree to stop (after a checkpoint,
    unless the loss became non-finite: then nothing is written). Each step is reported to `watch`."""
    cfg, env, plan = run.cfg, run.env, parts.plan
    batches = parts.data.train_batches(plan, position.epoch, position.step_in_epoch, env.rank)
    stats = EpochStats(torch.tensor(position.loss_sum, device=run.device), 0, position.epoch_train_seconds)
    parts.wrapped.train()
    started: float | None = time.perf_counter()  # None while the training clock is stopped
    watch.epoch_started(batches.wait_seconds)
    vote = StepVote(parts.control)
    for inputs, labels in batches:
        loss = _step(run, parts, position, inputs, labels)
        stats.images += len(labels) * env.world_size
        stats.loss_sum += loss.detach()
        last = position.step_in_epoch == plan.steps_per_epoch
        if last:  # the epoch's training time ends here: its final progress line and its summary agree exactly
            position.epoch_train_seconds += _elapsed(started, run.device)
            started = None
        if run.device.type == "cpu" and not torch.isfinite(stats.loss_sum):
            run.stop.request(StopReason.DIVERGED)  # free on the CPU; on a GPU this is checked where it syncs anyway
        if progress:
            progress.step(
                position.step_in_epoch, position.step, lambda: _progress_numbers(run, position, stats, started)
            )
        with collective(f"the stop vote after step {position.step}"):
            reason = vote.after_step(run.stop.reason, settle=last)
        watch.step(position.epoch, position.step, position.step_in_epoch, len(labels), batches.wait_seconds)
        periodic = cfg.checkpoint_every and position.step % cfg.checkpoint_every == 0
        if reason is not StopReason.NONE or (periodic and not last):
            if started is not None:
                position.epoch_train_seconds += _elapsed(started, run.device)
            position.loss_sum = stats.loss_sum.item()
            if reason is StopReason.DIVERGED or diverged(run, parts, position.loss_sum):
                return StopReason.DIVERGED, stats
            with watch.long_phase("checkpointing"):
                save(run, parts, position, end_of_epoch=False, durable=reason is not StopReason.NONE)
            if reason is not StopReason.NONE:
                stats.data_wait_seconds = batches.wait_seconds
                stats.bad_images = list(getattr(batches, "bad_images", []))
                return reason, stats
            started = time.perf_counter()  # checkpoint writes do not count as training time
    stats.data_wait_seconds = batches.wait_seconds
    stats.bad_images = list(getattr(batches, "bad_images", []))
    return StopReason.NONE, stats


def _step(run: Run, parts: Parts, position: Position, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One optimizer step on this rank's batch, augmented with the step's own seed (so a resumed run draws what an
    uninterrupted one draws); advances the position and returns the loss (on the device: reading it would wait for
    the GPU)."""
    optimization = parts.optimization
    parts.generator.manual_seed(mix_seed(run.cfg.seed, position.epoch, position.step, run.env.rank))
    images = run.recipe.augment(inputs, parts.generator)
    step = position.step + 1
    loss = parts.step_graph.step(images, labels) if parts.step_graph is not None else None
    if loss is None:  # no graph, or a batch of another shape than the captured one
        loss = _eager_step(run, parts, images, labels, step)
    if optimization.scheduler_interval == "step":
        optimization.scheduler.step()
    position.step += 1
    position.step_in_epoch += 1
    return loss


def _eager_step(run: Run, parts: Parts, images: torch.Tensor, labels: torch.Tensor, step: int) -> torch.Tensor:
    """Forward, backward and optimizer step, launched from Python; returns the loss."""
    optimization = parts.optimization
    with run.recipe.autocast(run.device), collective(f"step {step}'s forward pass", only_known=True):
        loss = run.recipe.loss(parts.wrapped(images), labels)  # DDP broadcasts buffers (BatchNorm) here
    optimization.optimizer.zero_grad(set_to_none=True)
    scaler = optimization.scaler  # float16 only (hpctrain.training.precision): gradients scaled, skipped when inf
    with collective(f"step {step}'s gradient all-reduce (backward)", only_known=True):
        (loss if scaler is None else scaler.scale(loss)).backward()
    if scaler is None:
        optimization.optimizer.step()
    else:
        scaler.step(optimization.optimizer)
        scaler.update()
    return loss


def _progress_numbers(run: Run, position: Position, stats: EpochStats, started: float | None) -> tuple[float, float]:
    """The running mean loss and images/s for a progress line. images/s here and in the epoch summary measure the
    same thing: the images all ranks trained on in this attempt's share of the epoch, per second of training time
    (checkpoint writes and evaluation excluded)."""
    loss = stats.loss_sum.item() / position.step_in_epoch  # reads a device tensor: the GPU has caught up after this
    if not math.isfinite(loss):
        run.stop.request(StopReason.DIVERGED)
    running = time.perf_counter() - started if started is not None else 0.0
    return loss, _images_per_s(stats, position.epoch_train_seconds + running)


def _images_per_s(stats: EpochStats, epoch_train_seconds: float) -> float:
    return stats.images / max(epoch_train_seconds - stats.seconds_before, 1e-9)


def diverged(run: Run, parts: Parts, *losses: float) -> bool:
    """Whether any rank saw a non-finite loss (those given) or holds non-finite weights: one small vote, so every
    rank decides the same before a checkpoint is written. Called only where the loop synchronizes anyway."""
    weights = [p.detach() for p in parts.model.parameters()]
    finite = all(math.isfinite(x) for x in losses) and bool(torch.stack([w.isfinite().all() for w in weights]).all())
    with collective("the divergence vote"):
        return agree(StopReason.NONE if finite else StopReason.DIVERGED, parts.control) is StopReason.DIVERGED


def finish_epoch(run: Run, parts: Parts, position: Position, stats: EpochStats, watch: RankWatch) -> dict[str, Any]:
    """Evaluate, step an epoch-wise schedule, and return the epoch's metrics record (with the stragglers rank 0
    named during the epoch, if any)."""
    optimization = parts.optimization
    train_loss = _mean_over_ranks(stats.loss_sum, position.step_in_epoch, run.device)
    with watch.long_phase("evaluating"):
        scores = evaluate(run, parts)
    stragglers = watch.take_reported()
    if optimization.scheduler_interval == "epoch":
        optimization.scheduler.step()
    skipped = _report_bad_images(run, stats.bad_images + scores.pop("bad_images")) if run.cfg.skip_bad_images else {}
    return {
        "epoch": position.epoch + 1,
        "step": position.step,
        "train_loss": train_loss,
        "test_loss": scores["test_loss"],
        "test_accuracy": scores["test_accuracy"],
        **({"test_top5": scores["test_top5"]} if run.recipe.reports_top5 else {}),
        "images_per_s": _images_per_s(stats, position.epoch_train_seconds),
        "epoch_seconds": position.epoch_train_seconds,
        "data_wait_seconds": stats.data_wait_seconds,
        "world_size": run.env.world_size,
        "lr": optimization.optimizer.param_groups[0]["lr"],
        **skipped,
        **({"stragglers": stragglers} if stragglers else {}),
    }


def _report_bad_images(run: Run, names: list[str]) -> dict[str, int]:
    """--skip-bad-images: how many images all ranks left out this epoch (training and evaluation), said with the
    first few names (this rank's) and returned for the epoch's metrics record. A collective: every rank calls it."""
    count = torch.tensor([float(len(names))], dtype=torch.float64, device=run.device)
    if run.env.is_distributed:
        all_reduce(count)
    total = int(count.item())
    if total:
        shown = ", ".join(names[:3]) + (" ..." if total > 3 else "")
        run.say(
            f"skipped {total} unreadable image(s) this epoch (--skip-bad-images; counted in metrics.jsonl as "
            f"bad_images): {shown}"
        )
    return {"bad_images": total}


def _elapsed(started: float, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def _mean_over_ranks(total: torch.Tensor, count: int, device: torch.device) -> float:
    both = torch.stack([total.double(), torch.tensor(float(count), device=device, dtype=torch.float64)])
    with collective("the epoch's training-loss average"):
        all_reduce(both)
    return float(both[0] / both[1]) if both[1] > 0 else float("nan")
