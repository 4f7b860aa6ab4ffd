"""Setting a run up: the config completed from the recipe, the environment, device, strategy and thread count, the
run directory locked and the resume point checked. Everything that can fail on bad input happens here, before any
run file is written."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from hpctrain.config import TrainConfig, default_run_dir
from hpctrain.distributed import DistEnv, detect, resolve_device
from hpctrain.distributed.cores import available_cores, choose_threads, default_threads
from hpctrain.errors import UserError
from hpctrain.fsutil import DirectoryLock, refuse_symlinks
from hpctrain.training.loop_state import saved_part
from hpctrain.training.resume import ResumePoint, resume_point
from hpctrain.training.run import Run
from hpctrain.training.rundir import RUN_DIRECTORIES, RUN_FILES, check_run_paths, checkpoint_dir, lock_run_dir
from hpctrain.training.stopping import StopReason, write_stop_reason
from hpctrain.training.workload import Recipe
from hpctrain.channel import note

log = logging.getLogger(__name__)


def setup_run(cfg: TrainConfig, recipe: Recipe) -> Run:
    """Resolve the config, environment, device and strategy, lock the run directory and validate the resume point:
    everything that can fail on bad input happens here, before any run file is written. `recipe`: shaped for
    `cfg` (`recipe.for_config(cfg)`)."""
    cfg = resolve_config(cfg, recipe)
    env = detect(init_method=cfg.dist_init_method)
    device = resolve_device(cfg.device, env)
    check_dist_backend(cfg, device)
    strategy = resolve_strategy(cfg.strategy, env, device)
    torch.backends.cudnn.benchmark = cudnn_benchmark(recipe, device)
    run_dir = Path(cfg.run_dir)
    lock, point = _claim_run_dir(cfg, recipe, env, run_dir)
    state = point.state if point is not None else None
    threads = resolve_threads(cfg, env, state)
    torch.set_num_threads(threads)
    cfg = cfg.replace(threads=threads)
    run = Run(cfg, recipe, env, device, strategy, run_dir, state, lock=lock)
    if state is not None and state["epoch"] >= cfg.epochs:
        run.complete = True
        if run.is_main:
            write_stop_reason(run_dir, StopReason.NONE)  # true, and a batch script must not requeue it
        run.say(
            f"{run_dir} is already complete: its checkpoint ({point.source}) has {state['epoch']} epoch(s), "
            f"global step {state['step']}, and --epochs is {cfg.epochs}; nothing to train. To train further, "
            f"resume with a larger --epochs (e.g. --resume --epochs {state['epoch'] + 1})"
        )
    return run


def _claim_run_dir(
    cfg: TrainConfig,
    recipe: Recipe,
    env: DistEnv,
    run_dir: Path,
) -> tuple[DirectoryLock | None, ResumePoint | None]:
    """Rank 0's lock on the run directory, and the checked resume point (every rank; None: a fresh run).

    Rank 0 locks the run directory before it looks at the checkpoints: the ones it resumes from (and the damaged
    ones it moves aside) cannot change under it. A directory that does not exist yet holds nothing to resume and
    is created (and locked) only once the resume point has been checked, so a refused run leaves no directory."""
    locked_first = env.rank == 0 and run_dir.is_dir()
    lock = lock_run_dir(run_dir) if locked_first else None
    try:
        if locked_first:  # before the checkpoints are read (and damaged ones moved aside) through a linked folder
            refuse_symlinks(run_dir, RUN_DIRECTORIES)
        point = resume_point(cfg, recipe, env)
        if env.rank == 0:
            if not locked_first:
                lock = lock_run_dir(run_dir)
            refuse_symlinks(run_dir, RUN_FILES + RUN_DIRECTORIES)
            check_run_paths(run_dir)
            if point is not None:
                point.tidy(checkpoint_dir(run_dir))
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return lock, point


def resolve_config(cfg: TrainConfig, recipe: Recipe) -> TrainConfig:
    """`cfg` with the recipe's defaults, and the options it resolves (`Recipe.resolved_options`), where the command
    line left them unset; refuses a --dataset the recipe does not train on."""
    if cfg.dataset not in recipe.datasets:
        raise UserError(
            f"--dataset {cfg.dataset!r} is not available for {cfg.workload}; "
            f"choose one of: {', '.join(recipe.datasets)}"
        )
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
    """The strategy this process trains with: --strategy auto is DDP under a launcher, else a single process;
    refuses a strategy that cannot work here, naming one that does."""
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if requested == "auto":
        return "ddp" if env.is_distributed else "single"
    if requested == "single" and env.is_distributed:
        raise UserError(
            f"--strategy single, but this process is rank {env.rank} of {env.world_size} "
            f"(launched by {env.launcher}); use --strategy ddp, or start one process"
        )
    if requested == "dp":
        if env.is_distributed:
            raise UserError(
                "--strategy dp drives all GPUs of a node from one process, but this is one of "
                f"{env.world_size} processes; use --strategy ddp (one process per GPU)"
            )
        if gpus < 2:
            fix = (
                "on one GPU use --strategy single (DataParallel over one GPU is the same, slower)"
                if gpus == 1
                else "on CPU use --strategy ddp --nproc N, or --strategy single"
            )
            raise UserError(f"--strategy dp needs several GPUs in one process, found {gpus}; {fix}")
    return requested


def check_dist_backend(cfg: TrainConfig, device: torch.device) -> None:
    """--dist-backend is accepted for compatibility, when it is the backend this device gets anyway."""
    needed = "nccl" if device.type == "cuda" else "gloo"
    if cfg.dist_backend is not None and cfg.dist_backend != needed:
        raise UserError(
            f"--dist-backend {cfg.dist_backend} on {device.type}: hpctrain uses {needed} there; "
            f"drop --dist-backend (or pass {needed})"
        )


def cudnn_benchmark(recipe: Recipe, device: torch.device) -> bool:
    """Whether cuDNN should time its algorithms and pick the fastest: the recipe says (`Recipe.cudnn_benchmark`),
    on CUDA devices only; off elsewhere, so a CPU run (the exact-resume tests) never depends on it."""
    return bool(recipe.cudnn_benchmark) and device.type == "cuda"


def resolve_threads(cfg: TrainConfig, env: DistEnv, state: dict[str, Any] | None) -> int:
    """This process's torch thread count. torch's CPU kernels split their sums by thread, so another count gives
    other floating-point results: a resumed run keeps the count its checkpoint recorded for this rank (the first
    attempt's), even when other programs now keep cores busy (slower, never different), unless --threads asks
    for another (honoured, with a warning that the run is no longer bitwise the uninterrupted one). Rank 0 says
    what it decided, once for the whole job."""
    chosen = choose_threads(cfg.threads, env.local_world_size)
    chosen_by_us = cfg.threads_chosen or cfg.threads is None
    recorded = _recorded_threads(state, env) if state is not None else None
    say = (lambda text: note(log, text)) if env.rank == 0 else (lambda text: None)
    idle = default_threads(env.local_world_size)
    if recorded is None or recorded == chosen:
        if state is None and chosen_by_us and chosen < idle:
            say(
                f"other programs keep some of this process's cores busy: training with {chosen} thread(s) per "
                f"process rather than {idle}, which would wait on each other (--threads N to choose)"
            )
        return chosen
    if not chosen_by_us:
        say(
            f"warning: --threads {chosen}, but this run was trained with {recorded} thread(s) per process: torch "
            f"sums in another order with another count, so from here on the run is no longer bitwise the same as "
            f"an uninterrupted one (drop --threads to continue with {recorded})"
        )
        return chosen
    cores = available_cores()
    if recorded > cores:
        say(
            f"warning: this run was trained with {recorded} thread(s) per process, but only {cores} core(s) are "
            f"usable here: continuing with {cores}, so the run is no longer bitwise the same as an uninterrupted "
            f"one (resume where {recorded} cores are free to keep it exact)"
        )
        return cores
    if recorded > chosen:
        say(
            f"warning: other programs keep some of this process's cores busy, but this run was trained with "
            f"{recorded} thread(s) per process: continuing with {recorded} so the results stay exactly those of an "
            f"uninterrupted run (slower while the cores are busy; --threads {chosen} is faster but changes results)"
        )
    return recorded


def _recorded_threads(state: dict[str, Any], env: DistEnv) -> int | None:
    """The thread count this rank trained with: its own record in the checkpoint (same process count), else the
    one the run's config recorded; None for checkpoints that recorded neither."""
    mine, saved = saved_part(state, env.rank)
    if saved == env.world_size and mine is not None and mine.get("threads"):
        return int(mine["threads"])
    recorded = state.get("config", {}).get("threads")
    return int(recorded) if isinstance(recorded, int) and recorded > 0 else None
