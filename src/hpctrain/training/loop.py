"""The training loop shared by every recipe: set up, resume, then step, evaluate and checkpoint, top to bottom.

The same function runs as one CPU process, on one GPU, as one of many DDP processes (torchrun, srun, local spawn)
or with DataParallel; what differs is decided once, in `setup_run`, from the config and the detected environment.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import yaml
from torch import nn
from torch.nn import functional as F

from hpctrain import checkpoint
from hpctrain.config import TrainConfig, data_label, default_run_dir, earlier_default_run_dir
from hpctrain.data.sampler import EpochPlan, mix_seed
from hpctrain.data.source import DataSource
from hpctrain.distributed import DistEnv, destroy_process_group, detect, init_process_group, resolve_device
from hpctrain.distributed.cores import available_cores, choose_threads, default_threads
from hpctrain.distributed.failures import announce, collective, peer_failures
from hpctrain.distributed.probes import may_be_a_restart
from hpctrain.errors import UserError
from hpctrain.fsutil import DirectoryLock, LocksUnsupported, refuse_symlinks, write_atomic
from hpctrain.recipes import Recipe, get_recipe
from hpctrain.recipes.base import Optimization
from hpctrain.training import rng
from hpctrain.training.metrics import METRICS_FILE, TENSORBOARD_DIR, MetricsLog, Progress
from hpctrain.training.provenance import PROVENANCE_FILE, record_attempt
from hpctrain.training.stopping import STOP_REASON_FILE, StopReason, StopRequest, agree, vote_group, write_stop_reason

CONFIG_FILE = "config.yaml"
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_FORMAT = "hpctrain-train-v1"
# Held (flock) by rank 0 for the whole run: one run at a time in a run directory.
LOCK_FILE = ".hpctrain.lock"
# Files of the run directory that hpctrain writes itself: never through a symbolic link.
RUN_FILES = (CONFIG_FILE, METRICS_FILE, PROVENANCE_FILE, STOP_REASON_FILE, LOCK_FILE)
# Its directories too: a linked checkpoints/ or tb/ would put checkpoints, manifests and events elsewhere.
RUN_DIRECTORIES = (CHECKPOINT_DIR, TENSORBOARD_DIR)
# What a `hpctrain train` checkpoint holds besides the model.
TRAIN_STATE_KEYS = ("optimizer", "scheduler", "epoch", "step", "step_in_epoch", "epoch_train_seconds", "ranks",
                    "config")
# Fields that fix which data, model, crops and batch order a run has: a checkpoint cannot continue under other
# values (an image size changed mid-run would change every later crop: no exact resume; none has an override).
RESUME_MUST_MATCH = ("workload", "recipe", "dataset", "synthetic", "batch_size", "train_limit", "seed", "arch",
                     "image_size", "val_size")
# What a --resume or --evaluate takes from its checkpoint's config when the command line leaves it unset: the
# run's own settings, so that resuming needs no flag repeated (a flag given that contradicts RESUME_MUST_MATCH is
# still refused; --epochs and --lr given are honoured: extending a run, lowering the rate after a divergence).
RECORDED_DEFAULTS = (*RESUME_MUST_MATCH, "epochs", "lr", "test_batch_size", "test_limit", "momentum",
                     "weight_decay")
# What torch's DDP prints on every rank when find_unused_parameters finds none (see `_wrap`: we set it on purpose).
UNUSED_PARAMETERS_WARNING = "find_unused_parameters=True was specified in DDP constructor"


def checkpoint_dir(run_dir: Path) -> Path:
    """Where a run's checkpoint files go: RUN_DIR/checkpoints. A run directory itself named `checkpoints` (the seed
    scripts' `--checkpoints-path ./checkpoints`) holds them directly, not in checkpoints/checkpoints."""
    return run_dir if run_dir.name == CHECKPOINT_DIR else run_dir / CHECKPOINT_DIR


@dataclass
class RunResult:
    run_dir: Path
    epochs_completed: int
    step: int
    stop_reason: StopReason
    last_metrics: dict[str, Any] | None = None


@dataclass
class Position:
    """The loop's own counters: everything besides model/optimizer state that a resume needs."""

    epoch: int = 0  # epochs completed; the epoch in progress is `epoch` (0-based)
    step: int = 0  # optimizer steps completed in the whole run
    step_in_epoch: int = 0  # optimizer steps completed in the epoch in progress
    epoch_train_seconds: float = 0.0  # training time spent in the epoch in progress before the last checkpoint
    loss_sum: float = 0.0  # this rank's sum of training losses in the epoch in progress (for the epoch's mean)
    best_accuracy: float = -1.0  # the best test accuracy at an epoch end so far (for checkpoint_best.pt)

    def next_epoch(self) -> None:
        self.epoch += 1
        self.step_in_epoch, self.epoch_train_seconds, self.loss_sum = 0, 0.0, 0.0


@dataclass
class Run:
    """Everything `setup_run` resolved; the loop below only reads it."""

    cfg: TrainConfig
    recipe: Recipe
    env: DistEnv
    device: torch.device
    strategy: str
    run_dir: Path
    resume_from: dict[str, Any] | None
    stop: StopRequest = field(default_factory=StopRequest)
    # Rank 0's checkpoint writer: saves in a background thread after copying the state off the device.
    writer: checkpoint.AsyncCheckpointer | None = None
    # Rank 0's exclusive lock on the run directory, released (and its file removed) when the run ends.
    lock: DirectoryLock | None = None
    # The checkpoint resumed from already has every epoch asked for: nothing to train.
    complete: bool = False

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    def say(self, message: str) -> None:
        if self.is_main:
            print(f"hpctrain: {message}", flush=True)


