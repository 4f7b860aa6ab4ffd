"""What `hpctrain train` does once its options are a TrainConfig: refuse bad input before anything loads, decide
whether this process trains or starts local workers (--nproc, a Kubeflow node, an srun task owning several GPUs),
and train here."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.config import TrainConfig, check_run_dir
from hpctrain.errors import UserError

if TYPE_CHECKING:
    from hpctrain.distributed import DistEnv, NodePlan


def refuse_bad_input(cfg: TrainConfig, dataset_defaulted: bool = False) -> tuple[TrainConfig, NodePlan | None]:
    """Every check that bad input can fail, before data loads or workers start; returns the config with the
    thread count chosen, and the local workers to start (None: train in this process)."""
    from hpctrain.distributed import detect, resolve_device, restart_count
    from hpctrain.distributed.cores import check_threads
    from hpctrain.recipes import get_recipe
    from hpctrain.training.resume import check_resume_point
    from hpctrain.training.rundir import check_run_dir_free, check_run_paths
    from hpctrain.training.setup import resolve_config, resolve_strategy
    from hpctrain.training.stopping import time_limit

    if cfg.nproc is not None and cfg.dist_init_method not in (None, "auto"):
        raise UserError(
            f"--nproc starts the processes itself and gives them their ranks and a free local port; "
            f"--dist-init-method {cfg.dist_init_method} is for processes started elsewhere (torchrun, "
            "srun, or by hand with RANK and WORLD_SIZE set): drop one of the two"
        )
    restart_count()  # a malformed SLURM_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT fails here, not mid-start
    time_limit(os.environ)  # HPCTRAIN_TIME_LIMIT_S / _WARNING_S: here, not when the loop arms the timer
    recipe = get_recipe(cfg.workload, cfg.recipe).for_config(cfg)
    resolved = resolve_config(cfg, recipe)
    plan = _spawn_plan(cfg)
    env = None if plan is not None else detect(init_method=cfg.dist_init_method)
    if env is not None:  # this process trains: its device and strategy must work (workers check their own)
        resolve_strategy(cfg.strategy, env, resolve_device(cfg.device, env))
    if cfg.threads is not None:
        check_threads(cfg.threads)
    if (plan.node_rank if plan is not None else env.rank) == 0:  # only rank 0 writes the run directory
        check_run_dir(resolved.run_dir)
        check_run_paths(Path(resolved.run_dir))
    _check_dataset(cfg, dataset_defaulted)
    if (
        plan is not None
    ):  # a single process locks the run dir and checks its resume point itself, before it loads the data
        check_run_dir_free(Path(resolved.run_dir))
        check_resume_point(resolved, recipe, detect())
    return cfg.replace(threads=_threads(cfg, plan, env), threads_chosen=cfg.threads is None), plan


def _threads(cfg: TrainConfig, plan: NodePlan | None, env: DistEnv | None) -> int:
    """--threads; else the free cores shared among this node's processes. Free cores are measured only where no
    sibling process is starting up beside this one (it would count as busy). A resumed run may still replace this
    count by the one its checkpoint recorded, and rank 0 says so once (training.setup.resolve_threads)."""
    from hpctrain.distributed.cores import busy_cores_elsewhere, default_threads

    if cfg.threads is not None:
        return cfg.threads
    local = plan.nproc_per_node if plan is not None else env.local_world_size
    if plan is None and local > 1:
        return default_threads(local)
    return default_threads(local, busy_cores_elsewhere())


def other_local_rank() -> bool:
    """A process a launcher started beside this node's local rank 0 (which reports the node's start-up errors)."""
    local_rank = os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")).strip()
    return local_rank not in ("", "0")


def train_here(cfg: TrainConfig) -> int:
    """Train (or evaluate) in this process; its exit status. A process whose torch never finished leaving the
    process group ends right here (process_group.exit_status), whoever started it."""
    from hpctrain.cli.terminal import install

    install("train")  # a worker --nproc started comes here first, with none of its launcher's logging set up
    from hpctrain.distributed.process_group import exit_status
    from hpctrain.recipes import get_recipe
    from hpctrain.training.evaluation import evaluate_checkpoint
    from hpctrain.training.loop import train

    recipe = get_recipe(cfg.workload, cfg.recipe).for_config(cfg)
    _warn_synthetic_on_cpu(cfg, recipe)
    if cfg.evaluate:
        evaluate_checkpoint(cfg, recipe)
        return exit_status(0)
    from hpctrain.cli.progress_bar import progress_view

    return exit_status(train(cfg, recipe, progress_view()).stop_reason.exit_code)


def _warn_synthetic_on_cpu(cfg: TrainConfig, recipe: Any) -> None:
    """--synthetic on the CPU: say, once per run, that an epoch takes hours (an estimate) before it starts."""
    if not getattr(cfg, "synthetic", False) or other_local_rank() or os.environ.get("RANK", "0") != "0":
        return
    import torch

    from hpctrain.recipes import synthetic_cpu_warning

    if cfg.device not in ("cpu", "auto") or (cfg.device == "auto" and torch.cuda.is_available()):
        return
    sizes = getattr(recipe, "sizes", None)
    warning = synthetic_cpu_warning(cfg, len(os.sched_getaffinity(0)), sizes().train if sizes else None)
    if warning:
        print(f"hpctrain: warning: {warning}", file=sys.stderr, flush=True)


def _spawn_plan(cfg: TrainConfig):
    """Whether this process must start local workers: --nproc, or a per-node platform asking for several."""
    from hpctrain.distributed import detect, kubeflow_node_plan
    from hpctrain.launch.processes import local_plan

    node = kubeflow_node_plan(os.environ)
    if node is not None:
        if cfg.nproc is not None and cfg.nproc != node.nproc_per_node:
            raise UserError(f"--nproc {cfg.nproc} contradicts PET_NPROC_PER_NODE={node.nproc_per_node}; drop one")
        return node
    node = _slurm_gpu_plan(cfg)
    if node is not None:
        return node
    env = detect(init_method=cfg.dist_init_method)
    if cfg.nproc is None:
        gpus = _visible_gpus() if cfg.device != "cpu" else 0
        if cfg.strategy in ("auto", "ddp") and not env.is_distributed and gpus > 1:
            return local_plan(gpus)  # one process per GPU: faster than DataParallel, which needs --strategy dp
        return None
    if env.is_distributed:
        raise UserError(
            f"--nproc {cfg.nproc}, but this process is already rank {env.rank} of {env.world_size} "
            f"(started by {env.launcher}); drop --nproc and let the launcher start the processes"
        )
    _check_nproc(cfg)
    if cfg.strategy in ("single", "dp") and cfg.nproc > 1:
        raise UserError(f"--nproc {cfg.nproc} starts DDP workers; use --strategy ddp or auto, not {cfg.strategy}")
    return local_plan(cfg.nproc)


def _slurm_gpu_plan(cfg: TrainConfig):
    """An srun task that owns several GPUs starts one worker per GPU (see slurm_node_plan)."""
    from hpctrain.distributed import slurm_node_plan

    if cfg.device == "cpu" or not ({"SLURM_STEP_ID", "SLURM_STEPID"} & os.environ.keys()):
        return None
    node = slurm_node_plan(os.environ, _visible_gpus())
    if node is not None and cfg.nproc is not None and cfg.nproc != node.nproc_per_node:
        raise UserError(
            f"--nproc {cfg.nproc} contradicts the {node.nproc_per_node} GPUs this srun task owns; drop --nproc"
        )
    return node


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _check_nproc(cfg: TrainConfig) -> None:
    gpus = _visible_gpus()
    if cfg.device == "cuda" and not gpus:
        raise UserError(
            f"--device cuda, but no GPU is visible here (no driver, or CUDA_VISIBLE_DEVICES hides them); "
            f"drop --device cuda to train {cfg.nproc} processes on the CPU, or run where GPUs are"
        )
    if cfg.device == "cuda" or (cfg.device == "auto" and gpus):
        if cfg.nproc > gpus:
            raise UserError(
                f"--nproc {cfg.nproc} exceeds the {gpus} visible GPU(s) (one process per GPU); "
                f"use --nproc {gpus} or fewer, or --device cpu"
            )
        return
    from hpctrain.distributed.cores import available_cores

    cores = available_cores()
    if cfg.nproc > cores:
        raise UserError(
            f"--nproc {cfg.nproc} exceeds the {cores} CPU core(s) this process may use; use --nproc {cores} or fewer"
        )


def _check_dataset(cfg: TrainConfig, dataset_defaulted: bool) -> None:
    """The dataset's files are in --data-dir; if not, name the fix (another dataset there, or the download)."""
    from hpctrain.data import DATASETS, find_dataset_files, get_dataset_spec

    if cfg.dataset not in DATASETS:
        return  # image folders: the recipe checked them (for_config)
    data_dir = Path(cfg.data_dir)
    download = f"`hpctrain download {cfg.dataset} --data-dir {shlex.quote(str(data_dir))}`"
    if not data_dir.is_dir():
        raise UserError(
            f"--data-dir {data_dir} does not exist; run {download} first, or point --data-dir at the "
            "directory that holds the data"
        )
    try:
        find_dataset_files(get_dataset_spec(cfg.dataset), data_dir)
    except UserError:
        present = [name for name in DATASETS if name != cfg.dataset and _has_dataset(name, data_dir)]
        if not present:
            raise
        default = " (the default --dataset)" if dataset_defaulted else ""
        raise UserError(
            f"dataset {cfg.dataset}{default} is not in {data_dir}, but {present[0]} is: pass --dataset "
            f"{present[0]}, or run {download}"
        ) from None


def _has_dataset(name: str, data_dir: Path) -> bool:
    from hpctrain.data import find_dataset_files, get_dataset_spec

    try:
        find_dataset_files(get_dataset_spec(name), data_dir / name)  # its own folder: mnist and fashion-mnist
        return True  # share file names, so a bare data dir cannot tell them apart
    except UserError:
        return False
