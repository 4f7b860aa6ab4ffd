"""The ``nvjpeg`` backend: worker processes read bytes, the training device decodes, crops, resizes and mirrors.

DataLoader workers read each sample's encoded bytes and header and choose its crop (`read_window`), and send the
batch's JPEGs as one concatenated byte tensor; no decoding happens there, except for the samples a GPU JPEG decoder
does not take (PNGs and other formats, CMYK/YCCK JPEGs), which the CPU decoder crops as the cpu backend does. In the
training process the JPEGs are decoded together by ``torchvision.io.decode_jpeg(list, device=...)`` (nvJPEG on a
CUDA device, libjpeg-turbo on the CPU, which is how the tests run it), each decoded image's crop box is resized to
the output size (bilinear with antialiasing, rounded back to uint8) and mirrored if its crop says so. The result is
the uint8 NHWC batch every backend hands to `to_device`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch.nn import functional as F

from hpctrain import compat
from hpctrain.data.backends.encoded import read_window
from hpctrain.data.decode import BadImageError, decode_crop
from hpctrain.data.loader import (IGNORE_LABEL, Batch, BatchRequest, Batches, ImageBatchDataset, ImageFolderSource,
                                  LoaderConfig, TrainRequests, _as_is, _empty_uint8, check_shared_memory)


class EncodedBatch(NamedTuple):
    """A batch as a worker sends it: JPEG bytes for the device, the other samples already decoded."""

    indices: torch.Tensor  # int64 (N,) sample indices
    labels: torch.Tensor  # int64 (N,)
    jpeg_slots: torch.Tensor  # int64 (k,) batch positions of the JPEGs in `data`
    jpeg_sizes: torch.Tensor  # int64 (k,) their lengths in bytes
    data: torch.Tensor  # uint8 (sum of jpeg_sizes,) the JPEGs, concatenated
    boxes: torch.Tensor  # int64 (k, 5) top, left, height, width, flip of each JPEG's crop
    decoded: torch.Tensor  # uint8 (N, H, W, 3) rows of the samples decoded here (zeros elsewhere)
    bad: tuple[tuple[str, str], ...] = ()


class EncodedBatchDataset(torch.utils.data.Dataset):
    """`dataset[BatchRequest]` -> `EncodedBatch`: bytes and crop windows, CPU decoding only where GPUs cannot."""

    def __init__(self, source: ImageBatchDataset) -> None:
        self.images, self.spec, self.seed = source.images, source.spec, source.seed

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, request: BatchRequest) -> EncodedBatch:  # type: ignore[override]
        height, width = self.spec.size
        count = len(request.indices)
        decoded = _empty_uint8((count, height, width, 3))
        decoded.zero_()
        labels = torch.from_numpy(self.images.labels[list(request.indices)])
        slots, jpegs, boxes, bad = [], [], [], []
        for slot, index in enumerate(request.indices):
            try:
                window = read_window(self.images, index, self.spec, self.seed, request.epoch)
                if window.gpu_jpeg:
                    crop = window.crop
                    slots.append(slot)
                    jpegs.append(window.data)
                    boxes.append((crop.top, crop.left, crop.height, crop.width, int(crop.flip)))
                else:
                    decode_crop(window.data, self.images.name(index), self.spec, self.seed, request.epoch, index,
                                decoded[slot].numpy())
            except BadImageError as err:
                labels[slot] = IGNORE_LABEL
                bad.append((err.path, str(err)))
        data = _empty_uint8((sum(len(b) for b in jpegs),))
        if jpegs:
            data.numpy()[:] = np.frombuffer(b"".join(jpegs), dtype=np.uint8)
        return EncodedBatch(torch.tensor(request.indices, dtype=torch.int64), labels,
                            torch.tensor(slots, dtype=torch.int64),
                            torch.tensor([len(b) for b in jpegs], dtype=torch.int64), data,
                            torch.tensor(boxes, dtype=torch.int64).reshape(-1, 5), decoded, tuple(bad))


class NvjpegSource(ImageFolderSource):
    """`ImageFolderSource`'s batches (same requests, crops, bad-image handling), decoded on `device`."""

    def __init__(self, train, val, config: LoaderConfig, seed: int,  # type: ignore[no-untyped-def]
                 train_crop=None, eval_crop=None, device: torch.device | str = "cpu") -> None:
        super().__init__(train, val, config, seed, train_crop, eval_crop)
        self.device = torch.device(device)

    def _stream(self, dataset: ImageBatchDataset, requests: Sequence[BatchRequest] | TrainRequests,
                batch_size: int) -> Batches:
        cfg = self.config
        height, width = dataset.spec.size
        check_shared_memory(batch_size * height * width * 3, cfg)
        encoded = EncodedBatchDataset(dataset)
        loader: Iterable[EncodedBatch] = torch.utils.data.DataLoader(
            encoded, sampler=requests, batch_size=None, collate_fn=_as_is,  # type: ignore[arg-type]
            num_workers=cfg.workers, prefetch_factor=cfg.prefetch_factor if cfg.workers else None,
            pin_memory=cfg.pin_memory)
        return Batches(self._decoded(loader, encoded, requests), len(requests), cfg.skip_bad_images)

    def _decoded(self, loader: Iterable[EncodedBatch], dataset: EncodedBatchDataset,
                 requests: Sequence[BatchRequest] | TrainRequests) -> Iterator[Batch]:
        epoch = requests.epoch if isinstance(requests, TrainRequests) else 0
        for batch in loader:
            yield decode_batch(batch, dataset, epoch, self.device)