def train(cfg: TrainConfig) -> RunResult:
    run = setup_run(cfg)
    if run.complete:
        run.release()
        return RunResult(run.run_dir, run.resume_from["epoch"], run.resume_from["step"], StopReason.NONE)
    with run.stop:
        init_process_group(run.env, run.device, run.cfg.dist_timeout)
        announce(run.env)
        if run.is_main and run.cfg.async_checkpoints:
            run.writer = checkpoint.AsyncCheckpointer()
        try:
            with peer_failures(run.env, run.cfg.dist_timeout):
                result = _train(run)
            if run.writer is not None:
                run.writer.wait()  # the last checkpoint is durable before the process reports success
        finally:
            if run.writer is not None:
                run.writer.close()
            destroy_process_group()
            run.release()
        _report_end(run, result)
        run.stop.finish()  # from here on, a late signal cannot turn this outcome into a death by signal
        return result


@dataclass
class Parts:
    """What the loop works with, built once per attempt by `_build`."""

    data: DataSource
    plan: EpochPlan
    model: nn.Module  # the plain module: what checkpoints hold
    wrapped: nn.Module  # what trains: DDP/DataParallel around `model`, or `model` itself
    optimization: Optimization
    control: Any  # process group for the per-step stop vote (None: single process)
    generator: torch.Generator  # augmentation randomness, re-seeded every step


@dataclass
class EpochStats:
    """One attempt's share of an epoch (an epoch interrupted and resumed spans two attempts)."""

    loss_sum: torch.Tensor
    images: int = 0
    seconds_before: float = 0.0  # training seconds the epoch had when this attempt took it up
    data_wait_seconds: float = 0.0  # this attempt's time spent waiting for training input
    bad_images: list[str] = field(default_factory=list)  # this rank's unreadable images (--skip-bad-images)


def _train(run: Run) -> RunResult:
    cfg = run.cfg
    parts, position = _build(run)
    metrics, progress = _start_reporting(run, parts, position)
    reason, record = StopReason.NONE, None
    while position.epoch < cfg.epochs:
        if progress:
            progress.start_epoch(position.epoch + 1, position.step_in_epoch)
        reason, stats = _train_epoch(run, parts, position, progress)
        if progress:
            progress.end_epoch()
        if reason is not StopReason.NONE:
            break
        finished = _finish_epoch(run, parts, position, stats)
        if _diverged(run, parts, finished["train_loss"], finished["test_loss"]):
            reason = StopReason.DIVERGED  # nothing of this epoch is kept: no checkpoint, no metrics record
            break
        record = finished
        improved = record["test_accuracy"] > position.best_accuracy
        position.best_accuracy = max(position.best_accuracy, record["test_accuracy"])
        position.next_epoch()
        _save(run, parts, position, end_of_epoch=True)
        if improved and run.recipe.keeps_best:
            _keep_best(run, position)
        if metrics:
            metrics.epoch(record)
            run.say(f"epoch {record['epoch']}/{cfg.epochs}: train loss {record['train_loss']:.4f}, test loss "
                    f"{record['test_loss']:.4f}, test accuracy {100 * record['test_accuracy']:.2f}%, "
                    f"{record['images_per_s']:,.0f} images/s, {record['epoch_seconds']:.1f} s")

    if run.is_main:
        write_stop_reason(run.run_dir, reason)
    if metrics:
        metrics.close()
    return RunResult(run.run_dir, position.epoch, position.step, reason, record)


def _report_end(run: Run, result: RunResult) -> None:
    """The last lines: how the run ended, where its run directory and newest checkpoint are, what to do next."""
    if not run.is_main:
        return
    latest = checkpoint.find_latest(checkpoint_dir(run.run_dir))
    where = f"run dir {run.run_dir}, last checkpoint {latest.path if latest is not None else '(none)'}"
    reason = result.stop_reason
    if reason is StopReason.NONE:
        run.say(f"completed {result.epochs_completed} epoch(s), global step {result.step}; {where}")
    elif reason is StopReason.DIVERGED:
        print(f"hpctrain train: error: the training loss became non-finite (inf or nan) by global step {result.step}:"
              f" the run diverged and stopped without writing a checkpoint after that; {where}. Start again with a "
              f"lower --lr (this run: {run.cfg.lr:g}), or continue from that checkpoint with `--resume --lr LOWER`",
              file=sys.stderr, flush=True)
    else:
        if run.stop.signal_name is not None:
            why = f"{run.stop.signal_name} received"
        else:  # only possible with several processes: the vote carries the reason, not the signal
            why = "a signal reached another process"
        run.say(f"stopped ({reason.label}: {why}) at global step {result.step} after writing a checkpoint; {where}. "
                f"{_how_to_continue(reason)}")


def _how_to_continue(reason: StopReason) -> str:
    """After a stop: inside a Slurm job that hpctrain submitted, a time-limit warning makes the batch script requeue
    the job, and the next attempt resumes by itself; anywhere else, the user continues the run."""
    if reason is StopReason.PREEMPTED and os.environ.get("SLURM_JOB_ID") and os.environ.get("HPCTRAIN_RUN_DIR"):
        return ("The job's batch script requeues the job (within its --max-requeues) and the next attempt resumes "
                "from that checkpoint by itself; nothing to do")
    return "Continue with `--resume` and the same --run-dir"


