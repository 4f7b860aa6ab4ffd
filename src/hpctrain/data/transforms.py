"""Where to crop each image: pure functions of the image size and, for training, of (seed, epoch, sample index).

A crop is chosen in the original image's pixel coordinates before anything is decoded (the size comes from the
file header), so the decoder can decode at a reduced scale that still covers the crop at the output size, and any
worker, any number of workers and any resume point pick exactly the same crop for the same sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hpctrain.data.sampler import mix_seed

# A separate stream from the sampler's (seed, epoch) and the loop's (seed, epoch, step, rank) generators.
CROP_STREAM = 0x1C80


@dataclass(frozen=True)
class Crop:
    """A box in original image pixels, to be resized to the output size and then mirrored if `flip`."""

    top: int
    left: int
    height: int
    width: int
    flip: bool = False


@dataclass(frozen=True)
class RandomResizedCrop:
    """torchvision's RandomResizedCrop parameters (same draws and fallback), plus a horizontal flip bit.

    Sizes are (height, width) of the output.
    """

    size: tuple[int, int] = (224, 224)
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_probability: float = 0.5

    def crop(self, height: int, width: int, seed: int, epoch: int, index: int) -> Crop:
        rng = np.random.default_rng(mix_seed(seed, CROP_STREAM, epoch, index))
        flip = bool(rng.random() < self.flip_probability)
        top, left, h, w = random_resized_box(height, width, self.scale, self.ratio, rng)
        return Crop(top, left, h, w, flip)


@dataclass(frozen=True)
class CenterCrop:
    """Evaluation: resize the shorter side to `resize`, then take the central `size` (the classic 256 -> 224).

    Computed as one box in the original image (the region that ends up in the output), so only that region is
    decoded and resized; the geometry is torchvision's Resize(resize) + CenterCrop(size).
    """

    size: tuple[int, int] = (224, 224)
    resize: int = 256

    def crop(self, height: int, width: int, seed: int = 0, epoch: int = 0, index: int = 0) -> Crop:
        return center_box(height, width, self.resize, self.size)


def random_resized_box(
    height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float], rng: np.random.Generator
) -> tuple[int, int, int, int]:
    """(top, left, height, width) as torchvision.transforms.RandomResizedCrop.get_params draws them."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    # Fallback: the whole image, cut to the nearest allowed aspect ratio, centred.
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def center_box(height: int, width: int, resize: int, size: tuple[int, int]) -> Crop:
    """The original-image box that Resize(resize) (shorter side) + CenterCrop(size) maps onto the output."""
    factor = resize / min(height, width)  # original pixels -> resized pixels
    h = min(height, max(1, int(round(size[0] / factor))))
    w = min(width, max(1, int(round(size[1] / factor))))
    return Crop((height - h) // 2, (width - w) // 2, h, w)
