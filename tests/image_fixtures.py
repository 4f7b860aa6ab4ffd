"""Real image folders for the image pipeline tests (and benchmarks/imagenet_input.py).

- Fashion-MNIST (Debian's dataset-fashion-mnist) written as small grayscale JPEG class folders;
- the photographs that ship inside the scikit-image wheel (no download) cut and resized to ImageNet-like sizes
  (~500x375, quality 90), plus the odd files ImageNet has: CMYK JPEGs, grayscale JPEGs, a PNG.

Import the fixtures into a test module: ``from image_fixtures import photo_folders  # noqa: F401``.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import numpy as np
import pytest

from training_helpers import hpctrain, ok, signal_after

FASHION_CLASSES = ("tshirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot")
RGB_PHOTOS = (
    "astronaut",
    "chelsea",
    "coffee",
    "hubble_deep_field",
    "ihc",
    "motorcycle_left",
    "motorcycle_right",
    "retina",
    "rocket",
    "color",
)
GRAY_PHOTOS = ("camera", "moon", "coins", "grass", "gravel", "brick", "cell", "clock_motion")


def skimage_photo(name: str):
    """A PIL image of one of the photographs bundled in scikit-image's wheel (read from its files, no fetcher)."""
    import skimage
    from PIL import Image

    folder = Path(skimage.__file__).parent / "data"
    matches = sorted(folder.glob(f"{name}.*"))
    if not matches:
        raise FileNotFoundError(f"{name} is not bundled in scikit-image's data folder {folder}")
    with Image.open(matches[0]) as img:
        return img.convert("RGB") if img.mode in ("RGBA", "P") else img.copy()


def realistic_variant(photo, rng: random.Random):
    """A random crop of `photo` resized to an ImageNet-typical size (500x375 or 375x500, sometimes others)."""
    width, height = photo.size
    target = rng.choice([(500, 375), (500, 375), (375, 500), (500, 333), (500, 500)])
    aspect = target[0] / target[1]
    full_w = min(width, int(height * aspect))  # the largest box of the target's aspect ratio
    full_h = min(height, int(full_w / aspect))
    fraction = rng.uniform(0.7, 1.0)
    crop_w, crop_h = int(full_w * fraction), int(full_h * fraction)
    left = rng.randint(0, width - crop_w)
    top = rng.randint(0, height - crop_h)
    from PIL import Image

    return photo.crop((left, top, left + crop_w, top + crop_h)).resize(target, Image.BILINEAR)


def write_photo_jpegs(
    folder: Path, count: int, seed: int, names: tuple[str, ...] = RGB_PHOTOS, quality: int = 90, prefix: str = "img"
) -> list[Path]:
    """`count` realistic JPEGs under `folder` made from the bundled photographs; deterministic in `seed`."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    photos = [skimage_photo(name) for name in names]
    written = []
    for i in range(count):
        path = folder / f"{prefix}_{i:05d}.JPEG"
        realistic_variant(photos[i % len(photos)], rng).save(path, "JPEG", quality=quality)
        written.append(path)
    return written


@pytest.fixture(scope="session")
def photo_folders(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DATA/train/<class>/* and DATA/val/<class>/* of realistic photos, with CMYK, grayscale JPEGs and a PNG."""
    data = tmp_path_factory.mktemp("photos")
    rng = random.Random(0)
    for s, (split, per_class) in enumerate((("train", 8), ("val", 3))):
        for c, (cls, names) in enumerate(
            (("n0001_color", RGB_PHOTOS[:5]), ("n0002_color", RGB_PHOTOS[5:]), ("n0003_gray", GRAY_PHOTOS))
        ):
            folder = data / split / cls
            write_photo_jpegs(folder, per_class, seed=10 * s + c, names=names)
        odd = data / split / "n0004_odd"
        odd.mkdir()
        photo = realistic_variant(skimage_photo("chelsea"), rng)
        photo.convert("CMYK").save(odd / "cmyk.JPEG", "JPEG", quality=90)
        photo.convert("L").save(odd / "gray.JPEG", "JPEG", quality=90)
        photo.save(odd / "png_named.png", "PNG")
        if split == "train":
            realistic_variant(skimage_photo("coffee"), rng).convert("CMYK").save(odd / "cmyk2.jpg", quality=85)
    return data


@pytest.fixture(scope="session")
def fashion_folders(tmp_path_factory: pytest.TempPathFactory, fashion_mnist_source: Path) -> Path:
    """DATA/train/<class>/*.JPEG (30 per class) and DATA/val/<class>/*.JPEG (10 per class) from Fashion-MNIST."""
    from PIL import Image

    from hpctrain.data.idx import read_idx

    images = read_idx(fashion_mnist_source / "t10k-images-idx3-ubyte.gz").numpy()
    labels = read_idx(fashion_mnist_source / "t10k-labels-idx1-ubyte.gz").numpy()
    data = tmp_path_factory.mktemp("fashion")
    counts = {"train": 30, "val": 10}
    for c, cls in enumerate(FASHION_CLASSES):
        chosen = np.flatnonzero(labels == c)
        start = 0
        for split, n in counts.items():
            folder = data / split / cls
            folder.mkdir(parents=True)
            for i in chosen[start : start + n]:
                Image.fromarray(images[i]).save(folder / f"{i:05d}.JPEG", "JPEG", quality=90)
            start += n
    return data


def flatten_val(data: Path, out: Path) -> list[tuple[str, str]]:
    """Copy DATA/train and DATA/val's images into OUT/train and a flat OUT/val; return [(image id, class)]."""
    out.mkdir()
    os.symlink(data / "train", out / "train")
    flat = out / "val"
    flat.mkdir()
    entries = []
    for n, path in enumerate(sorted((data / "val").glob("*/*"))):
        image_id = f"ILSVRC2012_val_{n + 1:08d}"
        os.symlink(path, flat / f"{image_id}{path.suffix}")
        entries.append((image_id, path.parent.name))
    return entries


# ---- `hpctrain train imagenet` runs on these folders: a tiny model, so that a run takes seconds -----------------

# The tests of the mechanics (resume, launchers, backends, validation) train this torchvision model: BatchNorm,
# depthwise and grouped convolutions and a channel shuffle, 0.35 M parameters (resnet18: 11 M). A run of two epochs
# on the folders takes 4.5 s here against 7 s with resnet18, and writes 1.5 MB checkpoints instead of 90 MB. The
# tests that claim learning (test_fast_recipe_learns_fashion_from_jpegs, the README's first try) train resnet18.
TINY_ARCH = "shufflenet_v2_x0_5"
TINY = [
    "--arch",
    TINY_ARCH,
    "--image-size",
    "32",
    "--val-size",
    "32",
    "--threads",
    "1",
    "--log-interval",
    "0",
    "--batch-size",
    "32",
]


def train(data, run_dir, *extra, expect=0, timeout=300):
    result = hpctrain("train", "imagenet", str(data), *TINY, "--run-dir", str(run_dir), *extra, timeout=timeout)
    if expect == 0:
        return ok(result)
    assert result.returncode == expect, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def interrupt(data, run_dir, *extra, after_line="epoch 1/2 step 3/"):
    """An imagenet run stopped by SIGUSR1 (a time-limit warning) a few steps into epoch 1: (exit status, output)."""
    return signal_after(
        ["train", "imagenet", str(data), *TINY, "--run-dir", str(run_dir), "--epochs", "2", *extra],
        after_line,
        signal.SIGUSR1,
    )