def decode_batch(batch: EncodedBatch, dataset: EncodedBatchDataset, epoch: int, device: torch.device) -> Batch:
    """The uint8 NHWC batch on `device`: the JPEGs decoded there together, cropped, resized and mirrored."""
    from torchvision.io import ImageReadMode, decode_jpeg

    out = batch.decoded.to(device, non_blocking=True)
    labels = batch.labels.clone()
    bad = list(batch.bad)
    if len(batch.jpeg_slots):
        jpegs = list(torch.split(batch.data, batch.jpeg_sizes.tolist()))
        pictures: list[torch.Tensor | None] | None = None
        if compat.batched_decode_jpeg():
            try:
                pictures = decode_jpeg(jpegs, mode=ImageReadMode.RGB, device=device)
            except RuntimeError:  # one of them is broken: decode one by one, the CPU decoder judges the failures
                pass
        else:
            import torchvision

            compat.say_once("decode_jpeg", f"torchvision {torchvision.__version__} decodes one JPEG per call "
                            "(batched decode_jpeg needs torchvision >= 0.19): the nvjpeg backend decodes image by "
                            "image, slower on a GPU")
        if pictures is None:
            pictures = [_decode_one(jpeg, device) for jpeg in jpegs]
        size = tuple(out.shape[1:3])
        for slot, box, picture in zip(batch.jpeg_slots.tolist(), batch.boxes.tolist(), pictures):
            if picture is None:
                index = int(batch.indices[slot])
                _decode_on_cpu(dataset, index, epoch, slot, out, labels, bad)
            else:
                out[slot] = crop_resize(picture, box, size)  # type: ignore[arg-type]
    return Batch(out, labels, tuple(bad))


def crop_resize(picture: torch.Tensor, box: Sequence[int], size: tuple[int, int]) -> torch.Tensor:
    """uint8 (3, H, W) -> the box (top, left, height, width, flip) resized to `size`, as uint8 (h, w, 3)."""
    top, left, height, width, flip = box
    patch = picture[:, top : top + height, left : left + width].unsqueeze(0).float()
    resized = F.interpolate(patch, size=size, mode="bilinear", antialias=True, align_corners=False)[0]
    if flip:
        resized = resized.flip(-1)
    return resized.permute(1, 2, 0).round_().clamp_(0, 255).to(torch.uint8)


def _decode_one(jpeg: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        return decode_jpeg(jpeg, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        return None


def _decode_on_cpu(dataset: EncodedBatchDataset, index: int, epoch: int, slot: int, out: torch.Tensor,
                   labels: torch.Tensor, bad: list[tuple[str, str]]) -> None:
    """A JPEG the device decoder rejected: the CPU decoder's result (it accepts what Pillow accepts), or bad."""
    height, width = dataset.spec.size
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    try:
        decode_crop(dataset.images.read(index), dataset.images.name(index), dataset.spec, dataset.seed, epoch,
                    index, pixels)
    except BadImageError as err:
        labels[slot] = IGNORE_LABEL
        bad.append((err.path, str(err)))
    out[slot] = torch.from_numpy(pixels).to(out.device)
