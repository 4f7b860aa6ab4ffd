"""MNIST/Fashion-MNIST speed, side by side in one run, on the same data files:

(a) the pytorch/examples MNIST tutorial's training loop: torchvision dataset with per-sample ToTensor + Normalize,
    a default DataLoader (batch 64), its CNN, Adadelta lr 1.0;
(b) `hpctrain train mnist --recipe classic`: the same model and hyperparameters, training images/s;
(c) `hpctrain train mnist` (the fast recipe): training seconds to 90% and 92% test accuracy.

(b) and (c) run the real CLI in a subprocess and read its run directory's metrics.jsonl; "training seconds"
exclude evaluation, checkpoints and start-up, as epoch_seconds does (and include everything in the step loop: the
first steps' set-up, and compilation if a recipe ever compiles). Prints the machine, a markdown table and (with
--json) the raw figures. Each part runs --repeats times, interleaved; the table shows medians. The headline is
time to 90% against the tutorial: the tutorial needs --tutorial-epochs-to-90 epochs (2 on Fashion-MNIST) at its
measured images/s; the fast recipe's time is its own full 1-epoch schedule (never a run stopped at the target).
On a shared machine only these side-by-side ratios mean anything: the load average is printed at start and end.

    python benchmarks/mnist_speed.py --data-dir DATA  # DATA/fashion-mnist/*.gz, as `hpctrain download` leaves it
    python benchmarks/mnist_speed.py --data-dir DATA --device cuda
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F


class TutorialNet(nn.Module):
    """pytorch/examples mnist/main.py's Net, as the tutorial writes it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def machine(device: str) -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = {
        "cpu": cpu,
        "cores usable": str(cores),
        "torch": torch.__version__,
        "torch threads": str(torch.get_num_threads()),
        "python": platform.python_version(),
    }
    if hasattr(os, "getloadavg"):
        info["load average (1 min) at start"] = f"{os.getloadavg()[0]:.1f}"
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = str(torch.version.cuda)
    from hpctrain.training.precision import precision_for

    info["fast recipe computes in"] = precision_for(torch.device(device)).why
    return info


