"""ImageNet (or any image folder): a torchvision classification model trained from JPEG folders.

Two recipes on the shared loop:

- ``classic``: pytorch/examples imagenet/main.py. SGD lr 0.1 momentum 0.9 weight decay 1e-4, lr / 10 every 30
  epochs, batch 256, 90 epochs; RandomResizedCrop 224 + horizontal flip for training, Resize 256 + CenterCrop 224
  for evaluation; float32.
- ``fast`` (the default): anchored on FFCV's published ResNet recipe (libffcv/ffcv-imagenet,
  rn50_configs/rn50_16_epochs.yaml: 16 epochs, SGD momentum 0.9, weight decay 1e-4 but none on batch norm,
  label smoothing 0.1, a warmup-then-linear-decay ("cyclic") schedule, progressive resizing 160 -> 192 between
  epochs 11 and 13, evaluation at 256; FFCV's published results: ResNet-50 76.6% top-1 in 32 epochs, ResNet-18
  71% in 16). We add channels_last and mixed precision on GPUs (bf16 on sm80+, fp16 on V100/T4; see
  hpctrain.training.precision), and evaluate at 224 from a 256 resize (the classic geometry) so the two recipes'
  accuracies compare. No weight decay on any 1-d parameter (norms and biases).

The learning rate is given per 256 images and scaled linearly with the global batch (Goyal et al., 2017):
lr x batch / 256; the startup line prints the global batch, the per-process batch and the scaled rate.
Data comes from `hpctrain.data.loader` (worker processes decode and crop into uint8 batches; normalization on the
device); crops are pure functions of (seed, epoch, sample index), so mid-epoch resume is exact with any number of
workers.
"""

from __future__ import annotations

import logging
import dataclasses
import functools
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from hpctrain.data.backends import choose_backend, make_loader, require_dali
from hpctrain.data.imagefolder import find_image_folders, scan_validation
from hpctrain.data.loader import (
    IGNORE_LABEL,
    EncodedImages,
    LoaderConfig,
    SyntheticSource,
    check_shared_memory,
    to_device,
)
from hpctrain.data.source import StreamingSource
from hpctrain.data.transforms import CenterCrop, RandomResizedCrop
from hpctrain.errors import UserError
from hpctrain.recipes.base import Optimization, Recipe, keep_freed_memory
from hpctrain.recipes.catalog import CATALOG
from hpctrain.recipes.mnist import warmup_linear_decay
from hpctrain.training.precision import Precision, precision_for

log = logging.getLogger(__name__)

IMAGENET_TRAIN_IMAGES, IMAGENET_VAL_IMAGES, IMAGENET_CLASSES = 1_281_167, 50_000, 1000
LR_REFERENCE_BATCH = 256
# Fewer warmup steps than this to the fast recipe's peak rate diverge from scratch on small data (a start-up warning).
MIN_WARMUP_STEPS = 50
WORKLOAD = CATALOG["imagenet"]  # each recipe's defaults and description, shown by `hpctrain train imagenet --help`


@dataclasses.dataclass(frozen=True)
class ImageSizes:
    train: int  # the training crop's side (the ramp's end with progressive resizing)
    val: int  # the evaluation crop's side
    val_resize: int  # the shorter side is resized to this before the centre crop
    ramp: tuple[int, int, float, float] | None = None  # (from size, to size, start, end as fractions of the epochs)

    def train_size(self, epoch: int, epochs: int) -> int:
        """The side of epoch `epoch`'s training crops: FFCV's linear ramp, rounded down to a multiple of 32."""
        if self.ramp is None:
            return self.train
        low, high, start, end = self.ramp
        first, last = round(start * epochs), round(end * epochs)
        if epoch <= first or last <= first:
            return low if epoch <= first else high
        fraction = min(1.0, (epoch - first) / (last - first))
        return int(low + fraction * (high - low)) // 32 * 32