def _build(run: Run) -> tuple[Parts, Position]:
    cfg, recipe, device = run.cfg, run.recipe, run.device
    data = recipe.data_source(cfg, device, run.env)
    plan = EpochPlan(data.num_train, cfg.batch_size, run.env.world_size, cfg.seed)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank and in every strategy
    model = recipe.build_model().to(device)
    optimization = recipe.build_optimization(model, cfg.lr, cfg.epochs, plan.steps_per_epoch)
    if run.resume_from is not None:
        position = _restore(run, model, optimization, run.resume_from)
    else:
        position = Position()
        torch.manual_seed(mix_seed(cfg.seed, run.env.rank))  # dropout differs between ranks, as it should
    parts = Parts(data, plan, model, _wrap(model, run), optimization, _control_group(run), torch.Generator(device))
    return parts, position


def _start_reporting(run: Run, parts: Parts, position: Position) -> tuple[MetricsLog | None, Progress | None]:
    hosts = _all_hostnames(run.env)  # a collective: every rank takes part, not only the main one
    if not run.is_main:
        return None, None
    cfg, plan = run.cfg, parts.plan
    _write_run_files(run, hosts)
    metrics = MetricsLog(run.run_dir, position.step if run.resume_from is not None else None)
    progress = Progress(cfg.epochs, plan.steps_per_epoch, cfg.log_interval, on_report=metrics.train_loss,
                        every_steps=cfg.print_freq)
    where = f"{run.env.world_size} process(es), {run.strategy}, {run.device.type}"
    run.say(f"training {cfg.workload}/{cfg.recipe} on {data_label(cfg)} ({plan.num_samples} images) with {where}; "
            f"run dir {run.run_dir}")
    scaling = run.recipe.describe_scaling(cfg, run.env.world_size)
    if scaling:
        run.say(scaling)
    for warning in run.recipe.warnings(cfg, plan.num_samples, plan.steps_per_epoch):
        print(f"hpctrain: warning: {warning}", file=sys.stderr, flush=True)
    from hpctrain.tbserver import train_hint

    run.say(train_hint(run.run_dir))
    if run.resume_from is not None:
        run.say(f"resumed at epoch {position.epoch + 1}, step {position.step_in_epoch} of "
                f"{plan.steps_per_epoch} (global step {position.step})")
    return metrics, progress


def _train_epoch(run: Run, parts: Parts, position: Position, progress: Progress | None,
                 ) -> tuple[StopReason, EpochStats]:
    """Train from the position to the end of its epoch, or until the ranks agree to stop (after a checkpoint,
    unless the loss became non-finite: then nothing is written)."""
    cfg, env, plan, optimization = run.cfg, run.env, parts.plan, parts.optimization
    batches = parts.data.train_batches(plan, position.epoch, position.step_in_epoch, env.rank)
    stats = EpochStats(torch.tensor(position.loss_sum, device=run.device), 0, position.epoch_train_seconds)
    parts.wrapped.train()
    started: float | None = time.perf_counter()  # None while the training clock is stopped
    for inputs, labels in batches:
        parts.generator.manual_seed(mix_seed(cfg.seed, position.epoch, position.step, env.rank))
        images = run.recipe.augment(inputs, parts.generator)
        step = position.step + 1
        with run.recipe.autocast(run.device), collective(f"step {step}'s forward pass", only_known=True):
            loss = run.recipe.loss(parts.wrapped(images), labels)  # DDP broadcasts buffers (BatchNorm) here
        optimization.optimizer.zero_grad(set_to_none=True)
        with collective(f"step {step}'s gradient all-reduce (backward)", only_known=True):
            loss.backward()
        optimization.optimizer.step()
        if optimization.scheduler_interval == "step":
            optimization.scheduler.step()
        position.step += 1
        position.step_in_epoch += 1
        stats.images += len(labels) * env.world_size
        stats.loss_sum += loss.detach()
        last = position.step_in_epoch == plan.steps_per_epoch
        if last:  # the epoch's training time ends here: its final progress line and its summary agree exactly
            position.epoch_train_seconds += _elapsed(started, run.device)
            started = None
        if run.device.type == "cpu" and not torch.isfinite(stats.loss_sum):
            run.stop.request(StopReason.DIVERGED)  # free on the CPU; on a GPU this is checked where it syncs anyway
        if progress:
            progress.step(position.step_in_epoch, position.step,
                          lambda: _progress_numbers(run, position, stats, started))
        with collective(f"the stop vote after step {position.step}"):
            reason = agree(run.stop.reason, parts.control)
        periodic = cfg.checkpoint_every and position.step % cfg.checkpoint_every == 0
        if reason is not StopReason.NONE or (periodic and not last):
            if started is not None:
                position.epoch_train_seconds += _elapsed(started, run.device)
            position.loss_sum = stats.loss_sum.item()
            if reason is StopReason.DIVERGED or _diverged(run, parts, position.loss_sum):
                return StopReason.DIVERGED, stats
            _save(run, parts, position, end_of_epoch=False, durable=reason is not StopReason.NONE)
            if reason is not StopReason.NONE:
                stats.data_wait_seconds = batches.wait_seconds
                stats.bad_images = list(getattr(batches, "bad_images", []))
                return reason, stats
            started = time.perf_counter()  # checkpoint writes do not count as training time
    stats.data_wait_seconds = batches.wait_seconds
    stats.bad_images = list(getattr(batches, "bad_images", []))
    return StopReason.NONE, stats


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


def _diverged(run: Run, parts: Parts, *losses: float) -> bool:
    """Whether any rank saw a non-finite loss (those given) or holds non-finite weights: one small vote, so every
    rank decides the same before a checkpoint is written. Called only where the loop synchronizes anyway."""
    weights = [p.detach() for p in parts.model.parameters()]
    finite = all(math.isfinite(x) for x in losses) and bool(torch.stack([w.isfinite().all() for w in weights]).all())
    with collective("the divergence vote"):
        return agree(StopReason.NONE if finite else StopReason.DIVERGED, parts.control) is StopReason.DIVERGED


