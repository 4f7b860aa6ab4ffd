"""The options of `hpctrain train WORKLOAD` (its flags, with their help text) and how they become a validated
TrainConfig: the recipes' own flags, below the faces, so that `hpctrain train` parses them, and `hpctrain submit` and
the web console's job form (hpctrain.engine.submission) validate a job's training options exactly as the job will
parse them. The argparse namespace stops here: it becomes a TrainConfig at once. unrecognized and late_positionals
are the argparse helpers every command's parser shares (hpctrain.cli.main).
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path

from hpctrain.config import DEFAULT_RECIPE, DEVICES, STRATEGIES, TrainConfig
from hpctrain.errors import UserError
from hpctrain.recipes.catalog import CATALOG
from hpctrain.recipes.workload_help import WorkloadAction, workload_help

RESUME_LATEST = "latest"
# A run's checkpoint folder and its pointer to the newest checkpoint (training.rundir.CHECKPOINT_DIR and
# checkpoint.LATEST_POINTER, which import torch): what a --resume PATH names.
_CHECKPOINT_DIR, _LATEST_POINTER = "checkpoints", "latest"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    shown = workload_help(list(CATALOG))  # until a WORKLOAD is parsed (WorkloadAction)
    parser.add_argument("workload", choices=list(CATALOG), action=WorkloadAction, help="built-in workload")
    parser.add_argument("data", nargs="?", metavar="DATA", help=shown["data"])
    data = parser.add_argument_group("data")
    data.add_argument("--dataset", help=shown["dataset"])
    data.add_argument("--data-dir", help=shown["data_dir"])
    data.add_argument("--train-limit", type=int, metavar="N", help="use only the first N training images")
    data.add_argument("--test-limit", type=int, metavar="N", help="evaluate on only the first N test images")
    recipe = parser.add_argument_group("recipe (unset values take the recipe's defaults)")
    recipe.add_argument("--recipe", help=shown["recipe"])
    recipe.add_argument("--epochs", type=int, metavar="N", help=shown["epochs"])
    recipe.add_argument("-b", "--batch-size", type=int, metavar="N", help=shown["batch_size"])
    recipe.add_argument("--test-batch-size", type=int, metavar="N", help=shown["test_batch_size"])
    recipe.add_argument("--lr", type=float, metavar="F", help=shown["lr"])
    recipe.add_argument(
        "--seed",
        type=int,
        help="fixes initial weights, data order and augmentation: "
        "the same seed gives the same run (0 to 2**64-1, default 0; see the README for what else "
        "must match)",
    )
    where = parser.add_argument_group("where and how")
    where.add_argument(
        "--run-dir",
        help="config, metrics, TensorBoard files, checkpoints "
        "(default: runs/WORKLOAD-DATA[-RECIPE][-SLURM_JOB_ID]: DATA is the dataset or the image "
        "folder's name, -RECIPE only when not fast)",
    )
    where.add_argument(
        "--device",
        choices=DEVICES,
        default="auto",
        help="cuda: this process's GPU (one per process); cpu; auto (default): a GPU when one is visible, else the CPU",
    )
    where.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="auto",
        help="single process, DataParallel (dp) or DistributedDataParallel (ddp); auto: ddp when "
        "there are several processes, else single",
    )
    where.add_argument(
        "--nproc",
        type=int,
        metavar="N",
        help="start N local worker processes (DDP): one per GPU, or N CPU processes with gloo",
    )
    where.add_argument(
        "--dist-init-method",
        metavar="env|slurm|tcp://HOST:PORT|file://PATH",
        help="for processes started by torchrun, srun or by hand: override how they find each other "
        "(default: detected); --nproc chooses its own",
    )
    where.add_argument(
        "--dist-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds a collective waits for a missing rank before failing (default: 600)",
    )
    where.add_argument(
        "--preflight",
        action=argparse.BooleanOptionalAction,
        help="before the first step, time a few seconds of matrix products on every rank and one "
        "all-reduce; a node far below the others (under half the median rank's rate) or failing "
        "ends the attempt, named, and a Slurm job requeues itself without it (RUN/preflight.json; "
        "default: on for GPU jobs on several nodes)",
    )
    where.add_argument(
        "--preflight-only",
        action="store_true",
        help="run the preflight and stop, training nothing (what `hpctrain check --preflight` submits)",
    )
    where.add_argument(
        "--hang-timeout",
        type=float,
        metavar="S",
        help="end the attempt as hung when no step completes for S seconds: every rank writes its "
        "stacks to RUN/hang/ and a report names the rank that never arrived; a submitted job then "
        "restarts from its checkpoint (default: 20 times the slowest step so far, at least 120; "
        "evaluation and checkpoints get --dist-timeout; 0: off)",
    )
    where.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="torch threads per process, at most the cores it "
        "may use (default: those cores not kept busy by other programs at the start, divided among "
        "the local processes)",
    )
    ckpt = parser.add_argument_group("checkpoints")
    ckpt.add_argument("--resume", nargs="?", const=RESUME_LATEST, metavar="PATH", help=shown["resume"])
    ckpt.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        metavar="STEPS",
        help="also checkpoint every STEPS optimizer steps (default: only at epoch ends)",
    )
    ckpt.add_argument("--keep-checkpoints", type=int, default=3, metavar="K", help="keep the newest K (default 3)")
    ckpt.add_argument(
        "--sync-checkpoints",
        action="store_true",
        help="write checkpoints in the training thread (default: in the background, after copying "
        "the state to CPU, so training pauses only for the copy)",
    )
    parser.add_argument(
        "--log-interval",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds between progress lines in batch logs (default: 10)",
    )
    add_image_arguments(parser)


def add_image_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of image workloads (imagenet), including the pytorch/examples imagenet script's names."""
    image = parser.add_argument_group("imagenet")
    image.add_argument("--val-path", metavar="DIR", help="validation images, if not DATA/val")
    image.add_argument(
        "--val-labels",
        metavar="FILE",
        help="labels of a flat validation folder: LOC_val_solution.csv or `file label` lines",
    )
    image.add_argument("-a", "--arch", metavar="NAME", help="torchvision classification model (default resnet50)")
    image.add_argument(
        "-j",
        "--workers",
        type=int,
        metavar="N",
        help="data worker processes per training process (default: the cores per process, at most 8)",
    )
    image.add_argument("-p", "--print-freq", type=int, metavar="N", help="a progress line every N steps")
    image.add_argument("--momentum", type=float, metavar="M", help="SGD momentum (default 0.9)")
    image.add_argument(
        "--wd",
        "--weight-decay",
        dest="weight_decay",
        type=float,
        metavar="W",
        help="weight decay (default 1e-4; the fast recipe exempts norms and biases)",
    )
    image.add_argument(
        "--dist-backend",
        choices=("nccl", "gloo"),
        help="accepted for compatibility: hpctrain uses nccl on GPUs and gloo on the CPU, and refuses the other",
    )
    image.add_argument(
        "--checkpoints-path",
        metavar="DIR",
        help="the run directory (checkpoints in DIR/checkpoints, "
        "or in DIR itself when it is named checkpoints); with --resume, a DIR that does not exist yet "
        "starts a new run",
    )
    image.add_argument(
        "--synthetic",
        action="store_true",
        help="random images of the right shape (no files), as many "
        "as ImageNet has: 1,281,167 per epoch and 50,000 for evaluation; --train-limit N and "
        "--test-limit N cap them",
    )
    image.add_argument("--evaluate", action="store_true", help="only evaluate a checkpoint (--resume PATH) and exit")
    image.add_argument(
        "--skip-bad-images",
        action="store_true",
        help="count and report unreadable images instead of stopping at the first",
    )
    image.add_argument(
        "--data-backend",
        choices=("auto", "cpu", "dali", "nvjpeg"),
        default="auto",
        help="image decoding: cpu (worker processes), nvjpeg (on the GPU, torchvision), dali (NVIDIA "
        "DALI: pip install nvidia-dali-cuda120, or -cuda130 for a CUDA 13 torch); auto picks dali, "
        "else nvjpeg on a CUDA GPU, else cpu",
    )
    image.add_argument("--image-size", type=int, metavar="PX", help="training crop side (default: the recipe's)")
    image.add_argument("--val-size", type=int, metavar="PX", help="evaluation crop side (default 224)")


