"""The ``nvjpeg`` backend: worker processes read bytes, the training device decodes, crops, resizes and mirrors.

DataLoader workers read each sample's encoded bytes and header and choose its crop (`read_window`), and send the
batch's JPEGs as one concatenated byte tensor; no decoding happens there, except for the samples a GPU JPEG decoder
does not take (PNGs and other formats, CMYK/YCCK JPEGs), which the CPU decoder crops as the cpu backend does. In the
training process the JPEGs are decoded together by ``torchvision.io.decode_jpeg(list, device=...)`` (nvJPEG on a
CUDA device, libjpeg-turbo on the CPU, which is how the tests run it), and the crop boxes are resized to the output
size (bilinear with antialiasing, rounded back to uint8) and mirrored where the crop says so, for the whole batch at
once (`crop_resize_batch`: a few batched operations, not a dozen kernels per image launched from the training
thread). The result is the uint8 NHWC batch every backend hands to `to_device`. On a GPU each batch is decoded on a
CUDA stream of its own, after the previous step's kernels and before the step that uses it (`streams.DecodeStream`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
import warnings
from typing import NamedTuple

import numpy as np
import torch

from hpctrain import compat
from hpctrain.data.backends.encoded import read_window
from hpctrain.data.backends.streams import DecodeStream
from hpctrain.data.decode import BadImageError, decode_crop
from hpctrain.data.loader import (
    IGNORE_LABEL,
    Batch,
    BatchRequest,
    Batches,
    ImageBatchDataset,
    ImageFolderSource,
    LoaderConfig,
    TrainRequests,
    _as_is,
    _empty_uint8,
    check_shared_memory,
)


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

    def __getitem__(self, request: BatchRequest) -> EncodedBatch:
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
                    decode_crop(
                        window.data,
                        self.images.name(index),
                        self.spec,
                        self.seed,
                        request.epoch,
                        index,
                        decoded[slot].numpy(),
                    )
            except BadImageError as err:
                labels[slot] = IGNORE_LABEL
                bad.append((err.path, str(err)))
        data = _empty_uint8((sum(len(b) for b in jpegs),))
        if jpegs:
            data.numpy()[:] = np.frombuffer(b"".join(jpegs), dtype=np.uint8)
        return EncodedBatch(
            torch.tensor(request.indices, dtype=torch.int64),
            labels,
            torch.tensor(slots, dtype=torch.int64),
            torch.tensor([len(b) for b in jpegs], dtype=torch.int64),
            data,
            torch.tensor(boxes, dtype=torch.int64).reshape(-1, 5),
            decoded,
            tuple(bad),
        )


class NvjpegSource(ImageFolderSource):
    """`ImageFolderSource`'s batches (same requests, crops, bad-image handling), decoded on `device`."""

    def __init__(
        self,
        train,
        val,
        config: LoaderConfig,
        seed: int,
        train_crop=None,
        eval_crop=None,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__(train, val, config, seed, train_crop, eval_crop)
        self.device = torch.device(device)

    def _stream(
        self, dataset: ImageBatchDataset, requests: Sequence[BatchRequest] | TrainRequests, batch_size: int
    ) -> Batches:
        cfg = self.config
        height, width = dataset.spec.size
        check_shared_memory(batch_size * height * width * 3, cfg)
        encoded = EncodedBatchDataset(dataset)
        loader: Iterable[EncodedBatch] = torch.utils.data.DataLoader(
            encoded,
            sampler=requests,
            batch_size=None,
            collate_fn=_as_is,
            num_workers=cfg.workers,
            prefetch_factor=cfg.prefetch_factor if cfg.workers else None,
            pin_memory=cfg.pin_memory,
        )
        return Batches(self._decoded(loader, encoded, requests), len(requests), cfg.skip_bad_images)

    def _decoded(
        self,
        loader: Iterable[EncodedBatch],
        dataset: EncodedBatchDataset,
        requests: Sequence[BatchRequest] | TrainRequests,
    ) -> Iterator[Batch]:
        epoch = requests.epoch if isinstance(requests, TrainRequests) else 0
        order = DecodeStream(self.device) if self.device.type == "cuda" else None
        for batch in loader:
            if order is None:
                yield decode_batch(batch, dataset, epoch, self.device)
                continue
            with order.batch() as used:  # on a stream of its own, after the previous step's kernels (streams.py)
                decoded = decode_batch(batch, dataset, epoch, self.device)
                used(decoded.images)
            yield decoded


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

            compat.say_once(
                "decode_jpeg",
                f"torchvision {torchvision.__version__} decodes one JPEG per call "
                "(batched decode_jpeg needs torchvision >= 0.19): the nvjpeg backend decodes image by "
                "image, slower on a GPU",
            )
        if pictures is None:
            pictures = [_decode_one(jpeg, device) for jpeg in jpegs]
        slots = batch.jpeg_slots
        decoded = [i for i, picture in enumerate(pictures) if picture is not None]
        if decoded:
            chosen = torch.tensor(decoded, dtype=torch.int64)
            out[slots[chosen].to(device)] = crop_resize_batch(
                [pictures[i] for i in decoded], batch.boxes[chosen], tuple(out.shape[1:3])
            )
        for i in sorted(set(range(len(pictures))) - set(decoded)):  # rare: JPEGs the device decoder rejected
            slot = int(slots[i])
            _decode_on_cpu(dataset, int(batch.indices[slot]), epoch, slot, out, labels, bad)
    return Batch(out, labels, tuple(bad))


# Most bytes of float32 input pixels one `crop_resize_batch` step pads its images to (several steps otherwise).
PADDED_BYTES = 512 * 1024 * 1024


def crop_resize_batch(pictures: Sequence[torch.Tensor], boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 (3, H_i, W_i) images of any sizes and their boxes (k, 5: top, left, height, width, flip) -> each box
    resized to `size` (bilinear with antialiasing, as ``F.interpolate(..., antialias=True)``) and mirrored where
    flip is set, as uint8 (k, h, w, 3). A few batched operations for the whole batch, not a dozen per image: a
    separable resize is two matrix products, rows = Wy @ image @ Wx^T, whose weights hold the crop window and the
    mirroring, so the images are only stacked (padded with zeros that get weight 0), never cut one by one.
    Images are grouped by size so that padding stays under PADDED_BYTES per group."""
    height, width = size
    device = pictures[0].device
    result = torch.empty((len(pictures), height, width, 3), dtype=torch.uint8, device=device)
    boxes = boxes.to(device)
    for group in _size_groups([tuple(p.shape[1:]) for p in pictures]):
        chosen = torch.tensor(group, dtype=torch.int64, device=device)
        box = boxes[chosen].double()
        with warnings.catch_warnings():  # torch calls its nested tensors a prototype; padding a list is all we use
            warnings.simplefilter("ignore", UserWarning)
            stacked = torch.nested.nested_tensor([pictures[i] for i in group], dtype=torch.float32)
        stacked = stacked.to_padded_tensor(0.0)  # (k, 3, tallest, widest): a float32 copy, the only one
        rows = _resize_weights(box[:, 0], box[:, 2], stacked.shape[2], height)
        columns = _resize_weights(box[:, 1], box[:, 3], stacked.shape[3], width)
        columns = torch.where(box[:, 4, None, None] != 0, columns.flip(1), columns)
        resized = rows.unsqueeze(1) @ stacked @ columns.transpose(1, 2).unsqueeze(1)
        result[chosen] = resized.permute(0, 2, 3, 1).round_().clamp_(0, 255).to(torch.uint8)
    return result


def _resize_weights(start: torch.Tensor, length: torch.Tensor, in_size: int, out_size: int) -> torch.Tensor:
    """(k, out_size, in_size) float32: output pixel i of window k is the weighted sum of input pixels, weights as in
    torch's antialiased bilinear resize (PIL's): a triangle centred at start + (i + 0.5) * scale, half-width one
    input pixel, `scale` times wider when shrinking, zero outside the window [start, start + length), rows summing
    to one."""
    scale = (length / out_size)[:, None, None]
    centers = start[:, None, None] + scale * (
        torch.arange(out_size, dtype=torch.float64, device=start.device)[:, None] + 0.5
    )
    positions = torch.arange(in_size, dtype=torch.float64, device=start.device) + 0.5
    weights = (1 - (positions - centers).abs() / scale.clamp(min=1.0)).clamp_(min=0)
    weights *= (positions >= start[:, None, None]) & (positions < (start + length)[:, None, None])
    return (weights / weights.sum(-1, keepdim=True)).float()


def _size_groups(shapes: Sequence[tuple[int, int]]) -> list[list[int]]:
    """Positions of `shapes` (H, W) in groups of similar size whose padded float32 RGB stack fits PADDED_BYTES."""
    groups: list[list[int]] = []
    tallest = widest = 0
    for i in sorted(range(len(shapes)), key=lambda i: shapes[i]):
        h, w = max(tallest, shapes[i][0]), max(widest, shapes[i][1])
        if groups and (len(groups[-1]) + 1) * h * w * 3 * 4 <= PADDED_BYTES:
            groups[-1].append(i)
            tallest, widest = h, w
        else:
            groups.append([i])
            tallest, widest = shapes[i]
    return groups


def _decode_one(jpeg: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    from torchvision.io import ImageReadMode, decode_jpeg

    try:
        return decode_jpeg(jpeg, mode=ImageReadMode.RGB, device=device)
    except RuntimeError:
        return None


def _decode_on_cpu(
    dataset: EncodedBatchDataset,
    index: int,
    epoch: int,
    slot: int,
    out: torch.Tensor,
    labels: torch.Tensor,
    bad: list[tuple[str, str]],
) -> None:
    """A JPEG the device decoder rejected: the CPU decoder's result (it accepts what Pillow accepts), or bad."""
    height, width = dataset.spec.size
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    try:
        decode_crop(
            dataset.images.read(index), dataset.images.name(index), dataset.spec, dataset.seed, epoch, index, pixels
        )
    except BadImageError as err:
        labels[slot] = IGNORE_LABEL
        bad.append((err.path, str(err)))
    out[slot] = torch.from_numpy(pixels).to(out.device)