def _finish_epoch(run: Run, parts: Parts, position: Position, stats: EpochStats) -> dict[str, Any]:
    """Evaluate, step an epoch-wise schedule, and return the epoch's metrics record."""
    optimization = parts.optimization
    train_loss = _mean_over_ranks(stats.loss_sum, position.step_in_epoch, run.device)
    scores = evaluate(run, parts)
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
    }


def _report_bad_images(run: Run, names: list[str]) -> dict[str, int]:
    """--skip-bad-images: how many images all ranks left out this epoch (training and evaluation), said with the
    first few names (this rank's) and returned for the epoch's metrics record. A collective: every rank calls it."""
    count = torch.tensor([float(len(names))], dtype=torch.float64, device=run.device)
    if run.env.is_distributed:
        dist.all_reduce(count)
    total = int(count.item())
    if total:
        shown = ", ".join(names[:3]) + (" ..." if total > 3 else "")
        run.say(f"skipped {total} unreadable image(s) this epoch (--skip-bad-images; counted in metrics.jsonl as "
                f"bad_images): {shown}")
    return {"bad_images": total}


# ---------------------------------------------------------------- set-up


def setup_run(cfg: TrainConfig) -> Run:
    """Resolve the config, environment, device and strategy, lock the run directory and validate the resume point:
    everything that can fail on bad input happens here, before any run file is written."""
    recipe = get_recipe(cfg.workload, cfg.recipe).for_config(cfg)
    cfg = resolve_config(cfg, recipe)
    env = detect(init_method=cfg.dist_init_method)
    device = resolve_device(cfg.device, env)
    check_dist_backend(cfg, device)
    strategy = resolve_strategy(cfg.strategy, env, device)
    torch.backends.cudnn.benchmark = cudnn_benchmark(recipe, device)
    run_dir = Path(cfg.run_dir)
    # Rank 0 locks the run directory before it looks at the checkpoints: the ones it resumes from (and the damaged
    # ones it moves aside) cannot change under it. A directory that does not exist yet holds nothing to resume and
    # is created (and locked) only once the resume point has been checked, so a refused run leaves no directory.
    locked_first = env.rank == 0 and run_dir.is_dir()
    lock = _lock_run_dir(run_dir) if locked_first else None
    try:
        if locked_first:  # before the checkpoints are read (and damaged ones moved aside) through a linked folder
            refuse_symlinks(run_dir, RUN_DIRECTORIES)
        point = _resume_point(cfg, env)
        if env.rank == 0:
            if not locked_first:
                lock = _lock_run_dir(run_dir)
            refuse_symlinks(run_dir, RUN_FILES + RUN_DIRECTORIES)
            if point is not None:
                point.tidy(checkpoint_dir(run_dir))
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    state = point.state if point is not None else None
    threads = resolve_threads(cfg, env, state)
    torch.set_num_threads(threads)
    cfg = cfg.replace(threads=threads)
    run = Run(cfg, recipe, env, device, strategy, run_dir, state, lock=lock)
    if state is not None and state["epoch"] >= cfg.epochs:
        run.complete = True
        if run.is_main:
            write_stop_reason(run_dir, StopReason.NONE)  # true, and a batch script must not requeue it
        run.say(f"{run_dir} is already complete: its checkpoint ({point.source}) has {state['epoch']} epoch(s), "
                f"global step {state['step']}, and --epochs is {cfg.epochs}; nothing to train. To train further, "
                f"resume with a larger --epochs (e.g. --resume --epochs {state['epoch'] + 1})")
    return run


def resolve_threads(cfg: TrainConfig, env: DistEnv, state: dict[str, Any] | None) -> int:
    """This process's torch thread count. torch's CPU kernels split their sums by thread, so another count gives
    other floating-point results: a resumed run keeps the count its checkpoint recorded for this rank (the first
    attempt's), even when other programs now keep cores busy (slower, never different), unless --threads asks
    for another (honoured, with a warning that the run is no longer bitwise the uninterrupted one). Rank 0 says
    what it decided, once for the whole job."""
    chosen = choose_threads(cfg.threads, env.local_world_size)
    chosen_by_us = cfg.threads_chosen or cfg.threads is None
    recorded = _recorded_threads(state, env) if state is not None else None
    say = (lambda text: print(f"hpctrain: {text}", file=sys.stderr, flush=True)) if env.rank == 0 else (
        lambda text: None)
    idle = default_threads(env.local_world_size)
    if recorded is None or recorded == chosen:
        if state is None and chosen_by_us and chosen < idle:
            say(f"other programs keep some of this process's cores busy: training with {chosen} thread(s) per "
                f"process rather than {idle}, which would wait on each other (--threads N to choose)")
        return chosen
    if not chosen_by_us:
        say(f"warning: --threads {chosen}, but this run was trained with {recorded} thread(s) per process: torch "
            f"sums in another order with another count, so from here on the run is no longer bitwise the same as "
            f"an uninterrupted one (drop --threads to continue with {recorded})")
        return chosen
    cores = available_cores()
    if recorded > cores:
        say(f"warning: this run was trained with {recorded} thread(s) per process, but only {cores} core(s) are "
            f"usable here: continuing with {cores}, so the run is no longer bitwise the same as an uninterrupted "
            f"one (resume where {recorded} cores are free to keep it exact)")
        return cores
    if recorded > chosen:
        say(f"warning: other programs keep some of this process's cores busy, but this run was trained with "
            f"{recorded} thread(s) per process: continuing with {recorded} so the results stay exactly those of an "
            f"uninterrupted run (slower while the cores are busy; --threads {chosen} is faster but changes results)")
    return recorded


