"""Streaming image batches for one rank: data worker processes decode and crop, the training device normalizes.

The seam with the training loop:

- ``source.train_batches(plan, epoch, start_step, rank)`` yields this rank's batches for steps
  ``start_step .. plan.steps_per_epoch - 1`` of `epoch`, in order; which samples a step holds comes from
  `EpochPlan` (a pure function of seed and epoch) and each sample's crop and flip from (seed, epoch, sample
  index), so a run resumed at (epoch, step) reads exactly the batches an uninterrupted one reads, with any
  number of workers;
- ``source.eval_batches(world_size, rank, batch_size)`` yields this rank's share of the validation set, every
  image on exactly one rank (rank r takes images r, r + W, r + 2W, ...; no padding, no drop_last);
- each `Batch` holds uint8 NHWC images (CPU, pinned when asked) and int64 labels; `to_device` moves them and
  does the float work (dtype, mean/std, channels_last) on the training device;
- the returned `Batches` object measures ``wait_seconds`` (time the loop spent waiting for input) and collects
  ``bad_images`` (with ``skip_bad_images``: each becomes an all-zero image labelled IGNORE_LABEL, which
  cross_entropy ignores by default and evaluation must not count; without it the first one stops the run with
  an error naming the file).

Workers build whole batches (one request = one step's index list) directly in shared memory: no per-sample
tensors, no stacking, no float work outside the device.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import torch

from hpctrain.data.decode import BadImageError, CropSpec, decode_crop
from hpctrain.data.sampler import EpochPlan, mix_seed
from hpctrain.data.source import timed
from hpctrain.data.transforms import CenterCrop, RandomResizedCrop
from hpctrain.errors import UserError
from hpctrain.fsutil import format_bytes

IGNORE_LABEL = -100  # torch.nn.functional.cross_entropy's default ignore_index
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SHM_PATH = "/dev/shm"


class Batch(NamedTuple):
    images: torch.Tensor  # uint8 (N, H, W, 3)
    labels: torch.Tensor  # int64 (N,)
    bad: tuple[tuple[str, str], ...] = ()  # (path, error message) of images that could not be decoded


@dataclass(frozen=True)
class BatchRequest:
    """Everything a worker needs to build one batch: the epoch (for the crops) and the sample indices."""

    epoch: int
    indices: tuple[int, ...]


@dataclass(frozen=True)
class LoaderConfig:
    workers: int = 4
    prefetch_factor: int = 2  # batches queued per worker
    pin_memory: bool = False  # True when training on a GPU
    skip_bad_images: bool = False
    processes_per_node: int = 1  # every local rank runs its own workers in the same /dev/shm
    shm_path: str = SHM_PATH

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise UserError(f"--workers {self.workers}: use 0 (decode in the training process) or more")
        if self.prefetch_factor < 1:
            raise UserError(f"prefetch factor {self.prefetch_factor}: use 1 or more")


class Batches:
    """One pass over a rank's batches (iterate once), with the input wait time and the bad images seen."""

    def __init__(self, batches: Iterable[Batch], steps: int, skip_bad_images: bool) -> None:
        self._batches = batches
        self._steps = steps
        self._skip_bad_images = skip_bad_images
        self.wait_seconds = 0.0
        self.bad_images: list[str] = []

    def __len__(self) -> int:
        return self._steps

    def __iter__(self) -> Iterator[Batch]:
        for batch in timed(self._batches, self._waited):
            if batch.bad:
                if not self._skip_bad_images:
                    path, message = batch.bad[0]
                    raise UserError(message)
                self.bad_images.extend(path for path, _ in batch.bad)
            yield batch

    def _waited(self, seconds: float) -> None:
        self.wait_seconds += seconds


class BatchSource(Protocol):
    """What the training loop needs from a streaming data source (image folders, synthetic, later shards)."""

    num_train: int
    num_val: int
    num_classes: int
    image_size: tuple[int, int]

    def train_batches(self, plan: EpochPlan, epoch: int, start_step: int, rank: int) -> Batches: ...

    def eval_batches(self, world_size: int, rank: int, batch_size: int) -> Batches: ...


class EncodedImages(Protocol):
    """Where encoded samples come from: an image folder (`ImageSet`, one file each) or any other store of encoded
    images with labels (e.g. packed shards). Sample i is `read(i)` (bytes a decoder takes) with `labels[i]`."""

    labels: np.ndarray  # int64, index into `classes`
    classes: tuple[str, ...]

    def __len__(self) -> int: ...

    def name(self, index: int) -> str: ...

    def read(self, index: int) -> bytes: ...

    def subset(self, keep: np.ndarray) -> EncodedImages: ...


