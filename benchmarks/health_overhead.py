"""What the per-rank health costs a training step (issue 20's target: at most 1% of the fast MNIST recipe's step,
the hardest case, since its steps are the shortest).

Two measurements, side by side in one run:

(a) the whole loop: `hpctrain train mnist` (the fast recipe, one epoch) with the health on, and with
    hpctrain.training.watch.RankWatch replaced by a stand-in that does nothing (patched here, in the child process;
    nothing of this ships). Interleaved repeats; the table compares the median training seconds (epoch_seconds).
(b) the per-step calls alone: the forward-pass hooks around a real forward of the fast recipe's model, the
    watchdog's beat and the progress record's step (its file written every 5 s, as in training), timed over many
    steps against the same forward without them.

    python benchmarks/health_overhead.py --data-dir DATA        # DATA/fashion-mnist/*.gz, as `hpctrain download` leaves it
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(mode: str, argv: list[str]) -> int:
    """In the child: run the CLI, with the health replaced by nothing when mode is "off"."""
    import contextlib

    import hpctrain.training.epoch as epoch
    import hpctrain.training.loop as loop
    from hpctrain.cli import main

    if mode == "off":
        class Nothing:
            reported: list = []

            def __init__(self, *_: object) -> None: ...
            def epoch_started(self, *_: object) -> None: ...
            def step(self, *_: object) -> None: ...
            def take_reported(self) -> list: return []
            def close(self, *_: object) -> None: ...

            @contextlib.contextmanager
            def long_phase(self, *_: object):  # type: ignore[no-untyped-def]
                yield

        loop.RankWatch = Nothing  # type: ignore[assignment,misc]
        epoch.RankWatch = Nothing  # type: ignore[assignment,misc]
    return main(argv)


def whole_loop(args: argparse.Namespace) -> dict[str, list[float]]:
    seconds: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for mode in ("on", "off") if repeat % 2 == 0 else ("off", "on"):
                run_dir = Path(tmp) / f"{mode}-{repeat}"
                argv = ["train", "mnist", "--dataset", args.dataset, "--data-dir", str(args.data_dir), "--epochs", "1",
                        "--run-dir", str(run_dir), "--log-interval", "0", "--sync-checkpoints"]
                result = subprocess.run([sys.executable, __file__, "--child", mode, "--", *argv], capture_output=True,
                                        text=True)
                if result.returncode != 0:
                    raise SystemExit(f"the {mode} run failed:\n{result.stdout}\n{result.stderr}")
                record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
                seconds[mode].append(record["epoch_seconds"])
                print(f"  {mode:3s} run {repeat + 1}: {record['epoch_seconds']:.2f} s, {record['step']} steps, "
                      f"{100 * record['test_accuracy']:.2f}%", flush=True)
    return seconds


def per_step_calls(steps: int) -> dict[str, float]:
    import torch

    from hpctrain.health import ProgressRecorder, Watchdog
    from hpctrain.recipes.mnist import FastNet
    from hpctrain.training.watch import ForwardClock

    model = FastNet().train()
    batch = torch.randn(128, 1, 28, 28)

    def forwards() -> float:
        started = time.perf_counter()
        for _ in range(steps):
            model(batch)
        return time.perf_counter() - started

    with tempfile.TemporaryDirectory() as tmp:
        forwards()  # warm-up
        bare = forwards()
        clock = ForwardClock(model, torch.device("cpu"))
        dog = Watchdog(None, 600.0, lambda *_: None)
        record = ProgressRecorder(Path(tmp), 0, 1, "here", steps)
        started = time.perf_counter()
        for step in range(steps):
            model(batch)
            dog.beat()
            record.step(1, step, step, 128, 0.01, 0.001, clock.read())
        watched = time.perf_counter() - started
        clock.remove()
    return {"bare_ms": 1000 * bare / steps, "watched_ms": 1000 * watched / steps,
            "extra_us": 1e6 * (watched - bare) / steps}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        raise SystemExit(child(sys.argv[2], sys.argv[4:]))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    calls = per_step_calls(args.steps)
    print(f"(b) per step: forward {calls['bare_ms']:.2f} ms bare, {calls['watched_ms']:.2f} ms with hooks + beat + "
          f"record: {calls['extra_us']:+.1f} us per step")
    seconds = whole_loop(args)
    on, off = statistics.median(seconds["on"]), statistics.median(seconds["off"])
    print(f"(a) one fast epoch, median of {args.repeats}: health on {on:.2f} s, off {off:.2f} s, "
          f"on/off = {on / off:.4f}; load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
