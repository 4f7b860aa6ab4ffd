"""ImageNet training speed on a GPU per data backend: images/s and the fraction of time spent waiting for input.

Each row is a real `hpctrain train imagenet` run (a subprocess, as a user starts it) on the same JPEG folder:
--synthetic (random uint8 batches: the model's own ceiling), then each backend (cpu worker processes, nvjpeg,
dali), for each architecture. A run trains 2 epochs of --steps steps; the row reports the second epoch (the first
pays for cuDNN autotuning and warm-up) from the run's metrics.jsonl: images/s, and data-wait fraction =
data_wait_seconds / epoch_seconds (near 0: the GPU is the limit; large: the input pipeline is).

The fast recipe at a fixed 224-pixel training crop (--image-size 224: no progressive resizing), bf16 autocast and
channels_last on the GPU, global batch --batch-size on one process. Data: --data DIR (DIR/train/<class>/*, and
DIR/val or the training folder reused for the short validation), or --images realistic ~500x375 JPEGs made from
the photographs bundled in scikit-image (tests/image_fixtures.py; needs the dev extra).

    python benchmarks/imagenet_gpu.py                                  # one GPU, 3000 generated JPEGs
    python benchmarks/imagenet_gpu.py --images 1500 --copies 8 --steps 40   # longer epochs, 1500 distinct JPEGs
    python benchmarks/imagenet_gpu.py --data /path/imagenet --workers 16 --steps 100 --archs resnet50
    python benchmarks/imagenet_gpu.py --device cpu --steps 2           # smoke run without a GPU (tiny sizes)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BACKENDS = ("cpu", "nvjpeg", "dali")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="an ImageFolder (DATA/train/<class>/*); default: generated JPEGs")
    parser.add_argument("--images", type=int, help="JPEGs to generate without --data (default 3000; cpu: 64)")
    parser.add_argument(
        "--copies",
        type=int,
        default=1,
        help="hard links of each generated JPEG under other names: a long epoch from few generated "
        "files (each is still read and decoded every time; default 1)",
    )
    parser.add_argument("--archs", help="comma-separated torchvision models (default resnet50,resnet18; cpu: resnet18)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated, of cpu,nvjpeg,dali")
    parser.add_argument("--no-synthetic", action="store_true", help="skip the --synthetic rows")
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: a smoke run with small defaults, to check the script without a GPU",
    )
    parser.add_argument("--batch-size", type=int, help="global batch (default 256; cpu: 8)")
    parser.add_argument("--image-size", type=int, help="training crop side (default 224; cpu: 64)")
    parser.add_argument("--steps", type=int, default=50, help="training steps per epoch (2 epochs per row)")
    parser.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1), help="data workers")
    parser.add_argument("--out", type=Path, help="also append the rows to this JSON-lines file")
    args = parser.parse_args(argv)
    smoke = args.device == "cpu"
    args.images = args.images or (64 if smoke else 3000)
    args.archs = (args.archs or ("resnet18" if smoke else "resnet50,resnet18")).split(",")
    args.batch_size = args.batch_size or (8 if smoke else 256)
    args.image_size = args.image_size or (64 if smoke else 224)
    args.backends = args.backends.split(",")
    unknown = set(args.backends) - set(BACKENDS)
    if unknown:
        parser.error(f"--backends: unknown {', '.join(sorted(unknown))}; choose from {', '.join(BACKENDS)}")
    if args.steps < 1:
        parser.error("--steps: use 1 or more")
    return args


def generate(folder: Path, count: int, copies: int = 1) -> Path:
    """DATA/train/<3 classes>/*.JPEG of realistic photos, each also under `copies - 1` other names (hard links);
    DATA/val is the training folder (validation is short)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from image_fixtures import GRAY_PHOTOS, RGB_PHOTOS, write_photo_jpegs

    classes = [("n01_a", RGB_PHOTOS[:5]), ("n02_b", RGB_PHOTOS[5:]), ("n03_gray", GRAY_PHOTOS[:4] + RGB_PHOTOS[:2])]
    for c, (name, photos) in enumerate(classes):
        for path in write_photo_jpegs(folder / "train" / name, count // len(classes), seed=c, names=photos):
            for copy in range(1, copies):
                os.link(path, path.with_name(f"{path.stem}_copy{copy}{path.suffix}"))
    (folder / "val").symlink_to(folder / "train")
    return folder


def run(args: argparse.Namespace, data: Path | None, arch: str, backend: str | None, run_dir: Path) -> dict:
    """One training run; its second epoch's metrics, or the failure."""
    source = ["--synthetic"] if data is None else [str(data), "--data-backend", backend or "auto"]
    command = [
        sys.executable,
        "-m",
        "hpctrain",
        "train",
        "imagenet",
        *source,
        "--arch",
        arch,
        "--recipe",
        "fast",
        "--image-size",
        str(args.image_size),
        "--val-size",
        str(args.image_size),
        "--batch-size",
        str(args.batch_size),
        "--test-batch-size",
        str(args.batch_size),
        "--train-limit",
        str(args.steps * args.batch_size),
        "--test-limit",
        str(args.batch_size),
        "--epochs",
        "2",
        "--workers",
        str(args.workers),
        "--device",
        args.device,
        "--log-interval",
        "0",
        "--run-dir",
        str(run_dir),
    ]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    row = {
        "arch": arch,
        "backend": backend or "synthetic",
        "device": args.device,
        "batch": args.batch_size,
        "image_size": args.image_size,
        "workers": args.workers,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    chosen = [line for line in result.stdout.splitlines() if "data backend" in line]
    if chosen:
        row["backend_line"] = chosen[0]
    if result.returncode != 0:
        tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or ["?"]
        return {**row, "error": f"exit {result.returncode}: {tail[0]}"}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    last = records[-1]
    return {
        **row,
        "images_per_s": round(last["images_per_s"], 1),
        "epoch_seconds": round(last["epoch_seconds"], 2),
        "data_wait_fraction": round(last["data_wait_seconds"] / max(last["epoch_seconds"], 1e-9), 3),
    }


def gpu_name(device: str) -> str:
    if device != "cuda":
        return "cpu (smoke run)"
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device visible"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(
        f"# {gpu_name(args.device)}; batch {args.batch_size}, {args.image_size} px, {args.workers} data workers, "
        f"{args.steps} steps/epoch, second epoch of 2",
        flush=True,
    )
    print("| arch | input | images/s | data-wait fraction | epoch s |\n|---|---|---:|---:|---:|", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="imagenet-gpu-") as scratch:
        data = args.data or generate(Path(scratch) / "data", args.images, args.copies)
        for arch in args.archs:
            inputs: list[tuple[Path | None, str | None]] = [] if args.no_synthetic else [(None, None)]
            inputs += [(data, backend) for backend in args.backends]
            for n, (folder, backend) in enumerate(inputs):
                row = run(args, folder, arch, backend, Path(scratch) / f"run-{arch}-{n}")
                rows.append(row)
                if "error" in row:
                    print(f"| {arch} | {row['backend']} | failed: {row['error']} | | |", flush=True)
                else:
                    print(
                        f"| {arch} | {row['backend']} | {row['images_per_s']:,.0f} | {row['data_wait_fraction']:.2f} "
                        f"| {row['epoch_seconds']:.1f} |",
                        flush=True,
                    )
    if args.out:
        with args.out.open("a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