class ImageBatchDataset(torch.utils.data.Dataset):
    """Map-style dataset whose items are whole batches: `dataset[BatchRequest]` -> `Batch`."""

    def __init__(self, images: EncodedImages, spec: CropSpec, seed: int) -> None:
        self.images = images
        self.spec = spec
        self.seed = seed

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, request: BatchRequest) -> Batch:
        height, width = self.spec.size
        out = _empty_uint8((len(request.indices), height, width, 3))
        pixels = out.numpy()
        labels = torch.from_numpy(self.images.labels[list(request.indices)])
        bad = []
        for slot, index in enumerate(request.indices):
            try:
                data = self.images.read(index)
                decode_crop(data, self.images.name(index), self.spec, self.seed, request.epoch, index, pixels[slot])
            except BadImageError as err:
                pixels[slot] = 0
                labels[slot] = IGNORE_LABEL
                bad.append((err.path, str(err)))
        return Batch(out, labels, tuple(bad))


class ImageFolderSource:
    """Training and validation batches decoded from image files (see the module docstring)."""

    def __init__(
        self,
        train: EncodedImages,
        val: EncodedImages | None,
        config: LoaderConfig,
        seed: int,
        train_crop: CropSpec | None = None,
        eval_crop: CropSpec | None = None,
    ) -> None:
        self.train = train
        self.val = val
        self.config = config
        self.seed = seed
        self.train_crop = train_crop or RandomResizedCrop()
        self.eval_crop = eval_crop or CenterCrop()
        self.num_train = len(train)
        self.num_val = len(val) if val is not None else 0
        self.num_classes = len(train.classes)
        self.image_size = self.train_crop.size

    def train_batches(
        self, plan: EpochPlan, epoch: int, start_step: int, rank: int, size: tuple[int, int] | None = None
    ) -> Batches:
        """`size` overrides the output size for this epoch (progressive resizing); the crop boxes do not change."""
        crop = dataclasses.replace(self.train_crop, size=size) if size else self.train_crop
        requests = TrainRequests(plan, epoch, start_step, rank)
        dataset = ImageBatchDataset(self.train, crop, self.seed)
        return self._stream(dataset, requests, plan.largest_rank_batch)

    def eval_batches(self, world_size: int, rank: int, batch_size: int) -> Batches:
        if self.val is None:
            raise UserError("no validation images: add DATA/val/<class>/* or pass --val-path DIR")
        requests = eval_requests(len(self.val), world_size, rank, batch_size)
        dataset = ImageBatchDataset(self.val, self.eval_crop, self.seed)
        return self._stream(dataset, requests, batch_size)

    def _stream(
        self, dataset: ImageBatchDataset, requests: Sequence[BatchRequest] | TrainRequests, batch_size: int
    ) -> Batches:
        cfg = self.config
        height, width = dataset.spec.size
        check_shared_memory(batch_size * height * width * 3, cfg)
        loader: Iterable[Batch] = torch.utils.data.DataLoader(
            dataset,
            sampler=requests,
            batch_size=None,  # each request is already a batch
            collate_fn=_as_is,
            num_workers=cfg.workers,
            prefetch_factor=cfg.prefetch_factor if cfg.workers else None,
            pin_memory=cfg.pin_memory,
        )
        return Batches(loader, len(requests), cfg.skip_bad_images)


class TrainRequests(torch.utils.data.Sampler):
    """This rank's index list for each step of `epoch` from `start_step` on, as `EpochPlan` assigns them."""

    def __init__(self, plan: EpochPlan, epoch: int, start_step: int, rank: int) -> None:
        if not 0 <= start_step <= plan.steps_per_epoch:
            raise ValueError(f"start step {start_step} outside 0..{plan.steps_per_epoch}")
        self.plan, self.epoch, self.start_step, self.rank = plan, epoch, start_step, rank

    def __len__(self) -> int:
        return self.plan.steps_per_epoch - self.start_step

    def __iter__(self) -> Iterator[BatchRequest]:
        order = self.plan.order(self.epoch)
        for step in range(self.start_step, self.plan.steps_per_epoch):
            indices = self.plan.rank_indices(order, step, self.rank)
            yield BatchRequest(self.epoch, tuple(indices.tolist()))


def eval_shard(num_samples: int, world_size: int, rank: int) -> range:
    """Rank `rank`'s validation samples: r, r + W, r + 2W, ... Disjoint, together every sample exactly once."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
    return range(rank, num_samples, world_size)


def eval_requests(num_samples: int, world_size: int, rank: int, batch_size: int) -> list[BatchRequest]:
    """This rank's validation batches; the last may be short, a rank may have one batch fewer (or none)."""
    shard = eval_shard(num_samples, world_size, rank)
    return [BatchRequest(0, tuple(shard[i : i + batch_size])) for i in range(0, len(shard), batch_size)]