class ImageNetRecipe(Recipe):
    datasets = WORKLOAD.datasets
    keeps_best = True
    # A few fixed input shapes per run (fast: 160 and 192 training crops, 224 evaluation, and each last partial
    # batch), each timed once; convolutions dominate a ResNet step.
    cudnn_benchmark = True
    momentum = 0.9
    weight_decay = 1e-4
    label_smoothing = 0.0
    decay_norms = True  # weight decay on 1-d parameters (norm weights, biases) too
    channels_last = False
    mixed_precision_on_gpu = False  # autocast on CUDA GPUs, to the type hpctrain.training.precision picks

    def __init__(self, cfg=None) -> None:
        self.cfg = cfg
        self.arch = cfg.arch if cfg is not None and cfg.arch else "resnet50"
        self.num_classes = _count_classes(cfg) if cfg is not None else IMAGENET_CLASSES

    @property
    def reports_top5(self) -> bool:
        """Top-5 accuracy only where it says something: with 5 classes or fewer it is always 100%."""
        return self.num_classes > 5

    def for_config(self, cfg) -> ImageNetRecipe:
        _check_backend(cfg)
        return type(self)(cfg)

    def check_data(self, cfg) -> None:
        _count_classes(cfg)  # DATA/train's class folders, or a prepared directory's index

    # ---------------------------------------------------------------- data

    def sizes(self) -> ImageSizes:
        cfg = self.cfg
        val = cfg.val_size if cfg is not None and cfg.val_size else 224
        resize = round(val * 256 / 224)
        if cfg is not None and cfg.image_size:
            return ImageSizes(cfg.image_size, val, resize)
        return self.default_sizes(val, resize)

    def default_sizes(self, val: int, resize: int) -> ImageSizes:
        return ImageSizes(224, val, resize)

    def resolved_options(self) -> dict:
        """The model and the crop sides in use (a progressive ramp leaves image_size unset: no one side)."""
        sizes = self.sizes()
        return {"arch": self.arch, "image_size": None if sizes.ramp else sizes.train, "val_size": sizes.val}

    def data_source(self, cfg, device, env):
        sizes = self.sizes()
        side = max(sizes.train, sizes.ramp[1] if sizes.ramp else 0)
        cuda = device.type == "cuda"
        if device.type == "cpu":
            keep_freed_memory()
        if cfg.synthetic:
            loader = SyntheticSource(
                cfg.train_limit or IMAGENET_TRAIN_IMAGES,
                cfg.test_limit or IMAGENET_VAL_IMAGES,
                self.num_classes,
                (sizes.train, sizes.train),
                cfg.seed,
                pin_memory=cuda,
            )
        else:
            train, val = _encoded_images(cfg)
            if cfg.workers is not None:
                from hpctrain.distributed.cores import check_worker_count

                check_worker_count("--workers", cfg.workers)
            workers = cfg.workers if cfg.workers is not None else default_workers(env.local_world_size)
            config = LoaderConfig(
                workers=workers,
                pin_memory=cuda,
                skip_bad_images=cfg.skip_bad_images,
                processes_per_node=env.local_world_size,
            )
            per_process = max(cfg.batch_size // env.world_size, cfg.test_batch_size)
            check_shared_memory(per_process * side * side * 3, config)  # before training, not at epoch 1's end
            loader = image_loader(
                cfg,
                device,
                env,
                _subset(train, cfg.train_limit),
                _subset(val, cfg.test_limit),
                config,
                train_crop=RandomResizedCrop((sizes.train, sizes.train)),
                eval_crop=CenterCrop((sizes.val, sizes.val), sizes.val_resize),
            )
        move = functools.partial(to_device, device=device, channels_last=self.channels_last)
        epochs = cfg.epochs

        def train_size(epoch: int) -> tuple[int, int] | None:
            side = sizes.train_size(epoch, epochs)
            return (side, side) if sizes.ramp is not None else None

        return StreamingSource(loader, device, move, train_size)

    # ---------------------------------------------------------------- model and optimization

    def build_model(self) -> nn.Module:
        import torchvision

        try:
            model = torchvision.models.get_model(self.arch, num_classes=self.num_classes)
        except ValueError:
            names = torchvision.models.list_models(module=torchvision.models)
            raise UserError(
                f"--arch {self.arch!r} is not a torchvision classification model; choose one of "
                f"{', '.join(names[:12])}, ... (torchvision.models.list_models())"
            ) from None
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    def scaled_lr(self, lr: float) -> float:
        return lr * self._batch() / LR_REFERENCE_BATCH

    def _batch(self) -> int:
        return self.cfg.batch_size if self.cfg is not None and self.cfg.batch_size else self.defaults.batch_size

    def _momentum_and_decay(self) -> tuple[float, float]:
        cfg = self.cfg
        momentum = cfg.momentum if cfg is not None and cfg.momentum is not None else self.momentum
        decay = cfg.weight_decay if cfg is not None and cfg.weight_decay is not None else self.weight_decay
        return momentum, decay

    def param_groups(self, model: nn.Module) -> list[dict]:
        _, decay = self._momentum_and_decay()
        if self.decay_norms:
            return [{"params": list(model.parameters()), "weight_decay": decay}]
        return [
            {"params": [p for p in model.parameters() if p.ndim > 1], "weight_decay": decay},
            {"params": [p for p in model.parameters() if p.ndim <= 1], "weight_decay": 0.0},
        ]

    def describe_scaling(self, cfg, world_size: int) -> str:
        sizes = self.sizes()
        train = f"{sizes.ramp[0]}->{sizes.ramp[1]} (progressive)" if sizes.ramp else str(sizes.train)
        return (
            f"{self.arch}, {self.num_classes} classes; global batch {cfg.batch_size} = {world_size} process(es) "
            f"x {cfg.batch_size // world_size}; lr {cfg.lr:g} per {LR_REFERENCE_BATCH} images -> "
            f"{self.scaled_lr(cfg.lr):g}; train size {train}, eval {sizes.val} (resize {sizes.val_resize})"
        )

    def loss(self, output, target):
        if self.cfg is not None and self.cfg.skip_bad_images:
            # Unreadable images are labelled IGNORE_LABEL; a batch of nothing else would make the mean 0/0 = nan,
            # read as divergence. The mean over the readable ones (none: 0, with zero gradients) never is.
            total = F.cross_entropy(output, target, label_smoothing=self.label_smoothing, reduction="sum")
            return total / (target != IGNORE_LABEL).sum().clamp(min=1)
        return F.cross_entropy(output, target, label_smoothing=self.label_smoothing)

    def precision(self, device: torch.device) -> Precision:
        """Mixed precision on a CUDA GPU where the recipe asks for it (the type the GPU computes natively: bf16 from
        sm80, fp16 with a gradient scaler on sm70/75, fp32 below); float32 elsewhere."""
        if self.mixed_precision_on_gpu and device.type == "cuda":
            return precision_for(device)
        return super().precision(device)


class ClassicRecipe(ImageNetRecipe):
    """pytorch/examples imagenet/main.py: SGD 0.1 momentum 0.9 wd 1e-4, lr / 10 every 30 epochs, batch 256."""

    name = "classic"
    description = WORKLOAD.recipes["classic"].description
    defaults = WORKLOAD.recipes["classic"].defaults

    def build_optimization(self, model, lr, epochs, steps_per_epoch):
        momentum, _ = self._momentum_and_decay()
        optimizer = torch.optim.SGD(self.param_groups(model), lr=self.scaled_lr(lr), momentum=momentum)
        return Optimization(optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.1), "epoch")


