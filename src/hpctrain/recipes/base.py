"""What a recipe is: data + model + optimizer + defaults. The loop, checkpoints and distribution are shared.

`Recipe` here implements the loop's protocol (`hpctrain.training.workload.Recipe`), with defaults for most of it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hpctrain.data.source import DataSource, TimedBatches
from hpctrain.training.precision import Precision
from hpctrain.training.workload import Defaults, Optimization

if TYPE_CHECKING:
    from hpctrain.config import TrainConfig
    from hpctrain.data.sampler import EpochPlan


@dataclass
class TensorData:
    """A whole dataset held as tensors (on the training device): batches are index gathers, not per-sample work."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor

    # ---- the DataSource protocol (data/source.py)

    @property
    def num_train(self) -> int:
        return len(self.train_labels)

    @property
    def num_eval(self) -> int:
        return len(self.test_labels)

    def train_batches(self, plan: EpochPlan, epoch: int, start_step: int, rank: int) -> TimedBatches:
        def batches():
            order = plan.order(epoch).to(self.train_images.device)
            for step in range(start_step, plan.steps_per_epoch):
                indices = plan.rank_indices(order, step, rank)
                yield self.train_images[indices], self.train_labels[indices]

        return TimedBatches(batches())

    def eval_batches(self, world_size: int, rank: int, batch_size: int) -> TimedBatches:
        """A contiguous shard per rank (every sample once across ranks), in batches of `batch_size`."""
        n = len(self.test_labels)
        lo, hi = n * rank // world_size, n * (rank + 1) // world_size
        return TimedBatches(
            (
                self.test_images[start : min(start + batch_size, hi)],
                self.test_labels[start : min(start + batch_size, hi)],
            )
            for start in range(lo, hi, batch_size)
        )


class Recipe(ABC):
    name: str
    description: str
    defaults: Defaults
    datasets: tuple[str, ...]
    reports_top5 = False  # evaluation records top-5 accuracy too (many-class workloads)
    keeps_best = False  # keep checkpoint_best.pt (the best test accuracy) beside the newest checkpoints
    # torch.backends.cudnn.benchmark on CUDA: cuDNN times its convolution algorithms once per input shape and keeps
    # the fastest. Worth it for convolutional models fed a few fixed shapes; its choice may differ between attempts,
    # so GPU weights are not bitwise reproducible across a resume (README: Checkpoints and exact resume).
    cudnn_benchmark = False
    # On a CUDA device, capture the training step and the evaluation forward as CUDA graphs and replay them
    # (hpctrain.training.graphed): for small models whose step is launch-bound. Needs fixed batch shapes.
    graphs_step = False

    def for_config(self, cfg: TrainConfig) -> Recipe:
        """The recipe as this run's options shape it (model architecture, image sizes); default: unchanged."""
        return self

    def check_data(self, cfg: TrainConfig) -> None:
        """UserError unless the data this run will read is there: run where the job is submitted, before it
        queues, and without what only the training side needs (a GPU, DALI). Default: the downloaded dataset."""
        from hpctrain.data import find_dataset_files, get_dataset_spec

        find_dataset_files(get_dataset_spec(cfg.dataset), cfg.data_dir)

    def resolved_options(self) -> dict[str, Any]:
        """Config fields this recipe (shaped by `for_config`) fills in when the user left them unset, written out
        so that the run's config.yaml and checkpoints say what was used; default: none."""
        return {}

    def data_source(self, cfg: TrainConfig, device: torch.device, env: Any) -> DataSource:
        """What the loop trains on. Default: `load_data`'s tensors, the test set cut to --test-limit."""
        data = self.load_data(cfg.dataset, cfg.data_dir, device, cfg.train_limit)
        if cfg.test_limit is not None:
            data.test_images, data.test_labels = data.test_images[: cfg.test_limit], data.test_labels[: cfg.test_limit]
        return data

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        """Around forward and loss in training and evaluation (mixed precision); default: `precision`'s."""
        return self.precision(device).autocast(device.type)

    def precision(self, device: torch.device) -> Precision:
        """The floating-point type training computes in on `device`; default: float32. Recipes that use mixed
        precision return `hpctrain.training.precision.precision_for(device)`: one rule for every recipe."""
        return Precision(None, "fp32")

    def describe_scaling(self, cfg: TrainConfig, world_size: int) -> str | None:
        """An extra startup line (batch split, scaled learning rate), or None."""
        return None

    def warnings(self, cfg: TrainConfig, num_train: int, steps_per_epoch: int) -> list[str]:
        """Start-up warnings about settings that train badly on this much data (the run goes on). Default: a
        global batch larger than the training set (every epoch is then one padded step)."""
        if cfg.batch_size <= num_train:
            return []
        return [
            f"the global batch ({cfg.batch_size}) exceeds the {num_train} training images: each epoch is a "
            f"single step over a padded batch, and the recipe's learning rate is scaled for {cfg.batch_size} "
            f"images; pass -b {max(1, num_train // 10)} or so (a tenth of the images) for a small data set"
        ]

    def load_data(self, dataset: str, data_dir: str, device: torch.device, train_limit: int | None) -> TensorData:
        """Training and test tensors, preprocessed once, on `device` (recipes whose data fits in memory)."""
        raise NotImplementedError(f"{type(self).__name__} streams its data: use data_source()")

    @abstractmethod
    def build_model(self) -> nn.Module: ...

    @abstractmethod
    def build_optimization(self, model: nn.Module, lr: float, epochs: int, steps_per_epoch: int) -> Optimization: ...

    def augment(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Per-batch training augmentation, vectorized on the batch's device. Default: none.

        Draw randomness only from `generator`: the loop seeds it from (seed, epoch, step, rank), so a resumed
        run draws the same augmentations as an uninterrupted one without saving any state.
        """
        return images

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, target)

    def predict(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Logits for evaluation; a recipe may average views (test-time augmentation)."""
        return model(images)


@functools.cache
def keep_freed_memory() -> bool:
    """Let glibc keep freed memory for reuse instead of handing it back to the kernel (CPU training only).

    By default every activation of a few MB is a fresh mmap, and the kernel zero-fills each of its pages on
    first touch: thousands of page faults per training step, ~10% of a small CNN's step time on a CPU.
    A high mmap threshold (its maximum, 32 MiB) and trim threshold make the heap recycle those blocks.
    Process-wide and harmless; returns False where the C library is not glibc (nothing changed).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 1 << 30))