def _recorded_threads(state: dict[str, Any], env: DistEnv) -> int | None:
    """The thread count this rank trained with: its own record in the checkpoint (same process count), else the
    one the run's config recorded; None for checkpoints that recorded neither."""
    ranks = state.get("ranks") or []
    if len(ranks) == env.world_size and isinstance(ranks[env.rank], dict) and ranks[env.rank].get("threads"):
        return int(ranks[env.rank]["threads"])
    recorded = state.get("config", {}).get("threads")
    return int(recorded) if isinstance(recorded, int) and recorded > 0 else None


def check_resume_point(cfg: TrainConfig, env: DistEnv) -> dict[str, Any] | None:
    """The checkpoint state to continue from (None: a fresh run), refusing unusable ones and accidental reuse.
    Changes nothing on disk."""
    point = _resume_point(cfg, env)
    return point.state if point is not None else None


def check_run_dir_free(run_dir: Path) -> None:
    """UserError if another run holds `run_dir`'s lock (for a launcher to check before it starts workers)."""
    if run_dir.is_dir():
        _lock_run_dir(run_dir).release()


def _lock_run_dir(run_dir: Path) -> DirectoryLock | None:
    holder = (f"pid {os.getpid()} on {socket.gethostname()}, started "
              f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    try:
        return DirectoryLock.acquire(run_dir, LOCK_FILE, holder)
    except LocksUnsupported as err:
        print(f"hpctrain: warning: {err}", file=sys.stderr, flush=True)
        return None


def _resume_point(cfg: TrainConfig, env: DistEnv) -> ResumePoint | None:
    point = _resume_state(cfg, Path(cfg.run_dir), env)
    if point is not None:
        _check_resumable(cfg, point.state, point.source)
    return point


def resolve_config(cfg: TrainConfig, recipe: Recipe) -> TrainConfig:
    if cfg.dataset not in recipe.datasets:
        raise UserError(f"--dataset {cfg.dataset!r} is not available for {cfg.workload}; "
                        f"choose one of: {', '.join(recipe.datasets)}")
    d = recipe.defaults
    return cfg.replace(
        epochs=cfg.epochs or d.epochs,
        batch_size=cfg.batch_size or d.batch_size,
        lr=cfg.lr or d.lr,
        test_batch_size=cfg.test_batch_size or d.test_batch_size,
        run_dir=cfg.run_dir or default_run_dir(cfg),
        **{name: value for name, value in recipe.resolved_options().items() if getattr(cfg, name) is None},
    )


def resolve_strategy(requested: str, env: DistEnv, device: torch.device) -> str:
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if requested == "auto":
        return "ddp" if env.is_distributed else "single"
    if requested == "single" and env.is_distributed:
        raise UserError(f"--strategy single, but this process is rank {env.rank} of {env.world_size} "
                        f"(launched by {env.launcher}); use --strategy ddp, or start one process")
    if requested == "dp":
        if env.is_distributed:
            raise UserError("--strategy dp drives all GPUs of a node from one process, but this is one of "
                            f"{env.world_size} processes; use --strategy ddp (one process per GPU)")
        if gpus < 2:
            raise UserError(f"--strategy dp needs several GPUs in one process, found {gpus}; on CPU use "
                            "--strategy ddp --nproc N, or --strategy single")
    return requested


@dataclass
class ResumePoint:
    """The checkpoint a run continues from, and what in the run's checkpoint directory must make way for it."""

    state: dict[str, Any] | None  # None: start from the beginning (only unfinished saves were found)
    source: Path | None

    def tidy(self, ckpt_dir: Path) -> None:
        """Move aside (never delete, never overwrite) every checkpoint file that is further on than the resume
        point: a damaged or unfinished one, or, after an explicit --resume of an older checkpoint, the abandoned
        line's valid ones, which would otherwise count as newer than the run's own new saves. Rank 0, locked."""
        here = (self.state["epoch"], self.state["step"]) if self.state is not None else (-1, -1)
        for path in checkpoint.candidates(ckpt_dir):
            position = checkpoint.position_of(path)
            if path == self.source or position is None or position[:2] <= here:
                continue
            try:
                checkpoint.verify(path)
                suffix, why = checkpoint.ABANDONED_SUFFIX, "further on than the checkpoint resumed from"
            except checkpoint.CheckpointError as err:
                suffix = checkpoint.INCOMPLETE_SUFFIX if err.unfinished else checkpoint.CORRUPT_SUFFIX
                why = err.reason
            target = checkpoint.set_aside(path, suffix)
            print(f"hpctrain: moved {path.name} aside to {target.name} ({why})", flush=True)


def _resume_state(cfg: TrainConfig, run_dir: Path, env: DistEnv) -> ResumePoint | None:
    """Decide where the run starts. An explicit --resume (latest, or a path) insists on a checkpoint; a restarted
    attempt (Slurm requeue, torchrun restart, a Kubernetes pod with HPCTRAIN_AUTO_RESUME=1) resumes by itself, and
    starts from the beginning only if no save has ever finished. Neither starts over when every checkpoint there is
    damaged."""
    ckpt_dir = checkpoint_dir(run_dir)
    restarted = may_be_a_restart()
    if cfg.resume not in (None, "latest"):
        return _explicit_resume(Path(cfg.resume))
    if cfg.resume is None and not restarted:
        if checkpoint.candidates(ckpt_dir):
            raise UserError(f"{run_dir} already holds checkpoints of an earlier run; pass --resume to continue "
                            "it, or choose another --run-dir for a new run")
        return None
    if not run_dir.exists():
        if not restarted and not cfg.fresh_if_missing:
            raise UserError(f"--resume: the run directory {run_dir} does not exist; {_earlier_default(cfg, run_dir)}"
                            "check --run-dir (a typo?), or drop --resume to start a new run there")
        return None  # a restarted attempt whose first one never got as far as creating the run directory
    found = checkpoint.search(ckpt_dir)
    if found.info is not None:
        return ResumePoint(found.state, found.info.path)
    if any(not rejected.unfinished for rejected in found.rejected):
        why = "this restarted attempt" if restarted and cfg.resume is None else "--resume"
        raise UserError(f"{why} found no usable checkpoint in {ckpt_dir}: {_list_rejected(found.rejected)}. "
                        "Nothing was changed. Restore a good copy there, pass --resume PATH to a checkpoint "
                        "elsewhere, or start over in a new --run-dir")
    if env.rank == 0:
        print(f"hpctrain: no {'finished ' if found.rejected else ''}checkpoint in {ckpt_dir}: starting from the "
              "beginning", flush=True)
    return ResumePoint(None, None) if found.rejected else None


def with_recorded_settings(cfg: TrainConfig, unset: set[str]) -> TrainConfig:
    """For --resume and --evaluate: `cfg` with the settings its checkpoint recorded in place of those the user left
    unset (`unset`: config field names), and the run directory it was found in. Unchanged where no usable checkpoint
    is found: the run's own checks then say why."""
    if cfg.resume is None:
        return cfg
    run_dir = Path(cfg.run_dir or default_run_dir(cfg))
    quiet = checkpoint.log.disabled  # the run itself reports damaged checkpoints, once
    checkpoint.log.disabled = True
    try:
        if cfg.resume == "latest":
            state = checkpoint.search(checkpoint_dir(run_dir)).state
        else:
            state = _explicit_resume(Path(cfg.resume)).state
    except UserError:
        return cfg
    finally:
        checkpoint.log.disabled = quiet
    saved = state.get("config") if isinstance(state, dict) else None
    if not isinstance(saved, dict):
        return cfg
    changes = {name: saved[name] for name in RECORDED_DEFAULTS if name in unset and name in saved}
    if cfg.resume == "latest" and cfg.run_dir is None:
        changes["run_dir"] = str(run_dir)
    return cfg.replace(**changes)


def _earlier_default(cfg: TrainConfig, run_dir: Path) -> str:
    """A hint when an older hpctrain's default run directory for these options holds the run."""
    earlier = Path(earlier_default_run_dir(cfg))
    if run_dir == Path(default_run_dir(cfg)) and earlier != run_dir and (earlier / CHECKPOINT_DIR).is_dir():
        return f"earlier hpctrain versions used {earlier} for this run: pass --run-dir {earlier}; else "
    return ""


def _explicit_resume(path: Path) -> ResumePoint:
    """--resume PATH: a checkpoint file; or a run directory, a checkpoint directory or its `latest` pointer, which
    mean the newest valid checkpoint in it."""
    if path.is_file() and path.name == checkpoint.LATEST_POINTER:
        path = path.parent
    if not path.is_dir():
        return ResumePoint(checkpoint.load(path), path)
    ckpt_dir = path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path
    found = checkpoint.search(ckpt_dir)
    if found.info is not None:
        return ResumePoint(found.state, found.info.path)
    if not found.rejected:
        raise UserError(f"--resume {path}: there is no checkpoint in {ckpt_dir}; pass a run directory that holds "
                        "checkpoints/, a checkpoint directory, or a checkpoint_*.pt file")
    raise UserError(f"--resume {path} found no usable checkpoint in {ckpt_dir}: {_list_rejected(found.rejected)}. "
                    "Restore a good copy, or pass another checkpoint")


def _list_rejected(rejected: list[checkpoint.Rejected]) -> str:
    return "; ".join(f"{r.path.name} {r.reason}" for r in rejected)


def _check_resumable(cfg: TrainConfig, state: dict[str, Any], source: Path | None) -> None:
    if state is None:
        return
    if state.get("format") != CHECKPOINT_FORMAT:
        raise UserError(f"{source} was not written by `hpctrain train` (no training position in it); "
                        "load its weights in your own script with hpctrain.checkpoint.load")
    missing = [key for key in TRAIN_STATE_KEYS if key not in state]
    if missing:
        raise UserError(f"{source} lacks {', '.join(map(repr, missing))}: it is not a complete `hpctrain train` "
                        "checkpoint; resume from another checkpoint, or start a new --run-dir")
    saved = state["config"]
    changed = [k for k in RESUME_MUST_MATCH if saved.get(k) != getattr(cfg, k)]
    if changed:
        differences = "; ".join(f"{_flag(k)}: checkpoint {_shown(saved.get(k))}, now {_shown(getattr(cfg, k))}"
                                for k in changed)
        original = " ".join(_as_option(k, saved.get(k)) for k in changed)
        raise UserError(f"cannot resume {source} with a different {differences}. Resume with the values it was made "
                        f"with ({original}), or start a new --run-dir")
    _check_fits(cfg, state["model"], source)


def _flag(name: str) -> str:
    return "workload" if name == "workload" else "--" + name.replace("_", "-")


def _shown(value: Any) -> str:
    return "unset (the recipe's default)" if value is None else str(value)


def _as_option(name: str, value: Any) -> str:
    """How to ask for `value` again on the command line."""
    if name == "workload":
        return f"`train {value}`"
    if isinstance(value, bool):
        return _flag(name) if value else f"no {_flag(name)}"
    return f"no {_flag(name)}" if value is None else f"{_flag(name)} {value}"


def _check_fits(cfg: TrainConfig, weights: dict[str, Any], source: Path | None,
                saved: dict[str, Any] | None = None) -> None:
    """The checkpoint's weights must have this recipe's parameter names and shapes (checked on the meta device:
    nothing is allocated or initialized). `saved`: the checkpoint's config, to name the options it was made with."""
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in get_recipe(cfg.workload, cfg.recipe).for_config(cfg)
                    .build_model()
                    .state_dict().items()}
    found = {k: tuple(v.shape) for k, v in weights.items() if isinstance(v, torch.Tensor)}
    problems = [f"{k}: checkpoint {found[k]}, model {shape}" for k, shape in expected.items()
                if k in found and found[k] != shape]
    problems += [f"{k} missing" for k in expected if k not in found]
    problems += [f"{k} unexpected" for k in found if k not in expected]
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        made_with = " ".join(_as_option(k, saved.get(k)) for k in ("recipe", "arch")
                             if saved and saved.get(k) is not None and saved.get(k) != getattr(cfg, k))
        fix = f"use the options it was made with ({made_with})" if made_with else "use the --recipe it was made with"
        raise UserError(f"{source} holds a different model than {cfg.workload}/{cfg.recipe} builds ({shown}); "
                        f"{fix}, or start a new --run-dir")


