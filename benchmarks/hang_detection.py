"""Hang detection, measured: N injected hangs on random ranks of an `hpctrain train mnist` job under torchrun (gloo,
CPU). Each run trains with --hang-timeout T; after a random number of steps one random rank is stopped with SIGSTOP
(alive and silent). Recorded per run: which rank the report names as the culprit (right or wrong), and the seconds
from the SIGSTOP to the report's culprit line (the limit T, up to a second of the watchdog's polling, and the
report's grace for the other ranks' watchdogs). --device cuda: the ranks train on their GPUs over NCCL, and the
stopped rank leaves the others inside an NCCL all-reduce (the hang NCCL's own timeout would take minutes to see).

    python benchmarks/hang_detection.py --data-dir DATA --runs 10 --nproc 3
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpctrain.health import read_progress


def one(args: argparse.Namespace, run_dir: Path, victim: int, after_steps: int) -> tuple[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(args.nproc),
        "--max-restarts",
        "0",
        "-m",
        "hpctrain",
        "train",
        "mnist",
        "--recipe",
        "classic",
        "--dataset",
        "fashion-mnist",
        "--data-dir",
        str(args.data_dir),
        "--train-limit",
        "30000",
        "--threads",
        "1",
        "--batch-size",
        str(32 * args.nproc),
        "--log-interval",
        "0",
        "--run-dir",
        str(run_dir),
        "--hang-timeout",
        str(args.hang_timeout),
        "--device",
        args.device,
    ]
    process = subprocess.Popen(
        command, env={**env, "PYTHONUNBUFFERED": "1"}, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    stopped_at, pid, culprit, seen = None, None, "", []
    try:
        for line in process.stdout:
            seen.append(line)
            if stopped_at is None and f"step {after_steps}/" in line:
                pid = next(r.pid for r in read_progress(run_dir) if r.rank == victim)
                os.kill(pid, signal.SIGSTOP)
                stopped_at = time.monotonic()
            if "hpctrain: culprit:" in line:
                culprit = line.split("culprit:", 1)[1].strip()
                break
        if stopped_at is None or not culprit:
            raise SystemExit("the run ended before the hang was injected or reported:\n" + "".join(seen[-30:]))
        latency = time.monotonic() - stopped_at
    finally:
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        process.kill()
        process.wait()
    return culprit, latency


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--hang-timeout", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="cuda: one GPU per rank, NCCL (needs --nproc GPUs)"
    )
    args = parser.parse_args()
    pick = random.Random(args.seed)
    host = socket.gethostname()
    right, latencies = 0, []
    print(f"{args.runs} hangs, {args.nproc} ranks, --hang-timeout {args.hang_timeout:g}; load {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.runs):
            victim, after = pick.randrange(args.nproc), pick.randrange(3, 40)
            culprit, latency = one(args, Path(tmp) / f"run{n}", victim, after)
            ok = culprit.startswith(f"rank {victim} on {host} never arrived")
            right += ok
            latencies.append(latency)
            print(
                f"  run {n + 1}: stopped rank {victim} after step {after}; reported in {latency:.1f} s: "
                f"{'right' if ok else 'WRONG'}: {culprit}",
                flush=True,
            )
    print(
        f"culprit right in {right} of {args.runs}; detection {statistics.median(latencies):.1f} s median, "
        f"{max(latencies):.1f} s max (limit {args.hang_timeout:g} s); load {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
