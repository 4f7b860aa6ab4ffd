"""The seam between the training loop and its data: one protocol for in-memory tensors and streamed images.

The loop asks a `DataSource` for this rank's batches of a training epoch (from a step on, for mid-epoch resume) and
for this rank's share of the evaluation set; batches arrive as (inputs on the device, labels on the device). What
the batches hold is fixed by the source's own pure functions of (seed, epoch, step, rank), so a resumed run reads
exactly the batches an uninterrupted one reads.

- `TensorData` (recipes/base.py): the whole dataset as tensors on the device; a batch is an index gather.
- `StreamingSource` (here): wraps a loader whose worker processes decode images into uint8 batches
  (`hpctrain.data.loader.ImageFolderSource`, `SyntheticSource`); the float work happens on the device.

Every source also reports `data_wait_seconds` per pass: the time the loop spent waiting for input.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import torch

from hpctrain.data.sampler import EpochPlan


class Batches(Protocol):
    """One pass over a rank's batches: iterate once; `wait_seconds` grows as the loop waits for input."""

    wait_seconds: float

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...


class DataSource(Protocol):
    num_train: int
    num_eval: int

    def train_batches(self, plan: EpochPlan, epoch: int, start_step: int, rank: int) -> Batches:
        """This rank's (inputs, labels) for steps start_step .. plan.steps_per_epoch - 1 of `epoch`, in order."""

    def eval_batches(self, world_size: int, rank: int, batch_size: int) -> Batches:
        """This rank's share of the evaluation set: across ranks every sample exactly once; ranks may get
        different numbers of batches (so no per-batch collectives)."""


def timed(items: Iterable, waited: Callable[[float], None]) -> Iterator:
    """Yield from `items`, reporting to `waited(seconds)` the time spent getting each one (and starting the
    iteration, which for a DataLoader starts its worker processes): the training loop's data wait."""
    started = time.perf_counter()
    iterator = iter(items)
    waited(time.perf_counter() - started)
    while True:
        started = time.perf_counter()
        try:
            item = next(iterator)
        except StopIteration:
            return
        finally:
            waited(time.perf_counter() - started)
        yield item


class TimedBatches:
    """Wraps an iterable of (inputs, labels) and adds the time spent in `next()` to `wait_seconds`."""

    def __init__(self, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self._batches = batches
        self.wait_seconds = 0.0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        yield from timed(self._batches, self._waited)

    def _waited(self, seconds: float) -> None:
        self.wait_seconds += seconds


class _DeviceBatches:
    """A loader's uint8 batches moved to the device; `wait_seconds` is the loader's own (time blocked on workers)."""

    def __init__(self, batches, move: Callable[[torch.Tensor], torch.Tensor], device: torch.device) -> None:
        self._batches = batches
        self._move = move
        self._device = device

    @property
    def wait_seconds(self) -> float:
        return self._batches.wait_seconds

    @property
    def bad_images(self) -> list[str]:
        return getattr(self._batches, "bad_images", [])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for batch in self._batches:
            yield self._move(batch.images), batch.labels.to(self._device, non_blocking=True)


class StreamingSource:
    """A streaming loader (ImageFolderSource, SyntheticSource) as a DataSource.

    `train_size(epoch)` gives the training image size of an epoch (progressive resizing) or None for the loader's
    own; `move(uint8 NHWC) -> normalized float NCHW on the device` does the float work on the device.
    """

    def __init__(
        self,
        loader,
        device: torch.device,
        move: Callable[[torch.Tensor], torch.Tensor],
        train_size: Callable[[int], tuple[int, int] | None] = lambda epoch: None,
    ) -> None:
        self.loader = loader
        self.device = device
        self.move = move
        self.train_size = train_size
        self.num_train = loader.num_train
        self.num_eval = loader.num_val
        self.num_classes = loader.num_classes

    def train_batches(self, plan: EpochPlan, epoch: int, start_step: int, rank: int) -> _DeviceBatches:
        size = self.train_size(epoch)
        if size is not None and hasattr(self.loader, "train_crop"):
            batches = self.loader.train_batches(plan, epoch, start_step, rank, size=size)
        else:
            batches = self.loader.train_batches(plan, epoch, start_step, rank)
        return _DeviceBatches(batches, self.move, self.device)

    def eval_batches(self, world_size: int, rank: int, batch_size: int) -> _DeviceBatches:
        return _DeviceBatches(self.loader.eval_batches(world_size, rank, batch_size), self.move, self.device)
