"""Typed configuration, validated once at the edge (the CLI or a user's script), then passed around read-only."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError

DEVICES = ("auto", "cpu", "cuda")
STRATEGIES = ("auto", "single", "dp", "ddp")
DEFAULT_RECIPE = "fast"

# Bounds that refuse typos and overflow while leaving room for every real run.
MAX_SEED = 2**64 - 1  # torch.manual_seed's range; negative seeds would alias seed + 2**64
MAX_LR = 1e3  # real schedules stay below ~30 (LARS at 32k batches); Adadelta's 1.0 is the largest built-in default
MAX_DIST_TIMEOUT_S = 7 * 24 * 3600.0  # a week
MAX_LOG_INTERVAL_S = 24 * 3600.0


@dataclass(frozen=True)
class TrainConfig:
    """One training run. Fields left None take the recipe's default (see `resolved`)."""

    workload: str = "mnist"
    """Built-in workload: data + model family (mnist; later imagenet)."""
    recipe: str = DEFAULT_RECIPE
    """Variant of the workload: `fast` (ours) or `classic` (the pytorch/examples tutorial)."""
    dataset: str = "mnist"
    data_dir: str = field(default_factory=lambda: os.environ.get("HPCTRAIN_DATA_DIR", "data"))
    run_dir: str | None = None
    """Where config, metrics, TensorBoard files and checkpoints go; default
    runs/<workload>-<data>[-<recipe>][-<job id>] (see run_name)."""
    epochs: int | None = None
    batch_size: int | None = None
    """Global batch: split evenly across processes, so results do not depend on the process count."""
    lr: float | None = None
    test_batch_size: int | None = None
    seed: int = 0
    train_limit: int | None = None
    """Use only the first N training images (quick runs, tests)."""
    test_limit: int | None = None
    """Evaluate on only the first N test images (quick runs, tests)."""
    device: str = "auto"
    strategy: str = "auto"
    nproc: int | None = None
    """Start N local worker processes (one per GPU, or N CPU processes with gloo)."""
    resume: str | None = None
    """None: fresh run; "latest": newest valid checkpoint in the run directory; else a checkpoint path."""
    dist_init_method: str | None = None
    checkpoint_every: int = 0
    """Also checkpoint every N optimizer steps (0: only at epoch ends)."""
    keep_checkpoints: int = 3
    async_checkpoints: bool = True
    """Write checkpoints in a background thread (training pauses only to copy the state to CPU)."""
    log_interval: float = 10.0
    """Seconds between plain progress lines when stderr is not a terminal (batch logs)."""
    threads: int | None = None
    """torch intra-op threads per process; default: the cores this process may use, divided among local workers."""
    threads_chosen: bool = False
    """`threads` was chosen by hpctrain (no --threads): a resumed run takes the count its checkpoint recorded, since
    another count changes torch's floating-point results (see training.setup.resolve_threads)."""
    dist_timeout: float = 600.0
    """Seconds a collective may wait for a missing rank before the run fails."""
    preflight: bool | None = None
    """Check every rank's device and the job's all-reduce before the first step (hpctrain.training.preflight_measure);
    None: for a GPU job on several nodes."""
    preflight_only: bool = False
    """Run the preflight and stop without training (what `hpctrain check --preflight` submits)."""
    hang_timeout: float | None = None
    """Seconds without a completed step that end the attempt as hung (stacks and a report in RUN/hang/); None:
    automatic (hpctrain.health.watchdog), 0: off."""
    # ---- image workloads (imagenet); see hpctrain.recipes.imagenet
    val_path: str | None = None
    """Validation images when not DATA/val (class folders, or flat with val_labels)."""
    val_labels: str | None = None
    """Label file of a flat validation folder (ILSVRC LOC_val_solution.csv or `file label` lines)."""
    arch: str | None = None
    """torchvision classification model name (default resnet50)."""
    workers: int | None = None
    """Data worker processes per training process (default: the cores shared among local processes, at most 8)."""
    momentum: float | None = None
    weight_decay: float | None = None
    synthetic: bool = False
    """Random images of the right shape instead of files (throughput tests)."""
    evaluate: bool = False
    """Only evaluate the checkpoint given by --resume, then exit."""
    skip_bad_images: bool = False
    data_backend: str = "auto"
    image_size: int | None = None
    """Training crop side (fixed; default: the recipe's, with progressive resizing for fast)."""
    val_size: int | None = None
    """Evaluation crop side (default 224, from a resize to val_size x 256/224)."""
    dist_backend: str | None = None
    """nccl or gloo: accepted when it is the one the device needs (nccl for GPUs, gloo for the CPU)."""
    print_freq: int | None = None
    """A progress line every N steps (instead of every log_interval seconds)."""
    fresh_if_missing: bool = False
    """--resume into a run directory that does not exist yet starts a new run there (--checkpoints-path)."""

    def __post_init__(self) -> None:
        _check_choice("--device", self.device, DEVICES)
        _check_choice("--strategy", self.strategy, STRATEGIES)
        for name in ("epochs", "batch_size", "test_batch_size", "train_limit", "test_limit", "nproc", "threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1 (got {value})")
        if not 0 <= self.seed <= MAX_SEED:
            raise UserError(f"--seed must be a whole number from 0 to 2**64-1 = {MAX_SEED} (got {_short(self.seed)})")
        if self.lr is not None:
            _check_float("--lr", self.lr, above=0, at_most=MAX_LR, why="a larger learning rate only diverges")
        if self.checkpoint_every < 0:
            raise UserError(f"--checkpoint-every must be 0 (off) or a number of steps (got {self.checkpoint_every})")
        if self.keep_checkpoints < 1:
            raise UserError(f"--keep-checkpoints must be at least 1 (got {self.keep_checkpoints})")
        _check_float(
            "--dist-timeout",
            self.dist_timeout,
            above=0,
            at_most=MAX_DIST_TIMEOUT_S,
            why="a collective waiting longer for a rank is a hang; the unit is seconds",
        )
        if self.preflight_only and self.preflight is False:
            raise UserError("--preflight-only runs the preflight: drop --no-preflight")
        if self.hang_timeout is not None:
            _check_float(
                "--hang-timeout",
                self.hang_timeout,
                at_least=0,
                at_most=MAX_DIST_TIMEOUT_S,
                why="seconds without a completed step; 0 turns the watchdog off",
            )
        _check_float(
            "--log-interval",
            self.log_interval,
            at_least=0,
            at_most=MAX_LOG_INTERVAL_S,
            why="the unit is seconds; 0 prints every step",
        )

        _check_image_options(self)

    def replace(self, **changes: Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def default_run_dir(cfg: TrainConfig, environ: dict[str, str] | None = None) -> str:
    """Deterministic, so every rank of a job (and every requeued attempt) agrees on it without talking. Inside a job
    that hpctrain submitted, the job's run directory (HPCTRAIN_RUN_DIR: where `hpctrain status` looks)."""
    environ = os.environ if environ is None else environ
    if environ.get("HPCTRAIN_RUN_DIR"):
        return environ["HPCTRAIN_RUN_DIR"]
    name = run_name(cfg)
    job_id = environ.get("SLURM_ARRAY_JOB_ID") or environ.get("SLURM_JOB_ID")
    if job_id:
        task = environ.get("SLURM_ARRAY_TASK_ID")
        name += f"-{job_id}" + (f"_{task}" if task and environ.get("SLURM_ARRAY_JOB_ID") else "")
    return str(Path("runs") / name)


def data_label(cfg: TrainConfig) -> str:
    """What the run trains on, for its default run directory and start-up line: the dataset's name, or an image
    folder's own name (`runs/imagenet-tiny-imagenet`, not `imagenet` for every folder), or `synthetic`."""
    if cfg.dataset != "imagenet":
        return cfg.dataset
    if cfg.synthetic:
        return "synthetic"
    return Path(os.path.abspath(cfg.data_dir)).name or "imagenet"


def run_name(cfg: TrainConfig) -> str:
    """WORKLOAD-DATA, and -RECIPE for a recipe other than the default: two recipes never share a default run
    directory (a second recipe's run there would be refused, and its --resume would refuse the first's
    checkpoints)."""
    name = f"{cfg.workload}-{data_label(cfg)}"
    return name if cfg.recipe == DEFAULT_RECIPE else f"{name}-{cfg.recipe}"


def earlier_default_run_dir(cfg: TrainConfig) -> str:
    """The default run directory hpctrain used before run_name (WORKLOAD-DATASET for every recipe and folder), to
    point a --resume of an older run at it."""
    return str(Path("runs") / f"{cfg.workload}-{cfg.dataset}")


# The longest name a run directory holds (checkpoints/checkpoint_step_N.pt.manifest.json and its temporary files).
_RUN_FILE_NAME_ROOM = 96


def check_run_dir(run_dir: str | os.PathLike[str]) -> None:
    """Refuse a run directory that cannot be created or written, before any data loads or workers start.

    Looks only: nothing is created, so a refused command leaves nothing behind."""
    path = Path(os.path.abspath(run_dir))
    flag = f"--run-dir {_shorter(str(run_dir))}"
    if path == path.parent:
        raise UserError(f"{flag} is the file system root; pass a directory of the run's own, e.g. runs/NAME")
    existing = next(p for p in (path, *path.parents) if os.path.lexists(p))
    name_max = _pathconf(existing, "PC_NAME_MAX", 255)
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            raise UserError(
                f"{flag}: the name {part[:24]}... has {len(os.fsencode(part))} bytes, more than the "
                f"{name_max} this file system allows in one name; choose a shorter --run-dir"
            )
    path_max = _pathconf(existing, "PC_PATH_MAX", 4096)
    if len(os.fsencode(str(path))) + _RUN_FILE_NAME_ROOM > path_max:
        raise UserError(
            f"{flag} is too long for this file system ({path_max} bytes per path, the run's files "
            "included); choose a shorter --run-dir"
        )
    if not existing.is_dir():
        kind = "a file" if existing.is_file() else "not a directory"
        what = f"is {kind}" if existing == path else f"lies under {_shorter(str(existing))}, which is {kind}"
        raise UserError(f"{flag} {what}; pass a directory (new or existing) as --run-dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        why = "is on a read-only file system" if _read_only(existing) else "is not writable by this user"
        where = "" if existing == path else f"cannot be created: {_shorter(str(existing))} "
        raise UserError(f"{flag} {where}{why}; choose a --run-dir where you can write")


def _shorter(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else f"{text[: limit // 2]}...{text[-limit // 2 :]}"


def _pathconf(path: Path, name: str, fallback: int) -> int:
    try:
        return os.pathconf(path, name)
    except (OSError, ValueError, AttributeError):
        return fallback


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def _check_float(
    flag: str, value: float, *, above: float | None = None, at_least: float | None = None, at_most: float, why: str
) -> None:
    """A finite number in range; the error names the range and why the upper bound is there."""
    low_ok = (above is None or value > above) and (at_least is None or value >= at_least)
    if math.isfinite(value) and low_ok and value <= at_most:
        return
    low = f"above {above:g}" if above is not None else f"at least {at_least:g}"
    raise UserError(f"{flag} must be a finite number {low} and at most {at_most:g} ({why}); got {value!r}")


def _short(value: int) -> str:
    """A user's number for a message, never unbounded (a 5,000-digit seed stays one short line)."""
    if abs(value) < 10**30:
        return str(value)
    digits = int(abs(value).bit_length() * math.log10(2)) + 1
    return f"a {'negative ' if value < 0 else ''}number of about {digits} digits"


def _check_choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UserError(f"{flag} must be one of {', '.join(choices)} (got {value!r})")


def _check_image_options(cfg: TrainConfig) -> None:
    if cfg.workers is not None and cfg.workers < 0:
        raise UserError(f"--workers must be 0 (decode in the training process) or more (got {cfg.workers})")
    for flag, value in (("--momentum", cfg.momentum), ("--weight-decay", cfg.weight_decay)):
        if value is not None:
            _check_float(flag, value, at_least=0, at_most=1, why="SGD's momentum and decay are fractions")
    for flag, value in (("--image-size", cfg.image_size), ("--val-size", cfg.val_size)):
        if value is not None and not 16 <= value <= 4096:
            raise UserError(f"{flag} must be a side in pixels from 16 to 4096 (got {value})")
    if cfg.print_freq is not None and cfg.print_freq < 1:
        raise UserError(f"--print-freq must be at least 1 step (got {cfg.print_freq})")
    _check_choice("--data-backend", cfg.data_backend, ("auto", "cpu", "dali", "nvjpeg"))
    if cfg.dist_backend is not None:
        _check_choice("--dist-backend", cfg.dist_backend, ("nccl", "gloo"))
