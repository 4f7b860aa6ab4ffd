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


WARM_WORKER = Path(__file__).with_name("warm_worker.py")


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


def run_hpctrain(
    *args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`python -m hpctrain ARGS` in exactly `env` (default: this process's environment), as subprocess.run with
    capture_output=True and text=True; started warm where `env` allows it (tests/warm_start.py)."""
    environ = dict(os.environ if env is None else env)
    return warm_start.run(list(args), cwd, environ, timeout, clean_environ())


def start_hpctrain(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    baseline = clean_environ()
    environ = {**baseline, "PYTHONUNBUFFERED": "1", **(env or {})}
    return warm_start.popen(list(args), cwd, environ, merge_stderr=True, baseline=baseline)


def torchrun(
    options: list[str],
    entry: list[str],
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    merge_stderr: bool = True,
):
    """`python -m torch.distributed.run OPTIONS ENTRY ARGS` (ENTRY: ["-m", "hpctrain"] or [SCRIPT]) as a Popen-like
    with text pipes, started warm where it can be (tests/warm_start.py): the agent a fork of the warm process, its
    workers forks of one for workers (tests/warm_worker.py), which torchrun starts in ENTRY's place."""
    baseline = clean_environ()
    environ = {**baseline, **(env or {})}
    nproc = 1
    for option, value in zip(options, [*options[1:], ""]):
        name, _, given = option.partition("=")
        if name in ("--nproc-per-node", "--nproc_per_node"):
            nproc = int(given or value)
    workers = {"OMP_NUM_THREADS": "1"} if nproc > 1 and "OMP_NUM_THREADS" not in environ else {}  # torchrun's
    socket_path = warm_start.workers_socket({**environ, **workers})
    if socket_path is not None:
        environ["HPCTRAIN_TEST_WARM_WORKERS"] = socket_path
        entry = [str(WARM_WORKER), *entry]
    command = [*options, *entry, *args]
    return warm_start.popen(command, cwd, environ, merge_stderr, baseline, ("module", "torch.distributed.run"))


def run_torchrun(
    options: list[str],
    entry: list[str],
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """As `torchrun` above, run to its end as subprocess.run(capture_output=True, text=True) would."""
    return warm_start.completed(torchrun(options, entry, args, env=env, cwd=cwd, merge_stderr=False), timeout)


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
