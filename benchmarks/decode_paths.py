"""Images per second per core of each input path, on one core, side by side: what a data worker can feed.

From the same realistic photos (~500x375 JPEGs at quality 90, cut from scikit-image's bundled photographs as
tests/image_fixtures.py makes them), held in memory (no file reads), each path produces the training sample
(RandomResizedCrop to --size, flip, uint8 HWC) with hpctrain's decoder:

- full:  the original JPEG decoded at full size (reduced-size decoding turned off), then cropped and resized;
- draft: the original JPEG decoded at the smallest 1/2, 1/4 or 1/8 scale that still covers the crop (the default);
- jpeg N: the JPEG `hpctrain prepare` stores at --max-side N (re-encoded at quality 95), draft-decoded;
- raw N:  the binary PPM `hpctrain prepare --format raw --max-side N` stores: nothing decoded, only resampled.

Timed in this thread's CPU time (so that other programs on a shared machine do not count), interleaved rounds,
the median round per path; bytes per image are what a shard holds for it (the image data, without tar headers).

    python benchmarks/decode_paths.py                      # 48 photos, 224-px crops, 5 rounds
    python benchmarks/decode_paths.py --size 192 --max-sides 256,320 --rounds 7
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from hpctrain.data import decode
from hpctrain.data.transforms import RandomResizedCrop


def photos(count: int) -> list[bytes]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from image_fixtures import RGB_PHOTOS, write_photo_jpegs

    with tempfile.TemporaryDirectory() as folder:
        return [path.read_bytes() for path in write_photo_jpegs(Path(folder), count, seed=0, names=RGB_PHOTOS)]


def stored(jpeg: bytes, max_side: int, raw: bool) -> bytes:
    """What `hpctrain prepare` stores for this JPEG (the writer's own encoder, on a temporary file)."""
    from hpctrain.data.shards.encode import encode_image

    with tempfile.NamedTemporaryFile(suffix=".jpg") as f:
        f.write(jpeg)
        f.flush()
        result = encode_image(f.name, max_side, 95, raw=raw)
    if isinstance(result, str):
        raise SystemExit(f"cannot encode a photo: {result}")
    return result[0]


def full_size(height: int, width: int, crop, size) -> tuple[int, int]:
    return height, width


def timed(images: list[bytes], spec: RandomResizedCrop, epoch: int, full: bool) -> float:
    """CPU seconds of this thread to make every image's training sample once."""
    out = np.empty((*spec.size, 3), dtype=np.uint8)
    reduced = decode._min_decoded_size
    if full:
        decode._min_decoded_size = full_size
    try:
        started = time.thread_time()
        for index, data in enumerate(images):
            decode.decode_crop(data, str(index), spec, 0, epoch, index, out)
        return time.thread_time() - started
    finally:
        decode._min_decoded_size = reduced


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=48, help="photos (default 48)")
    parser.add_argument("--size", type=int, default=224, help="training crop side (default 224)")
    parser.add_argument("--max-sides", default="256,320", help="shard --max-side values (default 256,320)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    args = parser.parse_args(argv)
    originals = photos(args.images)
    paths: dict[str, tuple[list[bytes], bool]] = {"full": (originals, True), "draft": (originals, False)}
    for side in (int(s) for s in args.max_sides.split(",") if s):
        paths[f"jpeg {side}"] = ([stored(p, side, raw=False) for p in originals], False)
        paths[f"raw {side}"] = ([stored(p, side, raw=True) for p in originals], False)
    spec = RandomResizedCrop((args.size, args.size))
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    for name, (images, full) in paths.items():
        timed(images, spec, 0, full)  # warm-up: imports, OpenCV's first calls
    for epoch in range(1, args.rounds + 1):
        for name, (images, full) in paths.items():
            seconds[name].append(timed(images, spec, epoch, full))
    import cv2
    import simplejpeg

    print(
        f"# {platform.processor() or platform.machine()}, {_cpu_model()}; Python {platform.python_version()}, "
        f"simplejpeg {simplejpeg.__version__}, OpenCV {cv2.__version__}; {args.images} photos ~500x375, "
        f"RandomResizedCrop {args.size}, one core (thread CPU time), median of {args.rounds} rounds"
    )
    print("| path | images/s per core | vs full decode | bytes per image |\n|---|---:|---:|---:|")
    full_rate = args.images / statistics.median(seconds["full"])
    for name, (images, _) in paths.items():
        rate = args.images / statistics.median(seconds[name])
        print(
            f"| {name} | {rate:,.0f} | {rate / full_rate:.2f}x | {statistics.mean(map(len, images)) / 1024:,.0f} KiB |"
        )
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


if __name__ == "__main__":
    sys.exit(main())