class FastRecipe(ImageNetRecipe):
    """Ours, anchored on FFCV's (see the module docstring)."""

    name = "fast"
    description = WORKLOAD.recipes["fast"].description
    defaults = WORKLOAD.recipes["fast"].defaults
    label_smoothing = 0.1
    decay_norms = False
    channels_last = True
    mixed_precision_on_gpu = True
    warmup_fraction = 2 / 16  # FFCV's cyclic schedule peaks after 2 of 16 epochs
    ramp = (160, 192, 11 / 16, 13 / 16)  # FFCV: 160 -> 192 between epochs 11 and 13 of 16

    def default_sizes(self, val: int, resize: int) -> ImageSizes:
        return ImageSizes(self.ramp[1], val, resize, self.ramp)

    def warnings(self, cfg, num_train: int, steps_per_epoch: int) -> list[str]:
        """Also: a warmup of a handful of steps. The schedule reaches its peak rate after 2/16 of the run, which on
        a small set is a few steps: a model trained from scratch then diverges (seen: 400 images, 2 epochs, batch
        64 -> a 2-step warmup to lr 0.125, loss rising, accuracy at chance)."""
        lines = super().warnings(cfg, num_train, steps_per_epoch)
        warmup = max(1, round(self.warmup_fraction * cfg.epochs * steps_per_epoch))
        if warmup < MIN_WARMUP_STEPS:
            lines.append(
                f"the fast recipe warms up for only {warmup} step(s) ({cfg.epochs} epoch(s) x "
                f"{steps_per_epoch} step(s), 2/16 of them) to a peak learning rate of "
                f"{self.scaled_lr(cfg.lr):g}: on a small data set that diverges. For a first try use "
                f"--recipe classic (see the README's quick first try), or a lower --lr and more --epochs"
            )
        return lines

    def build_optimization(self, model, lr, epochs, steps_per_epoch):
        momentum, _ = self._momentum_and_decay()
        optimizer = torch.optim.SGD(self.param_groups(model), lr=self.scaled_lr(lr), momentum=momentum)
        total = max(1, epochs * steps_per_epoch)
        warmup = max(1, round(self.warmup_fraction * total))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear_decay(warmup, total))
        return Optimization(optimizer, scheduler, "step")