def _write_run_files(run: Run, hosts: list[str]) -> None:
    run.run_dir.mkdir(parents=True, exist_ok=True)
    config = {**run.cfg.to_dict(), "resolved": {"strategy": run.strategy, "device": str(run.device),
                                                "world_size": run.env.world_size, "launcher": run.env.launcher}}
    write_atomic(run.run_dir / CONFIG_FILE, yaml.safe_dump(config, sort_keys=False).encode())
    record_attempt(run.run_dir, hosts, {"launcher": run.env.launcher,
                                                          "world_size": run.env.world_size})


def _all_hostnames(env: DistEnv) -> list[str]:
    host = socket.gethostname()
    if not env.is_distributed:
        return [host]
    hosts: list[Any] = [None] * env.world_size
    with collective("the start-up exchange of host names"):
        dist.all_gather_object(hosts, host)
    return sorted(set(hosts))


def _wrap(model: nn.Module, run: Run) -> nn.Module:
    if run.strategy == "ddp" and run.env.is_distributed:
        with collective("DDP's start-up broadcast of the model", only_known=True):
            return _ddp(model, run)
    if run.strategy == "dp":
        return nn.DataParallel(model)
    return model


def _ddp(model: nn.Module, run: Run) -> nn.Module:
    if run.device.type == "cuda":
        return nn.parallel.DistributedDataParallel(model, device_ids=[run.device.index])
    # On CPU the resume contract is bitwise. DDP regroups its gradient buckets after the first step of every
    # process, and gloo's sum order depends on the grouping, so a resumed run's first step would reduce in a
    # different order than the uninterrupted run's. find_unused_parameters keeps the initial grouping for
    # good (at the cost of one autograd-graph walk per step, small next to a CPU step).
    wrapped = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    _drop_first_forward_stderr(wrapped, UNUSED_PARAMETERS_WARNING)
    return wrapped


