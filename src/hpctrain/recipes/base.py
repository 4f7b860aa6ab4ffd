"""What a recipe is: data + model + optimizer + defaults. The loop, checkpoints and distribution are shared."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Defaults:
    epochs: int
    batch_size: int
    lr: float
    test_batch_size: int


@dataclass
class TensorData:
    """A whole dataset held as tensors (on the training device): batches are index gathers, not per-sample work."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor


@dataclass
class Optimization:
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scheduler_interval: str  # "epoch" or "step": when the loop calls scheduler.step()


class Recipe(ABC):
    name: str
    description: str
    defaults: Defaults
    datasets: tuple[str, ...]

    @abstractmethod
    def load_data(self, dataset: str, data_dir: str, device: torch.device, train_limit: int | None) -> TensorData:
        """Training and test tensors, preprocessed once, on `device`."""

    @abstractmethod
    def build_model(self) -> nn.Module: ...

    @abstractmethod
    def build_optimization(
        self, model: nn.Module, lr: float, epochs: int, steps_per_epoch: int
    ) -> Optimization: ...

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