def default_workers(local_processes: int) -> int:
    """Data workers per training process: the node's cores shared among its processes, at most 8."""
    from hpctrain.distributed.cores import available_cores

    return max(1, min(8, available_cores() // max(1, local_processes)))


def _encoded_images(cfg) -> tuple[EncodedImages, EncodedImages]:
    """Training and validation samples: from the shards of a directory `hpctrain prepare` wrote, or from image
    folders (validation from --val-path, when given, in either case)."""
    from hpctrain.data import shards

    if shards.is_prepared(cfg.data_dir):
        prepared = shards.open_prepared(cfg.data_dir)
        train, val = prepared.train, prepared.val
        if cfg.val_path is not None:
            val = scan_validation(Path(cfg.val_path), train.classes, cfg.val_labels)
    else:
        found = find_image_folders(cfg.data_dir, cfg.val_path, cfg.val_labels)
        train, val = found.train, found.val
    if val is None:
        raise UserError(
            f"{cfg.data_dir} has no val/ folder: add DATA/val/<class>/* or pass --val-path DIR "
            "(with --val-labels FILE for a flat folder)"
        )
    return train, val


def _subset(images: EncodedImages, limit: int | None) -> EncodedImages:
    """The first `limit` samples of an evenly spaced selection (every class keeps its share), or all of them."""
    if limit is None or limit >= len(images):
        return images
    keep = (np.arange(limit) * len(images)) // limit
    return images.subset(keep)


def _count_classes(cfg) -> int:
    """The number of class folders in DATA/train (the model's output size), or 1000 for --synthetic."""
    if cfg.synthetic:
        return IMAGENET_CLASSES
    from hpctrain.data import shards

    if shards.is_prepared(cfg.data_dir):
        return len(shards.open_prepared(cfg.data_dir).classes)
    train = Path(cfg.data_dir) / "train"
    if not train.is_dir():
        raise UserError(
            f"{cfg.data_dir} has no train/ folder: expected DATA/train/<class>/<image> (and DATA/val/"
            "<class>/<image> or --val-path DIR), or pass --synthetic for random images"
        )
    count = sum(1 for entry in os.scandir(train) if entry.is_dir() and not entry.name.startswith("."))
    if count == 0:
        raise UserError(f"{train} has no class folders: expected DATA/train/<class>/<image>")
    return count


def _check_backend(cfg) -> None:
    """Before anything is written: --data-backend dali needs DALI installed (the device is not known yet)."""
    if cfg.data_backend == "dali" and not cfg.synthetic:
        require_dali()


def image_loader(cfg, device, env, train, val, config, train_crop, eval_crop):
    """The streaming loader of the --data-backend `cfg` asks for (auto: the fastest on `device`), said in one line
    by the first process. GPU backends decode on `device` when it is a CUDA GPU, else on the CPU."""
    choice = choose_backend(cfg.data_backend, device.type, decoded=getattr(train, "stored", "jpeg") == "raw")
    if env.rank == 0:
        log.info(choice.describe())
    decode_on = device if device.type == "cuda" else torch.device("cpu")
    return make_loader(choice, train, val, config, cfg.seed, train_crop, eval_crop, decode_on)


RECIPES: dict[str, Recipe] = {"classic": ClassicRecipe(), "fast": FastRecipe()}