def _drop_first_forward_stderr(module: nn.Module, text: str) -> None:
    """Drop the lines holding `text` that the module's first forward pass writes to stderr; pass on the others.

    For DDP's find_unused_parameters warning, which it prints once per process, from C++, on the first forward:
    straight to file descriptor 2, where Python's warnings filters never see it, and so once on every rank."""
    capture: list[Any] = []

    def start(*_: Any) -> None:
        sys.stderr.flush()
        capture[:] = [os.dup(2), tempfile.TemporaryFile()]
        os.dup2(capture[1].fileno(), 2)

    def stop(*_: Any) -> None:
        hooks.close()  # once
        saved, file = capture
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        with file:
            file.seek(0)
            kept = [line for line in file.read().splitlines(keepends=True) if text.encode() not in line]
        if kept:
            os.write(2, b"".join(kept))

    hooks = contextlib.ExitStack()
    hooks.callback(module.register_forward_pre_hook(start).remove)
    hooks.callback(module.register_forward_hook(stop, always_call=True).remove)


def cudnn_benchmark(recipe: Any, device: torch.device) -> bool:
    """Whether cuDNN should time its algorithms and pick the fastest: the recipe says (`Recipe.cudnn_benchmark`),
    on CUDA devices only; off elsewhere, so a CPU run (the exact-resume tests) never depends on it."""
    return bool(recipe.cudnn_benchmark) and device.type == "cuda"


def _control_group(run: Run) -> Any:
    """The per-step stop vote's group (a gloo one, so it never waits on the GPU stream), made here at setup, a
    point every rank passes, rather than at the first vote."""
    if not run.env.is_distributed:
        return None
    with collective("creating the stop vote's gloo group"):
        return vote_group()


