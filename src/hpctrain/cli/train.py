"""`hpctrain train WORKLOAD`: train a built-in recipe here, in this process or in --nproc local worker processes.

The same command runs unchanged under torchrun, srun or a Kubeflow PyTorchJob: the process finds its rank in the
environment. The argparse namespace stops here: it becomes a TrainConfig at once.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from hpctrain.config import DEVICES, STRATEGIES, TrainConfig
from hpctrain.errors import UserError
from hpctrain.recipes import WORKLOADS

RESUME_LATEST = "latest"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workload", choices=list(WORKLOADS), help="built-in workload")
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", default="mnist", help="mnist or fashion-mnist (default: mnist)")
    data.add_argument("--data-dir", help="directory holding DATASET/ as `hpctrain download` leaves it "
                      "(default: $HPCTRAIN_DATA_DIR, else ./data)")
    data.add_argument("--train-limit", type=int, metavar="N", help="use only the first N training images")
    data.add_argument("--test-limit", type=int, metavar="N", help="evaluate on only the first N test images")
    recipe = parser.add_argument_group("recipe (unset values take the recipe's defaults)")
    recipe.add_argument("--recipe", default="fast", help="fast (ours, the default) or classic (the pytorch/examples "
                        "MNIST tutorial: its CNN, Adadelta lr 1.0, StepLR 0.7, batch 64)")
    recipe.add_argument("--epochs", type=int, metavar="N")
    recipe.add_argument("--batch-size", type=int, metavar="N", help="global batch, split over all processes")
    recipe.add_argument("--test-batch-size", type=int, metavar="N")
    recipe.add_argument("--lr", type=float, metavar="F")
    recipe.add_argument("--seed", type=int, default=0)
    where = parser.add_argument_group("where and how")
    where.add_argument("--run-dir", help="config, metrics, TensorBoard files, checkpoints "
                       "(default: runs/WORKLOAD-DATASET[-SLURM_JOB_ID])")
    where.add_argument("--device", choices=DEVICES, default="auto")
    where.add_argument("--strategy", choices=STRATEGIES, default="auto",
                       help="single process, DataParallel (dp) or DistributedDataParallel (ddp); auto: ddp when "
                       "there are several processes, else single")
    where.add_argument("--nproc", type=int, metavar="N", help="start N local worker processes (DDP): one per GPU, "
                       "or N CPU processes with gloo")
    where.add_argument("--dist-init-method", metavar="env|slurm|tcp://HOST:PORT|file://PATH",
                       help="override how processes find each other (default: detected)")
    where.add_argument("--dist-timeout", type=float, default=600.0, metavar="S",
                       help="seconds a collective waits for a missing rank before failing (default: 600)")
    where.add_argument("--threads", type=int, metavar="N", help="torch threads per process (default: the cores "
                       "this process may use, divided among the local processes)")
    ckpt = parser.add_argument_group("checkpoints")
    ckpt.add_argument("--resume", nargs="?", const=RESUME_LATEST, metavar="PATH",
                      help="continue from the newest valid checkpoint in the run dir, or from PATH")
    ckpt.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS",
                      help="also checkpoint every STEPS optimizer steps (default: only at epoch ends)")
    ckpt.add_argument("--keep-checkpoints", type=int, default=3, metavar="K", help="keep the newest K (default 3)")
    ckpt.add_argument("--sync-checkpoints", action="store_true",
                      help="write checkpoints in the training thread (default: in the background, after copying "
                      "the state to CPU, so training pauses only for the copy)")
    parser.add_argument("--log-interval", type=float, default=10.0, metavar="S",
                        help="seconds between progress lines in batch logs (default: 10)")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    values = {
        "workload": args.workload,
        "recipe": args.recipe,
        "dataset": args.dataset,
        "run_dir": args.run_dir,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "test_batch_size": args.test_batch_size,
        "lr": args.lr,
        "seed": args.seed,
        "train_limit": args.train_limit,
        "test_limit": args.test_limit,
        "device": args.device,
        "strategy": args.strategy,
        "nproc": args.nproc,
        "resume": args.resume,
        "dist_init_method": args.dist_init_method,
        "dist_timeout": args.dist_timeout,
        "threads": args.threads,
        "checkpoint_every": args.checkpoint_every,
        "keep_checkpoints": args.keep_checkpoints,
        "async_checkpoints": not args.sync_checkpoints,
        "log_interval": args.log_interval,
    }
    if args.data_dir is not None:
        values["data_dir"] = args.data_dir
    return TrainConfig(**values)


def config_from_argv(argv: list[str]) -> TrainConfig:
    """Parse train options (argv after `train`, e.g. ["mnist", "--epochs", "2"]) into a validated TrainConfig.

    For `hpctrain submit`, which validates a job's training options before queueing it."""
    parser = _RaisingParser(prog="hpctrain train", exit_on_error=False)
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except argparse.ArgumentError as err:
        raise UserError(f"bad training options {' '.join(argv)!r}: {err}; see `hpctrain train --help`") from None
    return config_from_args(args)


