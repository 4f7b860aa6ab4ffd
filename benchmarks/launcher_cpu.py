"""What `hpctrain train --nproc N` costs in CPU seconds, every process of the run counted: the launcher, the fork
server that imports torch once for the workers, the workers, their data workers. The launcher does not wait for the
fork server (it outlives the launcher by a moment), so a plain `time` or getrusage misses the workers; here the
measuring process is the run's subreaper (PR_SET_CHILD_SUBREAPER): every orphan comes back to it and is reaped, so
its children's rusage holds them all.

    python benchmarks/launcher_cpu.py --data-dir /usr/share/datasets/fashion-mnist
    python benchmarks/launcher_cpu.py --data-dir DIR --compare OLD_CHECKOUT/src   # before and after, alternating

Each run trains one mnist epoch on --train-limit images with --nproc N (gloo on the CPU, one thread a process); the
figure is the median over --repeat runs. With --compare the two sources alternate, run by run, so that a load that
comes and goes hits both alike. Linux only.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
SRC = Path(__file__).resolve().parents[1] / "src"


def run_cpu(src: Path, data_dir: str, nproc: int, train_limit: int) -> float:
    """CPU seconds of one run, all its processes included."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "hpctrain", "train", "mnist", "--dataset", "fashion-mnist", "--data-dir"]
        argv += [data_dir, "--train-limit", str(train_limit), "--test-limit", "500", "--threads", "1"]
        argv += ["--log-interval", "0", "--epochs", "1", "--nproc", str(nproc), "--run-dir", str(Path(tmp) / "run")]
        env = {**os.environ, "PYTHONPATH": str(src)}
        result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise SystemExit(f"the run failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
        while True:  # the orphans (the fork server, then its workers) come back here: reap them all
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", required=True, help="the Fashion-MNIST files (Debian: dataset-fashion-mnist)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--train-limit", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--compare", type=Path, help="another checkout's src, run alternately with this one")
    args = parser.parse_args()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("cannot become the runs' subreaper (Linux only)")
    sources = {"this": SRC, **({"compare": args.compare} if args.compare else {})}
    seconds: dict[str, list[float]] = {name: [] for name in sources}
    for _ in range(args.repeat):
        for name, src in sources.items():
            seconds[name].append(run_cpu(src, args.data_dir, args.nproc, args.train_limit))
    print(f"one mnist epoch, {args.train_limit} images, --nproc {args.nproc}: CPU seconds, all processes")
    for name, values in seconds.items():
        runs = ", ".join(f"{v:.2f}" for v in values)
        print(f"| {name} ({sources[name]}) | median {statistics.median(values):.2f} s | runs {runs} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
