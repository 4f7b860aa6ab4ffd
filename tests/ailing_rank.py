"""Test-only entry point: `hpctrain` with one slow rank, for the straggler tests.

torchrun starts this file in place of `-m hpctrain`. The rank named by HPCTRAIN_TEST_AILING_RANK sleeps
HPCTRAIN_TEST_AILING_S seconds per training step, either while the loop waits for its input
(HPCTRAIN_TEST_AILING=input: inside the data source's timed `next()`) or inside the model's forward pass
(HPCTRAIN_TEST_AILING=compute), as a rank with a starved DataLoader or a throttled processor would; or, with
HPCTRAIN_TEST_AILING=stall, its forward pass never returns once it has trained HPCTRAIN_TEST_AILING_S steps (a
kernel or a file system that stopped answering: the process lives, its watchdog thread too). With
HPCTRAIN_TEST_AILING=sick-gemm the rank's preflight GEMM reports a twentieth of its rate (a throttled device), and
with sick-link its link test a twentieth of its exchanges' rates (a degraded NIC); with slow-writes its background
checkpoint writes take HPCTRAIN_TEST_AILING_S seconds longer (a slow file system) and the recipe keeps its best
checkpoint (as imagenet's does). HPCTRAIN_TEST_HUNG_FS=1 makes every process's fsync of a file in a `hang` folder
block forever, as on an NFS mount whose server stopped answering (a real one cannot run here), and lets a hung
process's report take 3 s at most before it ends. HPCTRAIN_TEST_NODE_PER_RANK=1
makes every rank of a local run a node of its own (nodeRANK);
HPCTRAIN_TEST_AILING_ONCE=1 keeps any of these to a Slurm job's first attempt (a node that is left out after it), or,
where HPCTRAIN_TEST_AILING_MARKER names a file, to the attempt that made it (a restarted pod's container). Every rank
also writes its progress record and compares records more often than hpctrain does, so a test need not train for
a minute. Nothing of this ships in hpctrain: it patches module attributes from outside.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import hpctrain.data.source as source
import hpctrain.recipes.mnist as mnist
import hpctrain.training.watch as watch


def _slow_input(delay: float) -> None:
    timed = source.timed

    def slow(items: Iterable, waited: Any) -> Iterator:
        def sleepy() -> Iterator:
            for item in items:
                time.sleep(delay)  # inside the `next()` that timed() measures
                yield item

        return timed(sleepy(), waited)

    source.timed = slow


def _slow_compute(delay: float) -> None:
    for net in (mnist.TutorialNet, mnist.FastNet):
        forward = net.forward

        def slow(self: Any, x: Any, _forward: Any = forward) -> Any:
            if self.training:
                time.sleep(delay)
            return _forward(self, x)

        net.forward = slow


def _stall(after_steps: float) -> None:
    for net in (mnist.TutorialNet, mnist.FastNet):
        forward = net.forward
        seen = {"steps": 0}

        def stalled(self: Any, x: Any, _forward: Any = forward, _seen: dict = seen) -> Any:
            if self.training:
                _seen["steps"] += 1
                while _seen["steps"] > after_steps:
                    time.sleep(3600)
            return _forward(self, x)

        net.forward = stalled


def _sick_gemm(_: float) -> None:
    import hpctrain.training.preflight_measure as preflight_measure

    measure = preflight_measure.gemm_gflops
    preflight_measure.gemm_gflops = lambda *args, **kwargs: measure(*args, **kwargs) / 20


def _sick_link(_: float) -> None:
    import hpctrain.training.preflight_measure as preflight_measure

    measure = preflight_measure.link_gbps
    preflight_measure.link_gbps = lambda *args: {peer: rate / 20 for peer, rate in measure(*args).items()}


def _slow_writes(delay: float) -> None:
    import hpctrain.checkpoint.background as background

    save = background.save

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(delay)
        return save(*args, **kwargs)

    background.save = slow
    mnist.ClassicRecipe.keeps_best = True
    mnist.FastRecipe.keeps_best = True


def _hung_file_system() -> None:
    fsync = os.fsync

    def hung(fd: Any) -> None:
        if isinstance(fd, int) and "/hang/" in os.readlink(f"/proc/self/fd/{fd}"):
            threading.Event().wait()  # the thread blocks as in a syscall to a dead server, the interpreter goes on
        fsync(fd)

    os.fsync = hung
    watch.HANG_FILES_DEADLINE_S = 3.0


def main() -> int:
    watch.PROGRESS_INTERVAL_S = 0.5
    if os.environ.get("HPCTRAIN_TEST_HUNG_FS") == "1":
        _hung_file_system()
    if os.environ.get("HPCTRAIN_TEST_NODE_PER_RANK") == "1":  # every rank plays a node of its own: node0, node1, ...
        os.environ["HPCTRAIN_NODE_NAME"] = f"node{os.environ['RANK']}"
    watch.STRAGGLER_CHECK_S = 1.5
    later_attempt = os.environ.get("SLURM_RESTART_COUNT", "0") != "0"
    marker = os.environ.get("HPCTRAIN_TEST_AILING_MARKER")  # a Kubernetes container restarts in place, env unchanged
    if marker:
        later_attempt = later_attempt or os.path.exists(marker)
    if os.environ.get("RANK") == os.environ.get("HPCTRAIN_TEST_AILING_RANK") and not (
        later_attempt and os.environ.get("HPCTRAIN_TEST_AILING_ONCE") == "1"
    ):
        if marker:
            open(marker, "w").close()
        delay = float(os.environ.get("HPCTRAIN_TEST_AILING_S", "0"))
        {
            "input": _slow_input,
            "compute": _slow_compute,
            "stall": _stall,
            "sick-gemm": _sick_gemm,
            "sick-link": _sick_link,
            "slow-writes": _slow_writes,
        }[os.environ["HPCTRAIN_TEST_AILING"]](delay)
    from hpctrain.cli import main as hpctrain_main

    return hpctrain_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
