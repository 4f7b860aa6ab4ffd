"""The stop vote's cost per training step: the fast MNIST recipe's step with and without the vote, side by side.

hpctrain's training loop votes after every step (`hpctrain.training.stopping.agree`: a one-integer all-reduce over
gloo, also when the job trains over NCCL) so that a signal any rank sees stops every rank after the same step. This
measures what that costs a training step, in one run, interleaved:

    none        no vote: the step alone
    agree       `agree()` after every step: a blocking vote (what the loop did until the vote was overlapped)
    stepvote    `StepVote.after_step()` after every step, as the training loop calls it: a vote every few steps,
                as many as fit in StepVote.PERIOD_S (the ranks agree on the count in each vote)

Two processes on one host. Rank 0 trains the fast recipe's model (FastNet, batch 112, channels_last, bf16 autocast
where the device computes in it, fused SGD with Nesterov momentum) on --device from random images kept on that
device; rank 1 only votes, so rank 0's step is one device's own step and the vote's wait is a gloo round trip
between two processes on one host (between hosts, add the network's round trip). Each block runs --steps steps and
synchronises the device at its end; the table gives the median block's time per step.

    python benchmarks/stop_vote.py --device cuda
    python benchmarks/stop_vote.py --device cpu --steps 50 --blocks 3       # a smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from hpctrain.distributed.ports import free_port

MODES = ("none", "agree", "stepvote")


def rank_main(rank: int, args: argparse.Namespace, port: int, results: object) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # a spawned process starts afresh
    from hpctrain.recipes.mnist import FastNet
    from hpctrain.training.stopping import StepVote, StopReason, agree

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    trains = rank == 0
    if trains:
        device = torch.device(args.device)
        model = FastNet().to(device, memory_format=torch.channels_last)
        fused = {"fused": True} if device.type == "cuda" else {}
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, **fused)
        images = torch.randn(args.steps * 112, 1, 28, 28, device=device).contiguous(memory_format=torch.channels_last)
        labels = torch.randint(0, 10, (args.steps * 112,), device=device)

    def step(i: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        batch = slice(i * 112, (i + 1) * 112)
        loss = torch.nn.functional.cross_entropy(model(images[batch]), labels[batch])
        loss.backward()
        optimizer.step()

    def sync() -> None:
        if trains and args.device == "cuda":
            torch.cuda.synchronize()

    def block(mode: str) -> float:
        dist.barrier()
        sync()
        started = time.perf_counter()
        vote = StepVote()
        for i in range(args.steps):
            if trains:
                step(i)
            if mode == "agree":
                agree(StopReason.NONE)
            elif mode == "stepvote":
                vote.after_step(StopReason.NONE)
        sync()
        return (time.perf_counter() - started) / args.steps

    for mode in MODES:  # warm-up: cuDNN's choices, the allocator, gloo's connections
        block(mode)
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(args.blocks):
        for mode in MODES:
            times[mode].append(block(mode))
    if trains:
        results.put(times)
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    parser.add_argument("--steps", type=int, default=200, help="steps per block (default 200)")
    parser.add_argument("--blocks", type=int, default=7, help="blocks per mode, interleaved (default 7)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device; use --device cpu")
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.start_processes(rank_main, args=(args, free_port(), results), nprocs=2, start_method="spawn")
    times = results.get()
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    base = statistics.median(times["none"])
    print(f"# {name}, torch {torch.__version__}; {args.blocks} blocks of {args.steps} steps per mode, interleaved")
    print("| mode | ms per step (median block) | vs none |\n|---|---:|---:|")
    for mode in MODES:
        per_step = statistics.median(times[mode])
        print(f"| {mode} | {per_step * 1e3:.3f} | {100 * (per_step / base - 1):+.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
