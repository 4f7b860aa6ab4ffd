"""Training speed on a shared CPU: the fast recipe idle and next to busy processes, side by side.

Shared login nodes and CPU nodes are the norm on clusters: another user's process takes a core while hpctrain
trains with one thread per usable core. torch's CPU kernels split each operation evenly over the threads and wait
for the slowest, so the thread that shares a core with the other program holds up every operation.

Each configuration runs the real CLI (`hpctrain train mnist --dataset fashion-mnist`) in a subprocess and reads
images/s from its run directory's metrics.jsonl, first on the otherwise idle machine, then with N busy-loop
processes (one per --busy) running beside it. Configurations:

  hpctrain default    no thread options: the cores not kept busy by other programs when the run starts (issue 8)
  all cores           --threads CORES: the default before issue 8
  all cores, passive  --threads CORES with OMP_WAIT_POLICY=PASSIVE: OpenMP threads sleep at once instead of spinning
  --threads 1         one thread: nothing to wait for

Prints the machine (CPU model, usable cores, torch, load average) and a markdown table. Timings on a busy machine
are noisy: --repeats N keeps the best of N.

    python benchmarks/cpu_contention.py --data-dir DATA          # DATA/fashion-mnist/*.gz
    python benchmarks/cpu_contention.py --data-dir DATA --busy 1 --busy 2 --train-limit 30000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
CONFIGS: dict[str, tuple[list[str], dict[str, str]]] = {
    "hpctrain default": ([], {}),
    "all cores": (["--threads", str(CORES)], {}),
    "all cores, passive": (["--threads", str(CORES)], {"OMP_WAIT_POLICY": "PASSIVE"}),
    "--threads 1": (["--threads", "1"], {}),
}
# Variables that would change what a configuration means: a configuration sets its own, none is inherited.
OPENMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def busy_loop() -> None:
    while True:
        pass


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def images_per_s(data_dir: Path, options: list[str], env: dict[str, str], train_limit: int) -> float:
    environ = {k: v for k, v in os.environ.items() if k not in OPENMP_VARS}
    environ.update(env)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        command = [
            sys.executable,
            "-m",
            "hpctrain",
            "train",
            "mnist",
            "--dataset",
            "fashion-mnist",
            "--data-dir",
            str(data_dir),
            "--run-dir",
            str(run_dir),
            "--epochs",
            "1",
            "--train-limit",
            str(train_limit),
            "--test-limit",
            "1000",
            "--log-interval",
            "0",
            *options,
        ]
        proc = subprocess.run(command, env=environ, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stderr}")
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
        return float(records[-1]["images_per_s"])


def measure(data_dir: Path, busy: int, configs: list[str], repeats: int, train_limit: int) -> dict[str, float]:
    competitors = [multiprocessing.Process(target=busy_loop, daemon=True) for _ in range(busy)]
    for process in competitors:
        process.start()
    try:
        return {
            name: max(images_per_s(data_dir, *CONFIGS[name], train_limit) for _ in range(repeats)) for name in configs
        }
    finally:
        for process in competitors:
            process.kill()
            process.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="holds fashion-mnist/ (hpctrain download)")
    parser.add_argument(
        "--busy", type=int, action="append", help="busy-loop processes beside the run (repeatable; default: 0 and 1)"
    )
    parser.add_argument("--config", action="append", choices=list(CONFIGS), help="default: all")
    parser.add_argument("--repeats", type=int, default=1, help="keep the best of N runs (default 1)")
    parser.add_argument("--train-limit", type=int, default=20000, help="training images per run (default 20000)")
    args = parser.parse_args()
    busy_counts = args.busy or [0, 1]
    configs = args.config or list(CONFIGS)

    import torch

    print(
        f"cpu: {cpu_model()}; cores usable: {CORES}; torch {torch.__version__} "
        f"({torch.__config__.parallel_info().splitlines()[3].strip()}); python {platform.python_version()}"
    )
    if hasattr(os, "getloadavg"):
        print(f"load average (1 min) at start: {os.getloadavg()[0]:.1f}")
    results = {busy: measure(args.data_dir, busy, configs, args.repeats, args.train_limit) for busy in busy_counts}

    header = "| configuration | " + " | ".join(f"{b} busy process(es)" if b else "idle" for b in busy_counts) + " |"
    print()
    print(header)
    print("|---|" + "---:|" * len(busy_counts))
    for name in configs:
        cells = " | ".join(f"{results[b][name]:,.0f}" for b in busy_counts)
        print(f"| {name} | {cells} |")
    print("\n(training images/s, fast recipe, one process)")


if __name__ == "__main__":
    main()
