"""What the per-rank health costs a training step (issue 20's target: at most 1% of the fast MNIST recipe's step,
the hardest case, since its steps are the shortest).

Two measurements, side by side in one run:

(a) the whole loop: `hpctrain train mnist` (the fast recipe, one epoch) with the health on, and with
    hpctrain.training.watch.RankWatch replaced by a stand-in that does nothing (patched here, in the child process;
    nothing of this ships). Interleaved repeats; the table compares the median training seconds (epoch_seconds).
(b) the per-step calls alone: the forward-pass hooks (around an identity module's forward, so that no model hides
    them), the watchdog's beat and the progress record's step (its file written every 5 s, as in training), timed
    over many steps against the same forward without them, as a share of the fast recipe's step from (a).

    python benchmarks/health_overhead.py --data-dir DATA  # DATA/fashion-mnist/*.gz, as `hpctrain download` leaves it
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
            def take_reported(self) -> list:
                return []

            def close(self, *_: object) -> None: ...

            @contextlib.contextmanager
            def long_phase(self, *_: object):
                yield

        loop.RankWatch = Nothing
        epoch.RankWatch = Nothing
    return main(argv)


def whole_loop(args: argparse.Namespace) -> dict[str, list[float]]:
    seconds: dict[str, list[float]] = {"on": [], "off": [], "steps": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for mode in ("on", "off") if repeat % 2 == 0 else ("off", "on"):
                run_dir = Path(tmp) / f"{mode}-{repeat}"
                argv = [
                    "train",
                    "mnist",
                    "--dataset",
                    args.dataset,
                    "--data-dir",
                    str(args.data_dir),
                    "--epochs",
                    "1",
                    "--run-dir",
                    str(run_dir),
                    "--log-interval",
                    "0",
                    "--sync-checkpoints",
                ]
                result = subprocess.run(
                    [sys.executable, __file__, "--child", mode, "--", *argv], capture_output=True, text=True
                )
                if result.returncode != 0:
                    raise SystemExit(f"the {mode} run failed:\n{result.stdout}\n{result.stderr}")
                record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
                seconds[mode].append(record["epoch_seconds"])
                seconds["steps"].append(record["step"])
                print(
                    f"  {mode:3s} run {repeat + 1}: {record['epoch_seconds']:.2f} s, {record['step']} steps, "
                    f"{100 * record['test_accuracy']:.2f}%",
                    flush=True,
                )
    return seconds


def per_step_calls(steps: int) -> dict[str, float]:
    """The health's own cost per step, without a model to hide in: a forward of an identity module with and
    without the forward-pass hooks, the watchdog's beat and the progress record's step (written every 5 s)."""
    import torch

    from hpctrain.health import ProgressRecorder, Watchdog
    from hpctrain.training.watch import ForwardClock

    module, batch = torch.nn.Identity(), torch.zeros(1)

    def timed(body) -> float:
        body(steps // 10)  # warm-up
        started = time.perf_counter()
        body(steps)
        return (time.perf_counter() - started) / steps

    def bare(n: int) -> None:
        for _ in range(n):
            module(batch)

    with tempfile.TemporaryDirectory() as tmp:
        clock = ForwardClock(module, torch.device("cpu"))
        dog = Watchdog(None, 600.0, lambda *_: None)
        record = ProgressRecorder(Path(tmp), 0, 1, "here", steps)

        def watched(n: int) -> None:
            for step in range(n):
                module(batch)
                dog.beat()
                record.step(1, step, step, 128, 0.01, 0.001, clock.read())

        watched_s = timed(watched)
        clock.remove()
        bare_s = timed(bare)
    return {"extra_us": 1e6 * (watched_s - bare_s), "bare_us": 1e6 * bare_s}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        raise SystemExit(child(sys.argv[2], sys.argv[4:]))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20000, help="(b): calls timed")
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    calls = per_step_calls(args.steps)
    seconds = whole_loop(args)
    on, off = statistics.median(seconds["on"]), statistics.median(seconds["off"])
    print(
        f"(a) one fast epoch, median of {args.repeats}: health on {on:.2f} s, off {off:.2f} s, "
        f"on/off = {on / off:.4f}; load {os.getloadavg()[0]:.2f}"
    )
    step_ms = 1000 * off / seconds["steps"][0]
    print(
        f"(b) the health's own calls: {calls['extra_us']:.1f} us per step (an identity forward alone: "
        f"{calls['bare_us']:.1f} us), {calls['extra_us'] / (10 * step_ms):.3f}% of the fast recipe's "
        f"{step_ms:.2f} ms step"
    )


if __name__ == "__main__":
    main()
