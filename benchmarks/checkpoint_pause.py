"""Training pause per checkpoint: synchronous `checkpoint.save` vs `AsyncCheckpointer`.

Two states: the MNIST tutorial CNN with its Adadelta state (~5 MB), and ResNet-50 (torchvision's architecture,
randomly initialised: the same tensors as its pretrained weights) with SGD momentum (~200 MB). Each run trains
for real (random inputs: the data does not matter here) and checkpoints every --steps-between steps, so the
background write competes with training for CPU and memory bandwidth as it would in a job.

Figures per checkpoint:
  pause     how long the training loop is blocked in the save call (async: waiting for the previous write,
            if any, plus copying the state off the device)
  waited    async saves that found the previous write still running (then the pause includes its rest)
  overhead  (run time - the same run without checkpoints) / checkpoints: what a checkpoint really costs,
            including any slowdown of the steps that overlap a background write

    python benchmarks/checkpoint_pause.py                      # both states, a temporary directory
    python benchmarks/checkpoint_pause.py --dir /scratch/me    # the filesystem your jobs checkpoint to
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from hpctrain import checkpoint


@dataclass
class Workload:
    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    inputs: torch.Tensor
    targets: torch.Tensor

    def step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(self.model(self.inputs), self.targets).backward()
        self.optimizer.step()

    def state(self, step: int) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": step}


def mnist(device: torch.device) -> Workload:
    from hpctrain.recipes.mnist import TutorialNet

    model = TutorialNet().to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    return Workload(
        "MNIST classic CNN + Adadelta",
        model,
        optimizer,
        torch.randn(64, 1, 28, 28, device=device),
        torch.randint(0, 10, (64,), device=device),
    )


def resnet50(device: torch.device) -> Workload:
    import torchvision

    model = torchvision.models.resnet50(weights=None).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    # Small images keep a CPU step short; the checkpoint is the same size at any resolution.
    size, batch = (224, 64) if device.type == "cuda" else (64, 4)
    return Workload(
        "ResNet-50 + SGD momentum",
        model,
        optimizer,
        torch.randn(batch, 3, size, size, device=device),
        torch.randint(0, 1000, (batch,), device=device),
    )


WORKLOADS = {"mnist": mnist, "resnet50": resnet50}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(
    work: Workload, mode: str, directory: Path, checkpoints: int, steps_between: int, device: torch.device
) -> tuple[float, list[float], int]:
    """Train checkpoints * steps_between steps, checkpointing after every steps_between (none for "none").
    Returns the wall time, the pause of each checkpoint, and how many saves waited for the previous write."""
    writer = checkpoint.AsyncCheckpointer() if mode == "async" else None
    pauses: list[float] = []
    waited = 0
    synchronize(device)
    started = time.perf_counter()
    step = 0
    for _ in range(checkpoints):
        for _ in range(steps_between):
            work.step()
            step += 1
        if mode == "none":
            continue
        synchronize(device)  # the pause starts when training would otherwise go on
        before = time.perf_counter()
        name = checkpoint.checkpoint_name(0, step, False)
        if writer is None:
            checkpoint.save(work.state(step), directory, name, epoch=0, step=step, keep=2)
        else:
            waited += writer._future is not None and not writer._future.done()  # the previous write still runs
            writer.save(work.state(step), directory, name, epoch=0, step=step, keep=2)
        pauses.append(time.perf_counter() - before)
    if writer is not None:
        writer.close()  # the last write belongs to the run's cost
    synchronize(device)
    return time.perf_counter() - started, pauses, waited


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="mnist,resnet50", help="comma-separated: " + ", ".join(WORKLOADS))
    parser.add_argument("--dir", type=Path, default=None, help="where to write checkpoints (default: a temp dir)")
    parser.add_argument("--checkpoints", type=int, default=8, help="checkpoints per run (default: 8)")
    parser.add_argument(
        "--steps-between",
        type=int,
        default=None,
        help="training steps between checkpoints (default: 20 for mnist, 4 for resnet50)",
    )
    parser.add_argument("--repeats", type=int, default=2, help="runs per mode, interleaved (default: 2)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {', '.join(WORKLOADS)}")

    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="checkpoint-pause-") as tmp:
        for name in names:
            work = WORKLOADS[name](device)
            steps_between = args.steps_between or {"mnist": 20, "resnet50": 4}[name]
            for _ in range(2 * steps_between):
                work.step()  # warm up, and create the optimizer state that a checkpoint holds
            size = checkpoint.save(work.state(0), Path(tmp) / name, "checkpoint_step_0.pt", epoch=0, step=0)
            megabytes = size.stat().st_size / 1e6
            times: dict[str, list[float]] = {"none": [], "sync": [], "async": []}
            pauses: dict[str, list[float]] = {"sync": [], "async": []}
            waited = 0
            for repeat in range(args.repeats):
                for mode in ("none", "sync", "async"):  # interleaved, so drifting machine load hits all three
                    wall, mode_pauses, mode_waited = run(
                        work, mode, Path(tmp) / name, args.checkpoints, steps_between, device
                    )
                    waited += mode_waited
                    times[mode].append(wall)
                    if mode != "none":
                        pauses[mode].extend(mode_pauses)
                    print(f"{name} {mode} repeat {repeat + 1}: {wall:.2f} s", file=sys.stderr, flush=True)
            baseline = statistics.median(times["none"])
            for mode in ("sync", "async"):
                overhead = (statistics.median(times[mode]) - baseline) / args.checkpoints
                rows.append(
                    (
                        work.name,
                        megabytes,
                        mode,
                        statistics.median(pauses[mode]),
                        max(pauses[mode]),
                        f"{waited}/{len(pauses[mode])}" if mode == "async" else "-",
                        overhead,
                        baseline / (args.checkpoints * steps_between),
                    )
                )
            del work

    print(
        f"\nCheckpoint pause on {device.type} ({torch.get_num_threads()} threads, torch {torch.__version__}), "
        f"{args.checkpoints} checkpoints x {args.repeats} runs per mode\n"
    )
    print("| state | size | mode | pause, median | pause, max | waited | overhead per checkpoint | step time |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for state, megabytes, mode, median, worst, waited, overhead, step_time in rows:
        print(
            f"| {state} | {megabytes:.1f} MB | {mode} | {median * 1e3:.1f} ms | {worst * 1e3:.1f} ms | {waited} | "
            f"{overhead * 1e3:.0f} ms | {step_time * 1e3:.0f} ms |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
