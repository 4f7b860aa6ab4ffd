"""Crashed and hung workers under real torchrun on CPU (gloo): a clear error naming the missing rank instead of a
hang, and `torchrun --max-restarts` resuming the restarted group from the newest checkpoint."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from hpctrain.training.metrics import read_metrics
import warm_start
from training_helpers import QUICK, clean_environ, until_explained, wait_for
from training_helpers import torchrun as warm_torchrun

pytestmark = pytest.mark.slow


def torchrun(data_dir: Path, run_dir: Path, *extra: str):
    options = ["--standalone", "--nproc-per-node", "2", *extra[:2]]
    args = ["train", "mnist", *QUICK, "--recipe", "classic", "--data-dir", str(data_dir), "--run-dir", str(run_dir)]
    return warm_torchrun(options, ["-m", "hpctrain"], [*args, *extra[2:]], env={"PYTHONUNBUFFERED": "1"})


def worker_pid(rank: int, parent: int) -> int:
    """The torchrun worker of `rank` (torchrun puts RANK into each worker's environment at exec)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            status = (proc / "status").read_text()
        except OSError:
            continue
        ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        if ppid == parent and f"RANK={rank}".encode() in environ:
            return warm_start.worker_pid(int(proc.name))
    raise AssertionError(f"no worker with RANK={rank}")


def collective_failure(
    process: subprocess.Popen[str],
    frozen_after: str,
    frozen: Callable[[], int],
) -> tuple[list[str], str]:
    """Once `frozen_after` is out, `frozen()` gives the pid of the rank that stopped answering; wait for the other
    rank's explanation, then kill the frozen one. The whole output and the explanation's line."""
    output = until_explained(process, frozen_after, frozen, "a collective failed")
    return output, next(line for line in output if "a collective failed" in line)


def test_a_hung_rank_is_named_instead_of_hanging(fashion_data_dir, tmp_path):
    process = torchrun(
        fashion_data_dir, tmp_path / "run", "--max-restarts", "0", "--train-limit", "4096", "--dist-timeout", "5"
    )

    def freeze() -> int:
        hung = worker_pid(1, process.pid)
        os.kill(hung, signal.SIGSTOP)  # alive but silent: what a deadlocked or swapped-out rank looks like
        return hung

    output, message = collective_failure(process, "step 3/", freeze)
    assert f"rank(s) 1 (on {socket.gethostname()}) of 2 did not answer" in message and "--dist-timeout" in message


# Where rank 1 (or 0) freezes, the recipe that has a collective there, and what the surviving rank must name.
# `classic` has no BatchNorm, so only `fast` (BatchNorm buffers) broadcasts in DDP's forward.
VANISH_CASES = [
    ("host-names", 1, "classic", 1, "in the start-up exchange of host names"),
    ("ddp-init", 1, "classic", 1, "in DDP's start-up broadcast of the model"),
    ("forward", 1, "fast", 2, "in step 2's forward pass"),
    ("backward", 1, "classic", 3, "in step 3's gradient all-reduce (backward)"),
    # The loop votes every few steps (as many as fit in 50 ms): which step the Nth vote follows depends on speed.
    ("stop-vote", 1, "classic", 3, "in the stop vote after step "),
    ("stop-vote", 0, "classic", 2, "in the stop vote after step "),
    ("loss-average", 1, "classic", 1, "in the epoch's training-loss average"),
    ("evaluation", 1, "classic", 1, "in evaluation's all-reduce"),
    ("checkpoint-vote", 1, "classic", 1, "in the checkpoint's vote on the ranks' parts at step 8"),
    ("checkpoint-barrier", 1, "classic", 1, "in the barrier after the checkpoint at step 8"),
]


@pytest.mark.parametrize(
    ("site", "rank", "recipe", "call", "named"), VANISH_CASES, ids=[f"{c[0]}-rank{c[1]}" for c in VANISH_CASES]
)
def test_a_rank_that_freezes_at_any_collective_is_named(fashion_data_dir, tmp_path, site, rank, recipe, call, named):
    """One rank freezes (SIGSTOP, by itself) exactly before one collective, so the other rank's timeout happens
    there and nowhere else: each place gets hpctrain's one-line explanation naming the collective, the missing
    rank and its host, never the backend's traceback (gloo's "Application timeout caused pair closure" inside
    backward() once escaped as a raw RuntimeError and failed CI by luck)."""
    env = {
        "PYTHONUNBUFFERED": "1",
        "HPCTRAIN_TEST_VANISH_RANK": str(rank),
        "HPCTRAIN_TEST_VANISH_AT": site,
        "HPCTRAIN_TEST_VANISH_CALL": str(call),
    }
    args = ["train", "mnist", *QUICK, "--recipe", recipe, "--data-dir", str(fashion_data_dir)]
    process = warm_torchrun(
        ["--standalone", "--nproc-per-node", "2", "--max-restarts", "0"],
        [str(Path(__file__).with_name("vanishing_rank.py"))],
        [*args, "--run-dir", str(tmp_path / "run"), "--dist-timeout", "5"],
        env=env,
    )
    output, message = collective_failure(process, f"stops before {site}", lambda: worker_pid(rank, process.pid))
    text = "".join(output)
    assert named in message, text
    assert f"rank(s) {rank} (on {socket.gethostname()}) of 2 did not answer" in message, text
    assert "RuntimeError" not in text and "DistBackendError" not in text, text  # no worker's raw traceback


def test_torchrun_restarts_a_killed_worker_and_the_group_resumes(fashion_data_dir, tmp_path):
    run_dir = tmp_path / "run"
    process = torchrun(
        fashion_data_dir,
        run_dir,
        "--max-restarts",
        "1",
        "--train-limit",
        "2048",
        "--epochs",
        "2",
        "--checkpoint-every",
        "4",
    )
    output: list[str] = []
    try:
        wait_for(process, "epoch 1/2 step 10/", output)
        os.kill(worker_pid(1, process.pid), signal.SIGKILL)
        output.extend(process.stdout)
        status = process.wait(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    text = "".join(output)
    assert status == 0, text
    assert "resumed at epoch 1, step 8 of 32" in text or "resumed at epoch 1, step 12 of 32" in text, text
    records = read_metrics(run_dir)
    assert [r["epoch"] for r in records] == [1, 2] and records[-1]["step"] == 64


# ---------------------------------------------------------------- a rank whose torch never leaves the process group

NEVER_LEAVES = """
import time

import torch.distributed as dist

import hpctrain.distributed.process_group as process_group

process_group.DESTROY_TIMEOUT_S = 2.0


def _never_returns(*args, **kwargs):  # torch's shutdown hang (pytorch/pytorch#75097), made certain
    time.sleep(3600)


dist.destroy_process_group = _never_returns
"""


def test_a_finished_run_whose_process_group_never_shuts_down_still_exits(fashion_data_dir: Path, tmp_path: Path):
    """Both ranks of a finished `--nproc 2` run hang inside torch's destroy_process_group (a startup file makes it
    never return, and shortens hpctrain's wait to 2 s): each says so once and exits with the run's status, instead
    of holding the allocation until the time limit."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(NEVER_LEAVES)
    env = {**clean_environ(), "PYTHONPATH": os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain",
            "train",
            "mnist",
            "--data-dir",
            str(fashion_data_dir),
            *QUICK,
            "--nproc",
            "2",
            "--epochs",
            "1",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("leaving the process group did not finish within 2 s") == 2, result.stderr
    assert "completed 1 epoch(s)" in result.stdout