class _RaisingParser(argparse.ArgumentParser):
    """Reports every parse error as an exception (argparse itself prints usage and exits with status 2 for some)."""

    def error(self, message: str):
        raise argparse.ArgumentError(None, message)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    plan = _spawn_plan(cfg)
    if plan is None:
        return _train_here(cfg)
    from hpctrain.launch.local import spawn

    _prevalidate(cfg)
    return spawn(plan, _train_here, (cfg.replace(nproc=None),))


def _train_here(cfg: TrainConfig) -> int:
    from hpctrain.training.loop import train

    return train(cfg).stop_reason.exit_code


def _spawn_plan(cfg: TrainConfig):
    """Whether this process must start local workers: --nproc, or a per-node platform asking for several."""
    from hpctrain.distributed import detect, kubeflow_node_plan
    from hpctrain.launch.local import local_plan

    node = kubeflow_node_plan(os.environ)
    if node is not None:
        if cfg.nproc is not None and cfg.nproc != node.nproc_per_node:
            raise UserError(f"--nproc {cfg.nproc} contradicts PET_NPROC_PER_NODE={node.nproc_per_node}; drop one")
        return node
    env = detect(init_method=cfg.dist_init_method)
    if cfg.nproc is None:
        gpus = _visible_gpus() if cfg.device != "cpu" else 0
        if cfg.strategy in ("auto", "ddp") and not env.is_distributed and gpus > 1:
            return local_plan(gpus)  # one process per GPU: faster than DataParallel, which needs --strategy dp
        return None
    if env.is_distributed:
        raise UserError(f"--nproc {cfg.nproc}, but this process is already rank {env.rank} of {env.world_size} "
                        f"(started by {env.launcher}); drop --nproc and let the launcher start the processes")
    _check_nproc(cfg)
    if cfg.strategy in ("single", "dp") and cfg.nproc > 1:
        raise UserError(f"--nproc {cfg.nproc} starts DDP workers; use --strategy ddp or auto, not {cfg.strategy}")
    return local_plan(cfg.nproc)


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _check_nproc(cfg: TrainConfig) -> None:
    gpus = _visible_gpus()
    if cfg.device == "cuda" or (cfg.device == "auto" and gpus):
        if cfg.nproc > gpus:
            raise UserError(f"--nproc {cfg.nproc} exceeds the {gpus} visible GPU(s) (one process per GPU); "
                            f"use --nproc {gpus} or fewer, or --device cpu")
        return
    from hpctrain.launch.local import available_cores

    cores = available_cores()
    if cfg.nproc > cores:
        raise UserError(f"--nproc {cfg.nproc} exceeds the {cores} CPU core(s) this process may use; "
                        f"use --nproc {cores} or fewer")


def _prevalidate(cfg: TrainConfig) -> None:
    """Catch bad input once, here, rather than once per worker."""
    from hpctrain.data import find_dataset_files, get_dataset_spec

    data_dir = Path(cfg.data_dir)
    if not data_dir.is_dir():
        raise UserError(f"--data-dir {data_dir} does not exist; run `hpctrain download {cfg.dataset} --data-dir "
                        f"{data_dir}` first, or point --data-dir at the directory that holds the data")
    find_dataset_files(get_dataset_spec(cfg.dataset), data_dir)
    from hpctrain.distributed import detect
    from hpctrain.training.loop import check_resume_point, check_run_dir_free, resolve_config
    from hpctrain.recipes import get_recipe

    resolved = resolve_config(cfg, get_recipe(cfg.workload, cfg.recipe))
    check_run_dir_free(Path(resolved.run_dir))  # before starting workers: rank 0 takes the lock itself
    check_resume_point(resolved, detect())