def _elapsed(started: float, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def _mean_over_ranks(total: torch.Tensor, count: int, device: torch.device) -> float:
    both = torch.stack([total.double(), torch.tensor(float(count), device=device, dtype=torch.float64)])
    if dist.is_available() and dist.is_initialized():
        with collective("the epoch's training-loss average"):
            dist.all_reduce(both)
    return float(both[0] / both[1]) if both[1] > 0 else float("nan")


# ---------------------------------------------------------------- evaluation


@torch.inference_mode()
def evaluate(run: Run, parts: Parts) -> dict[str, float]:
    """Test loss, top-1 and top-5 accuracy over the whole test set. Each rank scores its own share (every sample on
    exactly one rank; ranks may have different batch counts), then one all-reduce sums losses, hits and counts.
    Samples labelled below 0 (images skipped as unreadable) count nowhere."""
    # DataParallel spreads evaluation over the GPUs too; DDP's wrapper would only add hooks.
    model = parts.wrapped if run.strategy == "dp" else parts.model
    recipe = run.recipe
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=run.device)  # loss, top-1 hits, top-5 hits, samples
    batches = parts.data.eval_batches(run.env.world_size, run.env.rank, run.cfg.test_batch_size)
    for images, target in batches:
        with recipe.autocast(run.device):
            output = recipe.predict(model, images)
        output = output.float()
        sums[0] += F.cross_entropy(output, target, reduction="sum").double()
        sums[1] += (output.argmax(dim=1) == target).sum()
        top = output.topk(min(5, output.shape[1]), dim=1).indices
        sums[2] += (top == target.unsqueeze(1)).any(dim=1).sum()
        sums[3] += (target >= 0).sum()
    if run.env.is_distributed:
        with collective("evaluation's all-reduce"):
            dist.all_reduce(sums)
    n = max(float(sums[3]), 1.0)
    return {"test_loss": float(sums[0]) / n, "test_accuracy": float(sums[1]) / n, "test_top5": float(sums[2]) / n,
            "test_images": int(sums[3]), "bad_images": list(getattr(batches, "bad_images", []))}


# ---------------------------------------------------------------- checkpoints


def _save(run: Run, parts: Parts, position: Position, end_of_epoch: bool, durable: bool = False) -> None:
    """All ranks contribute their own state (RNG streams, loss sum: one gather); rank 0 writes, in the background
    unless `durable` (the run is about to stop) or --sync-checkpoints."""
    per_rank = {"rng": rng.capture(), "loss_sum": position.loss_sum, "threads": torch.get_num_threads()}
    if run.env.is_distributed:
        gathered: list[Any] = [None] * run.env.world_size
        with collective(f"the checkpoint's gather of rank states at step {position.step}"):
            dist.all_gather_object(gathered, per_rank)
    else:
        gathered = [per_rank]
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
        name = checkpoint.checkpoint_name(position.epoch, position.step, end_of_epoch)
        save = run.writer.save if run.writer is not None else checkpoint.save
        save(state, checkpoint_dir(run.run_dir), name, epoch=position.epoch, step=position.step,
             world_size=run.env.world_size, keep=run.cfg.keep_checkpoints)
        if run.writer is not None and durable:
            run.writer.wait()
    if run.env.is_distributed:
        with collective(f"the barrier after the checkpoint at step {position.step}"):
            dist.barrier()  # nobody runs ahead of the save (or exits before a durable one)


def _restore(run: Run, model: nn.Module, optimization: Optimization, state: dict[str, Any]) -> Position:
    try:
        model.load_state_dict(state["model"])
        optimization.optimizer.load_state_dict(state["optimizer"])
        optimization.scheduler.load_state_dict(state["scheduler"])
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


def _keep_best(run: Run, position: Position) -> None:
    """Copy the epoch checkpoint just written to checkpoint_best.pt (with its manifest): never pruned, never
    `latest`. Rank 0; waits for a background save of that checkpoint first."""
    if not run.is_main:
        return
    if run.writer is not None:
        run.writer.wait()
    ckpt_dir = checkpoint_dir(run.run_dir)
    source = ckpt_dir / checkpoint.checkpoint_name(position.epoch, position.step, True)
    checkpoint.copy_checkpoint(source, ckpt_dir / checkpoint.BEST_NAME)


def check_dist_backend(cfg: TrainConfig, device: torch.device) -> None:
    """--dist-backend is accepted for compatibility, when it is the backend this device gets anyway."""
    needed = "nccl" if device.type == "cuda" else "gloo"
    if cfg.dist_backend is not None and cfg.dist_backend != needed:
        raise UserError(f"--dist-backend {cfg.dist_backend} on {device.type}: hpctrain uses {needed} there; "
                        f"drop --dist-backend (or pass {needed})")


def evaluate_checkpoint(cfg: TrainConfig) -> dict[str, float]:
    """--evaluate: score the checkpoint --resume names (a file, or the newest in a run/checkpoint directory) on the
    evaluation set, on every process of the job; writes nothing."""
    recipe = get_recipe(cfg.workload, cfg.recipe).for_config(cfg)
    cfg = resolve_config(cfg, recipe)
    if cfg.resume is None:
        raise UserError("--evaluate scores a checkpoint: pass --resume PATH (a checkpoint file or a run directory)")
    env = detect(init_method=cfg.dist_init_method)
    device = resolve_device(cfg.device, env)
    check_dist_backend(cfg, device)
    strategy = resolve_strategy(cfg.strategy, env, device)
    source = Path(cfg.run_dir) if cfg.resume == "latest" else Path(cfg.resume)
    point = _explicit_resume(source)
    _check_fits(cfg, point.state["model"], point.source, point.state.get("config"))
    run = Run(cfg, recipe, env, device, strategy, Path(cfg.run_dir), None)
    with run.stop:
        init_process_group(env, device, cfg.dist_timeout)
        announce(env)
        try:
            model = recipe.build_model().to(device)
            model.load_state_dict(point.state["model"])
            data = recipe.data_source(cfg, device, env)
            with peer_failures(env, cfg.dist_timeout):
                scores = evaluate(run, Parts(data, None, model, model, None, None, None))  # type: ignore[arg-type]
        finally:
            destroy_process_group()
    top5 = f", top-5 {100 * scores['test_top5']:.2f}%" if recipe.reports_top5 else ""
    run.say(f"evaluated {point.source} on {scores['test_images']} images: loss {scores['test_loss']:.4f}, "
            f"top-1 {100 * scores['test_accuracy']:.2f}%{top5}")
    return scores
