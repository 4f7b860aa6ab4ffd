"""Crashed and hung workers under real torchrun on CPU (gloo): a clear error naming the missing rank instead of a
hang, and `torchrun --max-restarts` resuming the restarted group from the newest checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.training.metrics import read_metrics
from training_helpers import QUICK, clean_environ

pytestmark = pytest.mark.slow


def torchrun(data_dir: Path, run_dir: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**clean_environ(), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *extra[:2],
         "-m", "hpctrain", "train", "mnist", *QUICK, "--recipe", "classic", "--data-dir", str(data_dir),
         "--run-dir", str(run_dir), *extra[2:]],
        env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def wait_for(process: subprocess.Popen[str], text: str, output: list[str]) -> None:
    for line in process.stdout:
        output.append(line)
        if text in line:
            return
    raise AssertionError(f"{text!r} never appeared:\n{''.join(output)}")


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
            return int(proc.name)
    raise AssertionError(f"no worker with RANK={rank}")


def test_a_hung_rank_is_named_instead_of_hanging(fashion_data_dir, tmp_path):
    process = torchrun(fashion_data_dir, tmp_path / "run", "--max-restarts", "0", "--train-limit", "4096",
                       "--dist-timeout", "5")
    output: list[str] = []
    try:
        wait_for(process, "step 3/", output)
        hung = worker_pid(1, process.pid)
        os.kill(hung, signal.SIGSTOP)  # alive but silent: what a deadlocked or swapped-out rank looks like
        wait_for(process, "a collective failed", output)
        os.kill(hung, signal.SIGKILL)
        output.extend(process.stdout)
        assert process.wait(timeout=120) != 0
    finally:
        if process.poll() is None:
            process.kill()
    message = next(line for line in output if "a collective failed" in line)
    assert "rank(s) 1 of 2 did not answer" in message and "--dist-timeout" in message


def test_torchrun_restarts_a_killed_worker_and_the_group_resumes(fashion_data_dir, tmp_path):
    run_dir = tmp_path / "run"
    process = torchrun(fashion_data_dir, run_dir, "--max-restarts", "1", "--train-limit", "2048",
                       "--epochs", "2", "--checkpoint-every", "4")
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
