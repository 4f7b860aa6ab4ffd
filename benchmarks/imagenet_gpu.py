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

Input paths besides the backends (issue 43), each a row, all from the same files: `full` (the cpu backend with
reduced-size decoding turned off in this benchmark's process: every JPEG decoded at full size, the baseline that
`draft` decoding beats), `raw` (the cpu backend on `hpctrain prepare --format raw --max-side --raw-max-side`
shards: nothing left to decode; the preparation's time and bytes per image are printed) and `torchvision`
(torchvision's ImageFolder + RandomResizedCrop/flip/ToTensor/Normalize + DataLoader with the same workers and
pinned memory, the same model, bf16 autocast, channels_last and SGD step, timed the same way: the anchor).

    python benchmarks/imagenet_gpu.py --backends cpu,full,raw,nvjpeg,torchvision
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

BACKENDS = ("cpu", "nvjpeg", "dali", "full", "raw", "torchvision")


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
    parser.add_argument(
        "--backends",
        default="cpu,nvjpeg,dali",
        help=f"comma-separated, of {','.join(BACKENDS)} (default cpu,nvjpeg,dali)",
    )
    parser.add_argument("--raw-max-side", type=int, default=256, help="the raw shards' --max-side (default 256)")
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
    parser.add_argument(
        "--keep-data",
        type=Path,
        metavar="DIR",
        help="keep the generated JPEGs and raw shards in DIR and reuse them in a later run with the same sizes",
    )
    parser.add_argument("--torchvision-loop", type=Path, help=argparse.SUPPRESS)  # one torchvision row (internal)
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


# The cpu backend with reduced-size decoding turned off (a benchmark's baseline, never a product option): every JPEG
# decoded at full size, in the training process and the data workers it forks.
FULL_DECODE = (
    "import sys, hpctrain.data.decode as d; d._min_decoded_size = lambda height, width, crop, size: (height, width); "
    "from hpctrain.cli import main; sys.exit(main())"
)


def run(args: argparse.Namespace, data: Path | None, arch: str, backend: str | None, run_dir: Path) -> dict:
    """One training run; its second epoch's metrics, or the failure."""
    if backend == "torchvision":
        return torchvision_run(args, data, arch)
    cli = ["-c", FULL_DECODE] if backend == "full" else ["-m", "hpctrain"]
    data_backend = "cpu" if backend in ("full", "raw") else backend or "auto"
    source = ["--synthetic"] if data is None else [str(data), "--data-backend", data_backend]
    command = [
        sys.executable,
        *cli,
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


def prepare_raw(args: argparse.Namespace, data: Path, out: Path) -> Path:
    """`hpctrain prepare --format raw` of `data` into `out` (once per benchmark run), said with its time and size."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "hpctrain", "prepare", "imagenet", str(data), str(out), "--format", "raw"]
    command += ["--max-side", str(args.raw_max_side), "-j", str(args.workers)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"prepare --format raw failed: {result.stderr.strip()[-500:]}")
    lines = [line for line in result.stdout.splitlines() if line.startswith("train:")]
    print(
        f"# raw shards (--max-side {args.raw_max_side}): {lines[0] if lines else '?'}; "
        f"prepared in {time.perf_counter() - started:.1f} s",
        flush=True,
    )
    return out


def torchvision_run(args: argparse.Namespace, data: Path, arch: str) -> dict:
    """The anchor: torchvision's ImageFolder + classic transforms + DataLoader feeding the same model and step (in
    a subprocess of its own, as the hpctrain rows are)."""
    command = [sys.executable, __file__, "--torchvision-loop", str(data), "--archs", arch, "--device", args.device]
    command += ["--batch-size", str(args.batch_size), "--image-size", str(args.image_size), "--steps", str(args.steps)]
    command += ["--workers", str(args.workers)]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    row = {
        "arch": arch,
        "backend": "torchvision",
        "device": args.device,
        "batch": args.batch_size,
        "image_size": args.image_size,
        "workers": args.workers,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    if result.returncode != 0:
        tail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or ["?"]
        return {**row, "error": f"exit {result.returncode}: {tail[0]}"}
    return {**row, **json.loads(result.stdout.strip().splitlines()[-1])}


def torchvision_loop(args: argparse.Namespace) -> int:
    """Train `--steps` steps twice (the second timed) from torchvision's pipeline; print one JSON line."""
    import torch
    import torchvision
    from torchvision import transforms as T

    device = torch.device(args.device)
    tf = T.Compose(
        [
            T.RandomResizedCrop(args.image_size),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    dataset = torchvision.datasets.ImageFolder(str(args.torchvision_loop / "train"), tf)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
        drop_last=True,
        persistent_workers=args.workers > 0,
    )
    model = getattr(torchvision.models, args.archs[0])(num_classes=len(dataset.classes))
    model = model.to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-5)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    def epoch() -> tuple[int, float, float]:
        images_done, wait = 0, 0.0
        started = time.perf_counter()
        batches = iter(loader)
        for _ in range(args.steps):
            waited = time.perf_counter()
            try:
                images, labels = next(batches)
            except StopIteration:
                batches = iter(loader)
                images, labels = next(batches)
            images = images.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
            labels = labels.to(device, non_blocking=True)
            wait += time.perf_counter() - waited
            with autocast:
                loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            images_done += len(labels)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return images_done, time.perf_counter() - started, wait

    epoch()
    done, seconds, wait = epoch()
    print(
        json.dumps(
            {
                "images_per_s": round(done / seconds, 1),
                "epoch_seconds": round(seconds, 2),
                "data_wait_fraction": round(wait / seconds, 3),
            }
        )
    )
    return 0


def gpu_name(device: str) -> str:
    if device != "cuda":
        return "cpu (smoke run)"
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device visible"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.torchvision_loop:
        return torchvision_loop(args)
    print(
        f"# {gpu_name(args.device)}; batch {args.batch_size}, {args.image_size} px, {args.workers} data workers, "
        f"{args.steps} steps/epoch, second epoch of 2",
        flush=True,
    )
    print("| arch | input | images/s | data-wait fraction | epoch s |\n|---|---|---:|---:|---:|", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="imagenet-gpu-") as scratch:
        kept = args.keep_data / f"data-{args.images}x{args.copies}" if args.keep_data else None
        if kept is not None and (kept / "train").is_dir():
            data = kept  # made by an earlier run with --keep-data
        else:
            data = args.data or generate(kept or Path(scratch) / "data", args.images, args.copies)
        for arch in args.archs:
            inputs: list[tuple[Path | None, str | None]] = [] if args.no_synthetic else [(None, None)]
            raw = (args.keep_data or Path(scratch)) / f"raw-{args.images}x{args.copies}-{args.raw_max_side}"
            if "raw" in args.backends and not raw.exists():
                prepare_raw(args, data, raw)
            inputs += [(raw if backend == "raw" else data, backend) for backend in args.backends]
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