def _data_after_resume(args: argparse.Namespace) -> argparse.Namespace:
    """`train imagenet --resume DATA`: argparse gives the word after --resume to it (its PATH is optional). Where
    the workload reads DATA and nothing else names it (no DATA, --data-dir or --synthetic), a --resume value that
    names no checkpoint is DATA, and --resume means the newest checkpoint in the run dir."""
    word = args.resume
    if (
        word in (None, RESUME_LATEST)
        or args.data is not None
        or args.data_dir is not None
        or args.synthetic
        or not CATALOG[args.workload].image_folder
        or _names_checkpoints(Path(word))
    ):
        return args
    return argparse.Namespace(**{**vars(args), "data": word, "resume": RESUME_LATEST})


def _names_checkpoints(path: Path) -> bool:
    """Whether `path` is something --resume PATH reads: a file (a checkpoint, a `latest` pointer), a *.pt name, or
    a folder of checkpoints (a run directory holding checkpoints/, or checkpoints/ itself)."""
    if path.suffix == ".pt" or path.name in (_LATEST_POINTER, _CHECKPOINT_DIR) or path.is_file():
        return True
    return path.is_dir() and (
        (path / _CHECKPOINT_DIR).is_dir() or (path / _LATEST_POINTER).is_file() or any(path.glob("checkpoint_*.pt"))
    )


