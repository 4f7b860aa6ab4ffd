"""What both GPU-decode backends read in their worker processes: a sample's encoded bytes and its crop window.

The crop comes from hpctrain's `CropSpec` on the size in the image's header (no decoding), exactly as the CPU
backend chooses it, so every backend crops the same box of the same sample at any resume point.
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass

import numpy as np

from hpctrain.data.decode import JPEG_MAGIC, BadImageError, CropSpec
from hpctrain.data.transforms import Crop


@dataclass(frozen=True)
class Window:
    """One sample as read by a worker: bytes, where to crop them, and whether a GPU JPEG decoder takes them."""

    data: bytes
    crop: Crop
    gpu_jpeg: bool  # a JPEG in a colour space nvJPEG decodes to RGB (not CMYK/YCCK, not a file libjpeg rejects)


def read_window(images, index: int, spec: CropSpec, seed: int, epoch: int) -> Window:
    """Sample `index` of `images` (an `EncodedImages`) with its crop for `epoch`; BadImageError naming the sample
    when it cannot be read or its header cannot be parsed."""
    data = images.read(index)
    try:
        height, width, gpu_jpeg = header_size(data)
    except Exception as err:  # simplejpeg's ValueError, Pillow's UnidentifiedImageError, ...: all mean "bad file"
        raise BadImageError(images.name(index), f"{type(err).__name__}: {err}") from err
    return Window(data, spec.crop(height, width, seed, epoch, index), gpu_jpeg)


def header_size(data: bytes) -> tuple[int, int, bool]:
    """(height, width, gpu_jpeg) from the header alone: simplejpeg for JPEGs, Pillow (lazy open) for the rest."""
    if data[:3] == JPEG_MAGIC:
        try:
            height, width, colorspace, _ = _simplejpeg().decode_jpeg_header(data)
        except ValueError:
            pass  # let Pillow judge the file
        else:
            return height, width, colorspace not in ("CMYK", "YCCK")
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        width, height = img.size
    return height, width, False


@dataclass(frozen=True)
class RequestTable:
    """A pass's batches as one flat index array and offsets (small to pickle to DALI's spawned workers)."""

    epoch: int
    flat: np.ndarray  # int64 sample indices, batch after batch
    offsets: np.ndarray  # int64, len(batches) + 1

    @classmethod
    def of(cls, epoch: int, batches: list[tuple[int, ...]]) -> RequestTable:
        sizes = np.array([len(b) for b in batches], dtype=np.int64)
        flat = np.fromiter((i for b in batches for i in b), dtype=np.int64, count=int(sizes.sum()))
        return cls(epoch, flat, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, step: int) -> np.ndarray:
        return self.flat[self.offsets[step] : self.offsets[step + 1]]

    @property
    def max_batch(self) -> int:
        return int(np.diff(self.offsets).max(initial=1))


@functools.cache
def _simplejpeg():
    import simplejpeg

    return simplejpeg