def check_shared_memory(batch_bytes: int, config: LoaderConfig) -> None:
    """Refuse to start workers whose queued batches would not fit in /dev/shm (workers die with SIGBUS there)."""
    if config.workers == 0:
        return
    try:
        stats = os.statvfs(config.shm_path)
    except OSError:
        return  # no /dev/shm (not Linux): torch uses another mechanism
    available = stats.f_bavail * stats.f_frsize
    per_worker = batch_bytes * (config.prefetch_factor + 1)  # queued batches + the one being built
    needed = per_worker * config.workers * config.processes_per_node
    if needed <= available:
        return
    fits = available // (per_worker * config.processes_per_node)
    fewer = f"use fewer data workers (--workers {fits})" if fits else "use a smaller per-process batch"
    raise UserError(
        f"{config.shm_path} has {format_bytes(available)} free, but {config.processes_per_node} process(es) x "
        f"{config.workers} data workers x {config.prefetch_factor + 1} batches of {format_bytes(batch_bytes)} need "
        f"{format_bytes(needed)}; {fewer}, or give the container more shared memory (docker run --shm-size=8g; "
        "Kubernetes: mount an emptyDir volume with medium: Memory at /dev/shm)"
    )


def to_device(
    images: torch.Tensor,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    mean: Sequence[float] = IMAGENET_MEAN,
    std: Sequence[float] = IMAGENET_STD,
    channels_last: bool = True,
) -> torch.Tensor:
    """uint8 NHWC (CPU) -> normalized NCHW `dtype` on `device`; the float work happens on the device.

    Permuting NHWC memory to NCHW is exactly the channels_last layout, so that costs nothing; a contiguous
    NCHW copy is made only when `channels_last` is False.
    """
    x = images.to(device, non_blocking=True).permute(0, 3, 1, 2).to(dtype)
    scale = torch.tensor([255.0 * s for s in std], device=device, dtype=dtype).view(1, 3, 1, 1)
    shift = torch.tensor([255.0 * m for m in mean], device=device, dtype=dtype).view(1, 3, 1, 1)
    x = x.sub_(shift).div_(scale)
    return x if channels_last else x.contiguous()


class SyntheticSource:
    """Random uint8 images of the right shape and random labels, no files: the model's own speed ceiling.

    Deterministic: each rank's batch is drawn once from (seed, rank) and served at every step, so the input
    costs nothing but the transfer.
    """

    def __init__(
        self,
        num_train: int = 1_281_167,
        num_val: int = 50_000,
        num_classes: int = 1000,
        image_size: tuple[int, int] = (224, 224),
        seed: int = 0,
        pin_memory: bool = False,
    ) -> None:
        self.num_train, self.num_val, self.num_classes = num_train, num_val, num_classes
        self.image_size = image_size
        self.seed = seed
        self.pin_memory = pin_memory

    def batch(self, size: int, rank: int, stream: int = 0) -> Batch:
        generator = torch.Generator().manual_seed(mix_seed(self.seed, stream, rank))
        images = torch.randint(0, 256, (size, *self.image_size, 3), dtype=torch.uint8, generator=generator)
        labels = torch.randint(0, self.num_classes, (size,), dtype=torch.int64, generator=generator)
        if self.pin_memory:
            images, labels = images.pin_memory(), labels.pin_memory()
        return Batch(images, labels)

    def train_batches(self, plan: EpochPlan, epoch: int, start_step: int, rank: int) -> Batches:
        steps = plan.steps_per_epoch - start_step
        batch = self.batch(plan.global_batch // plan.world_size, rank)
        return Batches([batch] * steps, steps, skip_bad_images=False)

    def eval_batches(self, world_size: int, rank: int, batch_size: int) -> Batches:
        sizes = [len(r.indices) for r in eval_requests(self.num_val, world_size, rank, batch_size)]
        full = self.batch(batch_size, rank, stream=1)
        batches = [Batch(full.images[:n], full.labels[:n]) for n in sizes]
        return Batches(batches, len(batches), skip_bad_images=False)


def _empty_uint8(shape: tuple[int, ...]) -> torch.Tensor:
    """Allocated straight in shared memory inside a worker (as DataLoader's own collate does): no copy on send."""
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8)
    storage = torch.UntypedStorage._new_shared(math.prod(shape))
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)


def _as_is(batch: Batch) -> Batch:
    return batch


__all__ = [
    "IGNORE_LABEL",
    "Batch",
    "BatchRequest",
    "BatchSource",
    "Batches",
    "EncodedImages",
    "ImageBatchDataset",
    "ImageFolderSource",
    "LoaderConfig",
    "SyntheticSource",
    "TrainRequests",
    "check_shared_memory",
    "eval_requests",
    "eval_shard",
    "to_device",
]