def _image_values(args: argparse.Namespace) -> dict:
    """The image options as TrainConfig fields; DATA and --checkpoints-path mapped onto data_dir and run_dir."""
    values = {
        name: getattr(args, name)
        for name in (
            "val_path",
            "val_labels",
            "arch",
            "workers",
            "momentum",
            "weight_decay",
            "synthetic",
            "evaluate",
            "skip_bad_images",
            "data_backend",
            "image_size",
            "val_size",
            "dist_backend",
            "print_freq",
        )
    }
    if args.data is not None:
        if args.workload != "imagenet":
            raise UserError(f"DATA {args.data!r}: {args.workload} takes no data path; use --data-dir DIR")
        if args.data_dir is not None:
            raise UserError("DATA and --data-dir both name the image folder; drop --data-dir")
        values["data_dir"] = args.data
    elif args.workload == "imagenet" and args.data_dir is None and not args.synthetic:
        raise UserError("hpctrain train imagenet needs DATA, the image folder (DATA/train/<class>/*), or --synthetic")
    if args.workload == "imagenet" and args.dataset is None:
        values["dataset"] = "imagenet"
    if args.checkpoints_path is not None:
        if args.run_dir is not None:
            raise UserError("--checkpoints-path and --run-dir name the same directory; drop one")
        values["run_dir"] = args.checkpoints_path
        values["fresh_if_missing"] = args.resume is not None
    return values


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    args = _data_after_resume(args)
    values = {
        "workload": args.workload,
        "recipe": args.recipe or DEFAULT_RECIPE,
        "run_dir": args.run_dir,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "test_batch_size": args.test_batch_size,
        "lr": args.lr,
        "seed": args.seed if args.seed is not None else 0,
        "train_limit": args.train_limit,
        "test_limit": args.test_limit,
        "device": args.device,
        "strategy": args.strategy,
        "nproc": args.nproc,
        "resume": args.resume,
        "dist_init_method": args.dist_init_method,
        "dist_timeout": args.dist_timeout,
        "hang_timeout": args.hang_timeout,
        "preflight": args.preflight,
        "preflight_only": args.preflight_only,
        "threads": args.threads,
        "checkpoint_every": args.checkpoint_every,
        "keep_checkpoints": args.keep_checkpoints,
        "async_checkpoints": not args.sync_checkpoints,
        "log_interval": args.log_interval,
    }
    for name in ("dataset", "data_dir"):  # unset: TrainConfig's default
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    values.update(_image_values(args))
    return TrainConfig(**values)


def config_from_argv(argv: list[str]) -> TrainConfig:
    """Parse train options (argv after `train`, e.g. ["mnist", "--epochs", "2"]) into a validated TrainConfig.

    For `hpctrain submit`, which validates a job's training options before queueing it."""
    parser = _RaisingParser(prog="hpctrain train", exit_on_error=False)
    add_arguments(parser)
    try:
        args, extras = parser.parse_known_args(argv)
        extras = late_positionals(parser, args, extras)
        if extras:
            parser.error(unrecognized(parser, extras))
    except argparse.ArgumentError as err:
        raise UserError(f"bad training options: {err}; see `hpctrain train --help`") from None
    return config_from_args(args)


class _RaisingParser(argparse.ArgumentParser):
    """Errors become UserError (one line, no usage text, no exit status in the message)."""

    def error(self, message: str):
        raise UserError(f"bad training options: {message}; see `hpctrain train --help`")


def unrecognized(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """argparse's "unrecognized arguments" message, with the closest option for each unknown one."""
    known = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
    unknown = [extra.split("=", 1)[0] for extra in extras if extra.startswith("-")]
    hints = [(name, difflib.get_close_matches(name, known, n=1, cutoff=0.6)) for name in unknown]
    said = [
        f"did you mean {close[0]}?" if len(unknown) == 1 else f"{name}: did you mean {close[0]}?"
        for name, close in hints
        if close
    ]
    return f"unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(said)})" if said else "")


def late_positionals(parser: argparse.ArgumentParser, args: argparse.Namespace, extras: list[str]) -> list[str]:
    """argparse fills positionals only from the first run of them, so in `train imagenet --epochs 2 DATA` the
    DATA comes back among the unknown words. Give such words to the optional positionals still unset; return the
    rest (then really unknown)."""
    slots = [a for a in parser._actions if not a.option_strings and a.nargs == "?" and getattr(args, a.dest) is None]
    rest: list[str] = []
    for word in extras:
        after_unknown_option = bool(rest) and rest[-1].startswith("-") and "=" not in rest[-1]
        if slots and not word.startswith("-") and not after_unknown_option:  # `--epochz 2`: 2 is --epochz's
            setattr(args, slots.pop(0).dest, word)
        else:
            rest.append(word)
    return rest
