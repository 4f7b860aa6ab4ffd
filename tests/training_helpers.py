"""Helpers for tests that run `hpctrain train` for real, in a subprocess, as a user would."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import torch

import warm_start

# Small and quick, yet a real run: a few hundred training images, a slice of the test set, one thread per process.
QUICK = [
    "--dataset",
    "fashion-mnist",
    "--train-limit",
    "512",
    "--test-limit",
    "500",
    "--threads",
    "1",
    "--log-interval",
    "0",
]


LAUNCHER_VARS = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
}


def clean_environ() -> dict[str, str]:
    """The test run's environment without any launcher's variables (a child must find only what a test sets)."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCHER_VARS and not k.startswith(("SLURM_", "PET_", "TORCHELASTIC_", "HPCTRAIN_LAUNCHER"))
    }


def hpctrain(
    *args: str,
    cwd: Path | None = None,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    baseline = clean_environ()
    return warm_start.run(list(args), cwd, {**baseline, **(env or {})}, timeout, baseline)


def start_hpctrain(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    baseline = clean_environ()
    environ = {**baseline, "PYTHONUNBUFFERED": "1", **(env or {})}
    return warm_start.popen(list(args), cwd, environ, merge_stderr=True, baseline=baseline)


def signal_after(
    args: list[str],
    after_line: str,
    signum: int,
    env: dict[str, str] | None = None,
) -> tuple[int, str]:
    """Run `hpctrain *args`, send it `signum` once a line containing `after_line` is out, and return its exit status
    and whole output. The moment is chosen by what the run printed, not by time."""
    process = start_hpctrain(*args, env=env)
    output = []
    try:
        for line in process.stdout:
            output.append(line)
            if after_line in line:
                process.send_signal(signum)
                break
        output.extend(process.stdout)
        return process.wait(timeout=120), "".join(output)
    finally:
        if process.poll() is None:
            process.kill()


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    return result


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from hpctrain import checkpoint
    from hpctrain.training.rundir import checkpoint_dir

    info = checkpoint.find_latest(checkpoint_dir(run_dir))
    assert info is not None, f"no valid checkpoint in {run_dir}"
    return checkpoint.load(info.path)["model"]


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, f"weights differ in {different}"


def tree_digest(directory: Path) -> dict[str, str]:
    """Every file under `directory` with its content hash: to show that a failed command changed nothing."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def wait_for(process: subprocess.Popen[str], text: str, output: list[str]) -> None:
    """Read `process`'s output (collected into `output`) until a line holds `text`; fail if it ends first."""
    for line in process.stdout:
        output.append(line)
        if text in line:
            return
    raise AssertionError(f"{text!r} never appeared:\n{''.join(output)}")


def until_explained(
    process: subprocess.Popen[str], frozen_after: str, frozen: Callable[[], int], explained: str
) -> list[str]:
    """Once `frozen_after` is out, `frozen()` stops a rank and gives its pid; read on until a surviving rank's line
    holds `explained`, then kill the frozen rank and collect the rest. The whole output."""
    output: list[str] = []
    try:
        wait_for(process, frozen_after, output)
        pid = frozen()
        wait_for(process, explained, output)
        os.kill(pid, signal.SIGKILL)
        output.extend(process.stdout)
        assert process.wait(timeout=120) != 0
    finally:
        if process.poll() is None:
            process.kill()
    return output
