"""What rank 0's straggler check, the per-rank lines of `status JOB` / `top JOB` and the preflight judge cost at
1,000 to 8,000 ranks, and how they grow (issue 32).

The inputs are synthetic, in the real formats: progress records as JSON texts read by
hpctrain.health.progress.parse_progress (8 ranks a node, a few of them slow on input or in compute), and preflight
checks of N nodes (the judge's size is its node count), 8 ranks each, whose leaders report their two ring links (a
few nodes slow on every link). Each figure is the median CPU time (process time) of --repeat calls, so a loaded
machine changes it less than a wall time; the fit is the exponent of the growth between the smallest and the
largest size (1: linear, 2: square).

    python benchmarks/scale_health.py                                  # 1,000 / 4,000 / 8,000 ranks
    python benchmarks/scale_health.py --compare OLD/src                # the same beside another source tree
    python benchmarks/scale_health.py --sizes 100,200 --repeat 1       # quick

OLD/src: e.g. `git archive COMMIT src | tar -x -C OLD`. Needs only hpctrain importable (or PYTHONPATH=src).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time

NOW = 1_000_000.0
PER_NODE = 8


def progress_texts(n: int) -> list[str]:
    rnd = random.Random(n)
    texts = []
    for rank in range(n):
        data, compute = 0.002 + rnd.random() * 0.001, 0.02 + rnd.random() * 0.002
        if rank % 997 == 5:
            data *= 30
        elif rank % 991 == 7:
            compute *= 3
        texts.append(
            json.dumps(
                {
                    "rank": rank,
                    "world_size": n,
                    "host": f"gpu{rank // PER_NODE:05d}",
                    "pid": 1000,
                    "phase": "training",
                    "epoch": 1,
                    "step": 500,
                    "step_in_epoch": 500,
                    "steps_per_epoch": 1000,
                    "steps": 50,
                    "step_s": 0.1,
                    "data_s": data,
                    "compute_s": compute,
                    "images_per_s": 640.0,
                    "updated": NOW - 2,
                }
            )
        )
    return texts


def checks_of(n: int) -> list[object]:
    from hpctrain.health.preflight import RankCheck

    rnd = random.Random(n)
    nodes = n
    slow = {i for i in range(nodes) if i % 101 == 3}
    checks = []
    for i in range(nodes):
        links = {
            f"gpu{j % nodes:05d}": (0.5 if i in slow or j % nodes in slow else 10.0) + rnd.random()
            for j in (i + 1, i - 1)
        }
        for k in range(PER_NODE):
            checks.append(
                RankCheck(i * PER_NODE + k, f"gpu{i:05d}", 100.0 + rnd.random(), None, links if k == 0 else {})
            )
    return checks


def measure(sizes: list[int], repeat: int) -> dict[str, dict[int, float]]:
    """{what: {ranks: median CPU seconds}} for this interpreter's hpctrain."""
    from hpctrain.health.preflight import judge, link_pairs
    from hpctrain.health.progress import parse_progress
    from hpctrain.health.stragglers import find_stragglers
    from hpctrain.health.view import rank_lines

    out: dict[str, dict[int, float]] = {}
    for n in sizes:
        records = parse_progress(progress_texts(n))
        checks = checks_of(n)
        nodes = [f"gpu{rank // PER_NODE:05d}" for rank in range(n * PER_NODE)]
        work = {
            "straggler check (rank 0)": lambda: find_stragglers(records, NOW),
            "status/top rank lines": lambda: rank_lines(records, NOW),
            "preflight judge (N nodes)": lambda: judge(checks, 1.0),
            "preflight link pairs (N nodes)": lambda: link_pairs(nodes),
        }
        for what, call in work.items():
            times = []
            for _ in range(repeat):
                start = time.process_time()
                call()
                times.append(time.process_time() - start)
            out.setdefault(what, {})[n] = statistics.median(times)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,4000,8000", help="ranks (nodes for the preflight), comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--compare", metavar="OLD_SRC", help="also measure the hpctrain under this source folder")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a child's answer
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    now = measure(sizes, args.repeat)
    if args.json:
        print(json.dumps(now))
        return 0
    columns = [("now", now)]
    if args.compare:
        env = {**os.environ, "PYTHONPATH": args.compare}
        child = subprocess.run(
            [sys.executable, __file__, "--sizes", args.sizes, "--repeat", str(args.repeat), "--json"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        old = {what: {int(n): s for n, s in by_n.items()} for what, by_n in json.loads(child.stdout).items()}
        columns.insert(0, ("before", old))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; median CPU seconds of {args.repeat}")
    print("| what | " + " | ".join(f"{label} {n:,}" for label, _ in columns for n in sizes) + " | growth |")
    print("|---|" + "---:|" * (len(columns) * len(sizes) + 1))
    for what in now:
        cells = [f"{figures[what][n]:.4f}" for _, figures in columns for n in sizes]
        growth = []
        for label, figures in columns:
            low, high = figures[what][sizes[0]], figures[what][sizes[-1]]
            if low > 0 and high > 0 and sizes[-1] > sizes[0]:
                growth.append(f"{label} N^{math.log(high / low) / math.log(sizes[-1] / sizes[0]):.2f}")
        print(f"| {what} | " + " | ".join(cells) + f" | {', '.join(growth)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