def raw_copy(dataset: str, data_dir: Path, into: Path) -> Path:
    """Decompress the IDX files into the ROOT/<Folder>/raw/ layout torchvision's MNIST classes read."""
    from hpctrain.data import find_dataset_files, get_dataset_spec

    spec = get_dataset_spec(dataset)
    raw = into / spec.torchvision_folder / "raw"
    raw.mkdir(parents=True)
    for role, path in find_dataset_files(spec, data_dir).items():
        opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
        with opener(path, "rb") as src, open(raw / spec.files[role].name, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return into


def tutorial_images_per_s(
    dataset: str, data_dir: Path, device: str, images: int, seed: int, threads: int | None = None
) -> float:
    """The tutorial's train() over `images` images (one epoch by default), timed from the first batch request.
    `threads`: torch threads for it (None: torch's default, all cores, as the tutorial runs)."""
    default_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _tutorial_epoch(dataset, data_dir, device, images, seed)
    finally:
        torch.set_num_threads(default_threads)


def _tutorial_epoch(dataset: str, data_dir: Path, device: str, images: int, seed: int) -> float:
    from torchvision import datasets, transforms

    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as tmp:
        root = raw_copy(dataset, data_dir, Path(tmp))
        cls = datasets.FashionMNIST if dataset == "fashion-mnist" else datasets.MNIST
        transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
        train_set = cls(str(root), train=True, download=False, transform=transform)
        kwargs: dict = {"batch_size": 64, "shuffle": True}
        if device == "cuda":  # what the tutorial adds on an accelerator
            kwargs.update(num_workers=1, persistent_workers=True, pin_memory=True)
        loader = torch.utils.data.DataLoader(train_set, **kwargs)
        model = TutorialNet().to(device)
        optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
        model.train()
        seen = 0
        start = time.perf_counter()
        for batch_idx, (data, target) in enumerate(loader):
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % 10 == 0:  # the tutorial's log_interval: a host sync every 10 batches
                loss.item()
            seen += len(target)
            if seen >= images:
                break
        if device == "cuda":
            torch.cuda.synchronize()
        return seen / (time.perf_counter() - start)


def hpctrain_run(args: argparse.Namespace, run_dir: Path, recipe: str, epochs: int, extra: list[str]) -> list[dict]:
    """One `hpctrain train mnist` run in a subprocess; returns its metrics.jsonl records."""
    cmd = [
        sys.executable, "-m", "hpctrain", "train", "mnist",
        "--dataset", args.dataset, "--data-dir", str(args.data_dir), "--run-dir", str(run_dir),
        "--recipe", recipe, "--epochs", str(epochs), "--device", args.device, "--seed", str(args.seed),
        "--log-interval", "3600", *extra,
    ]  # fmt: skip
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"benchmark run failed ({' '.join(cmd)}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def time_to(points: list[tuple[float, float]], target: float) -> float | None:
    """Least training seconds at which an evaluation reached `target` accuracy, over every run's epochs."""
    reached = [seconds for seconds, acc in points if acc >= target]
    return min(reached) if reached else None


def median(values: list[float]) -> float:
    """The middle value (the mean of the middle two for an even count)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def spread(values: list[float], fmt: str) -> str:
    """'median (min-max)' of the values, each formatted with `fmt`."""
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(median(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True, help="holds fashion-mnist/ (or mnist/)")
    parser.add_argument("--dataset", default="fashion-mnist", choices=["fashion-mnist", "mnist"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--images", type=int, default=60_000, help="training images timed for (a) and (b) (default: one full epoch)"
    )
    parser.add_argument(
        "--fast-epochs",
        default="1,5",
        help="epoch counts to run the fast recipe for, each a full schedule (default: 1,5: "
        "one epoch is the recipe's default, about five reach 92%%)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="run (a), (b), (c) this many times, interleaved; the table shows the median of each, with the range",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch threads for every part (default: each one's own default: "
        "torch's, all cores, for the tutorial; hpctrain's, the cores no other program keeps busy)",
    )
    parser.add_argument(
        "--tutorial-epochs-to-90",
        type=int,
        default=2,
        help="epochs the tutorial recipe needs for 90%% test accuracy (default: 2, Fashion-MNIST)",
    )
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: tutorial,classic,fast")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    args = parser.parse_args()
    skip = {part for part in args.skip.split(",") if part}
    fast_epochs = [int(e) for e in args.fast_epochs.split(",") if e]
    limit = [] if args.images >= 60_000 else ["--train-limit", str(args.images)]

    info = machine(args.device)
    print("## Machine\n")
    for key, value in info.items():
        print(f"- {key}: {value}")
    print(flush=True)

    results: dict = {"machine": info, "tutorial": [], "classic": [], "fast": {e: [] for e in fast_epochs}}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            if "tutorial" not in skip:
                ips = tutorial_images_per_s(
                    args.dataset, args.data_dir, args.device, args.images, args.seed, args.threads
                )
                results["tutorial"].append(ips)
                print(f"[{repeat + 1}] tutorial loop: {ips:,.0f} images/s", flush=True)
            if "classic" not in skip:
                run_dir = Path(tmp) / f"classic-{repeat}"
                record = hpctrain_run(args, run_dir, "classic", 1, [*limit, "--test-limit", "1000"])[-1]
                results["classic"].append(record["images_per_s"])
                print(f"[{repeat + 1}] hpctrain --recipe classic: {record['images_per_s']:,.0f} images/s", flush=True)
            if "fast" not in skip:
                for epochs in fast_epochs:
                    records = hpctrain_run(args, Path(tmp) / f"fast-{epochs}-{repeat}", "fast", epochs, [])
                    seconds, points = 0.0, []
                    for record in records:
                        seconds += record["epoch_seconds"]
                        points.append((seconds, record["test_accuracy"]))
                    results["fast"][epochs].append(points)
                    print(
                        f"[{repeat + 1}] hpctrain fast, {epochs} epoch(s): {seconds:.2f} s training, "
                        f"test accuracy {100 * points[-1][1]:.2f}%",
                        flush=True,
                    )

    if hasattr(os, "getloadavg"):
        info["load average (1 min) at end"] = f"{os.getloadavg()[0]:.1f}"
        print(f"- load average (1 min) at end: {info['load average (1 min) at end']}")
    print_results(args, results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def print_results(args: argparse.Namespace, results: dict) -> None:
    """The markdown table: medians over the repeats (with the range), and time to 90% against the tutorial."""
    print("\n## Results\n")
    print(f"Medians of {args.repeats} interleaved repeat(s), range in brackets.\n")
    print("| what | training images/s | training seconds | test accuracy | vs tutorial loop |")
    print("|---|---:|---:|---:|---:|")
    tutorial = median(results["tutorial"]) if results["tutorial"] else None
    if tutorial:
        print(
            "| (a) tutorial loop (DataLoader, per-sample transforms), batch 64 | "
            f"{spread(results['tutorial'], ',.0f')} | "
            f"{60_000 / tutorial:.1f} per epoch | | 1.00x |"
        )
    if results["classic"]:
        classic = median(results["classic"])
        ratio = f"{classic / tutorial:.2f}x" if tutorial else ""
        print(
            "| (b) hpctrain --recipe classic (same model, Adadelta, batch 64) | "
            f"{spread(results['classic'], ',.0f')} | "
            f"{60_000 / classic:.1f} per epoch | | {ratio} |"
        )
    from hpctrain.recipes.mnist import RECIPES

    fast_batch = RECIPES["fast"].defaults.batch_size
    all_points = []
    for epochs, runs in results["fast"].items():
        if not runs:
            continue
        all_points += [point for points in runs for point in points]
        seconds = [points[-1][0] for points in runs]
        accuracy = [100 * points[-1][1] for points in runs]
        ips = [60_000 * epochs / s for s in seconds]
        print(
            f"| (c) hpctrain fast, {epochs} epoch(s), batch {fast_batch} | {spread(ips, ',.0f')} | "
            f"{spread(seconds, '.2f')} | {spread(accuracy, '.2f')}% | |"
        )
    for target in (0.90, 0.92):
        if all_points:
            seconds = time_to(all_points, target)
            shown = f"{seconds:.2f}" if seconds is not None else f"not reached in {args.fast_epochs} epochs"
            print(f"| (c) fast: least training seconds to {100 * target:.0f}% test accuracy, any run | | {shown} | | |")
    one_epoch = results["fast"].get(1) or []
    if tutorial and one_epoch:
        tutorial_seconds = args.tutorial_epochs_to_90 * 60_000 / tutorial
        fast_seconds = median([points[-1][0] for points in one_epoch])
        accuracy = median([points[-1][1] for points in one_epoch])
        print(
            f"\n**Time to 90%**: tutorial {args.tutorial_epochs_to_90} epochs at its median images/s = "
            f"{tutorial_seconds:.1f} s; fast recipe, its 1-epoch schedule (median accuracy {100 * accuracy:.2f}%) = "
            f"{fast_seconds:.2f} s: **{tutorial_seconds / fast_seconds:.1f}x shorter**"
            + ("" if accuracy >= 0.90 else " (but its median accuracy is below 90%)")
        )


if __name__ == "__main__":
    main()
