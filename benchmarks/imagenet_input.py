"""CPU image input: hpctrain's streaming pipeline vs torchvision ImageFolder + classic transforms + DataLoader.

Both read the same JPEG files with the same number of worker processes, in one run, alternating (A B A B ...)
so that load from other processes on a shared machine hits both alike, after one untimed warm-up pass each;
the ratio reported is the median of the per-round ratios.

  training    hpctrain: header -> crop chosen in original pixels -> reduced-size libjpeg-turbo decode
              (simplejpeg) -> OpenCV resample -> flip -> uint8 NHWC batch (normalization happens later,
              on the training device);
              torchvision: PIL decode -> RandomResizedCrop(224) -> RandomHorizontalFlip -> ToTensor ->
              Normalize -> float batch (pytorch/examples imagenet/main.py).
  validation  hpctrain: CenterCrop box (Resize 256 + CenterCrop 224 geometry), reduced-size decode;
              torchvision: Resize(256) -> CenterCrop(224) -> ToTensor -> Normalize.

Images/s per core = images/s / worker processes (each worker is one core's worth of work; the machine must have
at least --workers cores for that to mean anything). The data: --images realistic JPEGs (~500x375, quality 90)
cut from the photographs bundled in scikit-image (tests/image_fixtures.py), or your own ImageFolder with --data.

    python benchmarks/imagenet_input.py                       # 600 generated JPEGs, 2 workers, 5 rounds
    python benchmarks/imagenet_input.py --data /path/imagenet --workers 8 --limit 5000
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from hpctrain.data.imagefolder import ImageSet, scan_class_folders
from hpctrain.data.loader import ImageFolderSource, LoaderConfig
from hpctrain.data.sampler import EpochPlan
from hpctrain.data.transforms import CenterCrop, RandomResizedCrop

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def generate(folder: Path, count: int) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from image_fixtures import GRAY_PHOTOS, RGB_PHOTOS, write_photo_jpegs

    classes = [("n01_a", RGB_PHOTOS[:5]), ("n02_b", RGB_PHOTOS[5:]), ("n03_gray", GRAY_PHOTOS[:4] + RGB_PHOTOS[:2])]
    for c, (name, photos) in enumerate(classes):
        write_photo_jpegs(folder / "train" / name, count // len(classes), seed=c, names=photos)
    return folder / "train"


def hpctrain_pass(images: ImageSet, workers: int, batch: int, train: bool, epoch: int) -> Iterable:
    source = ImageFolderSource(
        images, images, LoaderConfig(workers=workers), seed=0, train_crop=RandomResizedCrop(), eval_crop=CenterCrop()
    )
    if train:
        return source.train_batches(EpochPlan(len(images), batch, 1, 0), epoch, 0, 0)
    return source.eval_batches(1, 0, batch)


def torchvision_pass(root: Path, workers: int, batch: int, train: bool, epoch: int) -> Iterable:
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    if train:
        transform = T.Compose(
            [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]
        )
    else:
        transform = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])
    torch.manual_seed(epoch)
    return torch.utils.data.DataLoader(
        ImageFolder(str(root), transform=transform), batch_size=batch, shuffle=train, num_workers=workers
    )


def timed(make: Callable[[], Iterable]) -> tuple[float, int]:
    """Seconds for one full pass (worker start-up included) and the images it produced."""
    started = time.perf_counter()
    count = 0
    for batch in make():
        images = batch.images if hasattr(batch, "images") else batch[0]
        count += images.shape[0]
    return time.perf_counter() - started, count


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    return next(
        (line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "unknown CPU"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="an ImageFolder root (DATA/train); default: generate JPEGs")
    parser.add_argument("--images", type=int, default=600, help="JPEGs to generate (default 600)")
    parser.add_argument("--limit", type=int, help="use only the first N images of --data")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.limit and not args.data:
        parser.error("--limit only applies to --data")

    with tempfile.TemporaryDirectory() as tmp:
        root = args.data / "train" if args.data else generate(Path(tmp), args.images)
        images = scan_class_folders(root)
        if args.limit:
            images = ImageSet(images.root, images.paths[: args.limit], images.labels[: args.limit], images.classes)
        n = len(images)
        per_core = max(1, args.workers)
        print(
            f"CPU: {cpu_model()}; {torch.get_num_threads()} threads available; {n} JPEGs; "
            f"{args.workers} worker processes; batch {args.batch}; torch {torch.__version__}"
        )
        for train in (True, False):
            name = "training (random-resized-crop 224 + flip)" if train else "validation (resize 256 + center 224)"
            ratios, ours, theirs = [], [], []
            timed(lambda: hpctrain_pass(images, args.workers, args.batch, train, -1))  # warm-up: imports, page
            timed(lambda: torchvision_pass(root, args.workers, args.batch, train, -1))  # cache, lazy init
            for r in range(args.rounds):
                t_ours, n_ours = timed(lambda: hpctrain_pass(images, args.workers, args.batch, train, r))
                t_tv, n_tv = timed(lambda: torchvision_pass(root, args.workers, args.batch, train, r))
                assert n_ours == n_tv == n, (n_ours, n_tv, n)
                ours.append(n / t_ours / per_core)
                theirs.append(n / t_tv / per_core)
                ratios.append(t_tv / t_ours)
            print(f"{name}:")
            print(
                f"  torchvision ImageFolder + DataLoader  {statistics.median(theirs):7.0f} images/s per core "
                f"(rounds: {', '.join(f'{v:.0f}' for v in theirs)})"
            )
            print(
                f"  hpctrain streaming pipeline           {statistics.median(ours):7.0f} images/s per core "
                f"(rounds: {', '.join(f'{v:.0f}' for v in ours)})"
            )
            print(
                f"  ratio hpctrain / torchvision: median {statistics.median(ratios):.2f}x "
                f"(rounds: {', '.join(f'{v:.2f}' for v in ratios)})"
            )


if __name__ == "__main__":
    main()
