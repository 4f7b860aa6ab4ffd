"""What `hpctrain train` refuses before it loads data or starts workers, and how it says so: one line naming the
fix, exit status 2, nothing created. Runs the real CLI in subprocesses (and torchrun where the issue saw it)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from hpctrain import config
from hpctrain.config import TrainConfig
from hpctrain.distributed import cores as local
from hpctrain.errors import UserError
from training_helpers import QUICK, clean_environ, hpctrain, ok, run_torchrun

CORES = len(os.sched_getaffinity(0))


def refused(result: subprocess.CompletedProcess[str], *messages: str) -> str:
    """Exit status 2 and exactly one line on stderr (no traceback, no C++ frames, no per-rank repeats)."""
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for message in messages:
        assert message in lines[0], lines[0]
    return lines[0]


def train(data_dir: Path, run_dir: Path, *extra: str, env: dict[str, str] | None = None):
    return hpctrain("train", "mnist", "--data-dir", str(data_dir), "--run-dir", str(run_dir), *extra, env=env)


# ---------------------------------------------------------------- the README's second command


@pytest.mark.parametrize("extra", [(), ("--nproc", "2")])
def test_default_dataset_missing_names_the_dataset_that_is_there(fashion_data_dir, tmp_path, extra):
    # The quick start fetched fashion-mnist; `hpctrain train mnist --data-dir data [--nproc 2]` defaults to mnist.
    line = refused(
        train(fashion_data_dir, tmp_path / "run", *extra),
        "pass --dataset fashion-mnist",
        f"hpctrain download mnist --data-dir {fashion_data_dir}",
    )
    assert "the default --dataset" in line
    assert not (tmp_path / "run").exists()


def test_under_torchrun_the_missing_dataset_is_reported_once(fashion_data_dir, tmp_path):
    args = ["train", "mnist", "--data-dir", str(fashion_data_dir), "--run-dir", str(tmp_path / "run")]
    result = run_torchrun(["--standalone", "--nproc-per-node", "2"], ["-m", "hpctrain"], args, timeout=300)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert output.count("pass --dataset fashion-mnist") == 1, output


# ---------------------------------------------------------------- unusable run directories


def run_dir_cases(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    return {
        "is a file": (a_file, "is a file"),
        "under a file": (a_file / "run", f"lies under {a_file}, which is a file"),
        "300-character name": (tmp_path / ("r" * 300) / "run", "300 bytes, more than the 255"),
        "the root": (Path("/"), "is the file system root"),
    }


@pytest.mark.parametrize("case", ["is a file", "under a file", "300-character name", "the root"])
@pytest.mark.parametrize("extra", [(), ("--nproc", "2")])
def test_unusable_run_dir_is_refused_before_anything_starts(fashion_data_dir, tmp_path, case, extra):
    run_dir, message = run_dir_cases(tmp_path)[case]
    before = sorted(tmp_path.rglob("*"))
    refused(train(fashion_data_dir, run_dir, *QUICK, *extra), "--run-dir", message)
    assert sorted(tmp_path.rglob("*")) == before


@pytest.fixture
def read_only_dir(tmp_path):
    """A read-only tmpfs (root ignores file modes, not a read-only mount); skipped where mounting is not allowed."""
    mount_point = tmp_path / "ro"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1M", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


@pytest.mark.parametrize("extra", [(), ("--nproc", "2")])
def test_read_only_run_dir_is_refused(fashion_data_dir, read_only_dir, extra):
    refused(train(fashion_data_dir, read_only_dir / "run", *QUICK, *extra), "read-only file system")
    with pytest.raises(UserError, match="read-only file system"):
        config.check_run_dir(read_only_dir)


# ---------------------------------------------------------------- environment and numbers


@pytest.mark.parametrize("variable,value", [("SLURM_RESTART_COUNT", "abc"), ("TORCHELASTIC_RESTART_COUNT", "1.5")])
def test_malformed_restart_count_names_the_variable(fashion_data_dir, tmp_path, variable, value):
    refused(
        train(fashion_data_dir, tmp_path / "run", *QUICK, env={variable: value}),
        f"{variable}={value!r}",
        f"unset {variable}",
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--seed", str(2**64)], "--seed must be a whole number from 0 to 2**64-1"),
        (["--seed", "-1"], "--seed must be"),
        (["--dist-timeout", "nan"], "--dist-timeout must be a finite number"),
        (["--dist-timeout", "1e20"], "at most 604800"),
        (["--lr", "inf"], "--lr must be a finite number above 0 and at most 1000"),
        (
            ["--threads", "100000"],
            f"exceeds the {CORES} CPU core(s) this process may use; use --threads {CORES} or fewer",
        ),
        (["--nproc", "2", "--dist-init-method", "tcp://127.0.0.1:29400"], "--nproc starts the processes itself"),
        (["--nproc", "2", "--dist-init-method", "file:///tmp/rendezvous"], "for processes started elsewhere"),
    ],
)
def test_bad_values_are_refused_in_one_line(fashion_data_dir, tmp_path, args, message):
    refused(train(fashion_data_dir, tmp_path / "run", *QUICK, *args), message)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "field,value",
    [
        ("lr", math.inf),
        ("lr", 1e300),
        ("lr", math.nan),
        ("lr", 0.0),
        ("lr", 1001.0),
        ("dist_timeout", math.nan),
        ("dist_timeout", 1e20),
        ("dist_timeout", -1.0),
        ("log_interval", math.inf),
        ("log_interval", -1.0),
        ("seed", 2**64),
        ("seed", -1),
        pytest.param("seed", 10**5000, id="seed-5001-digits"),
    ],
)
def test_config_refuses_non_finite_and_absurd_numbers(field, value):
    with pytest.raises(UserError, match=f"--{field.replace('_', '-')} must be") as caught:
        TrainConfig(**{field: value})
    assert len(str(caught.value)) < 300  # a 5,000-digit seed is not echoed back


def test_config_keeps_every_sane_value():
    TrainConfig(lr=1000.0, dist_timeout=7 * 24 * 3600.0, log_interval=0.0, seed=2**64 - 1)
    TrainConfig(lr=1e-6, dist_timeout=0.5, seed=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without GPUs")
def test_nproc_with_cuda_but_no_gpu_says_no_gpu_is_visible(fashion_data_dir, tmp_path):
    line = refused(
        train(fashion_data_dir, tmp_path / "run", *QUICK, "--nproc", "2", "--device", "cuda"),
        "no GPU is visible",
        "drop --device cuda",
    )
    assert "--nproc 0" not in line


# ---------------------------------------------------------------- threads


def test_threads_above_the_usable_cores_are_refused_in_library_use_too():
    with pytest.raises(UserError, match=f"use --threads {CORES} or fewer"):
        local.choose_threads(CORES + 1, 1)
    assert local.choose_threads(CORES, 1) == CORES


PROC_STAT = """cpu  400 0 200 1000 0 0 0 0 0 0
cpu0 {busy0} 0 0 {idle0} 10 0 0 0 0 0
cpu1 {busy1} 0 0 {idle1} 0 0 0 0 0 0
intr 12345
"""


def test_busy_cores_come_from_two_proc_stat_samples():
    before = local.cpu_times(PROC_STAT.format(busy0=100, idle0=900, busy1=100, idle1=900))
    after = local.cpu_times(PROC_STAT.format(busy0=200, idle0=900, busy1=110, idle1=990))
    assert before[0] == (100, 1010)  # iowait counts as idle
    assert local.busy_cores(before, after, {0, 1}) == pytest.approx(1.1)
    assert local.busy_cores(before, after, {1}) == pytest.approx(0.1)  # only this process's CPUs count


def test_default_threads_leave_out_busy_cores(monkeypatch):
    monkeypatch.setattr(local, "available_cores", lambda: 8)
    assert local.default_threads(1) == 8
    assert local.default_threads(1, busy_cores=1.0) == 7
    assert local.default_threads(1, busy_cores=0.3) == 8  # noise is not a busy core
    assert local.default_threads(2, busy_cores=2.0) == 3
    assert local.default_threads(1, busy_cores=8.0) == 1


@pytest.mark.skipif(CORES < 2, reason="needs two usable cores")
def test_a_busy_core_at_the_start_lowers_the_default_threads(fashion_data_dir, tmp_path):
    quick = [a for a in QUICK if a not in ("--threads", "1")]
    competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        result = ok(train(fashion_data_dir, tmp_path / "run", *quick, "--train-limit", "224", "--epochs", "1"))
    finally:
        competitor.kill()
        competitor.wait()
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert 1 <= config["threads"] < CORES
    assert "--threads N to choose" in result.stderr


# ---------------------------------------------------------------- typing and Ctrl-C


def test_an_option_typo_suggests_the_option(tmp_path):
    result = hpctrain("train", "mnist", "--epocs", "2")
    assert result.returncode == 2
    assert "usage: hpctrain train" in result.stderr
    assert "unrecognized arguments: --epocs 2 (did you mean --epochs?)" in result.stderr


def test_typo_in_a_jobs_training_options_is_one_line_without_an_exit_status():
    from hpctrain.cli.train import config_from_argv

    with pytest.raises(UserError) as caught:
        config_from_argv(["mnist", "--epocs", "2"])
    assert "did you mean --epochs?" in str(caught.value) and ": 2;" not in str(caught.value)


def test_help_speaks_to_users_and_explains_every_train_option():
    top = ok(hpctrain("--help")).stdout
    assert "Command-line entry point" not in top and "Train PyTorch models" in top
    import argparse

    from hpctrain.cli.train import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    unexplained = [a.option_strings or a.dest for a in parser._actions if not a.help]
    assert unexplained == []


STALL_ON_TORCH_IMPORT = '''
import os, sys, time

class _StallTorch:
    """Test hook: the first `import torch` announces itself and waits, so Ctrl-C lands inside start-up."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            open(os.environ["HPCTRAIN_TEST_STALLED"], "w").close()
            time.sleep(120)
        return None

sys.meta_path.insert(0, _StallTorch())
'''


def test_ctrl_c_during_start_up_is_one_line_and_exit_130(tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(STALL_ON_TORCH_IMPORT)
    marker = tmp_path / "stalled"
    env = {
        **clean_environ(),
        "HPCTRAIN_TEST_STALLED": str(marker),
        "PYTHONPATH": os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "train", "mnist", "--data-dir", str(tmp_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the start-up never reached `import torch`"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.strip().endswith("interrupted")
    assert len(stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------- messages for users of an installed package


def test_slurm_errors_point_at_nothing_that_only_a_checkout_has(tmp_path, monkeypatch):
    from hpctrain.schedulers.slurm.commands import slurm

    monkeypatch.setenv("PATH", str(tmp_path))  # a real lookup that finds no sbatch
    with pytest.raises(UserError) as caught:
        slurm(["sbatch", "--version"])
    fake = tmp_path / "scontrol"  # stands in for a controller that is down (the local one must stay up)
    fake.write_text("#!/bin/sh\necho 'Unable to contact slurm controller (connect failure)' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(UserError) as down:
        slurm(["scontrol", "show", "node", "-o"])
    for message in (str(caught.value), str(down.value)):
        assert "scripts/" not in message
    sources = Path(__file__).resolve().parents[1] / "src" / "hpctrain"
    assert not [p for p in sources.rglob("*.py") if "scripts/local-slurm.sh" in p.read_text()]


def test_data_may_follow_the_options(tmp_path: Path) -> None:
    """`train imagenet --epochs 30 DATA`, as the seed scripts write it: argparse alone leaves DATA unrecognized
    after an option; hpctrain gives it to DATA, in the CLI and in `submit`'s check of the training options."""
    from hpctrain.cli.train import config_from_argv

    data = tmp_path / "images"
    assert config_from_argv(["imagenet", "--epochs", "3", str(data)]).data_dir == str(data)
    result = hpctrain("train", "imagenet", "--epochs", "3", str(data), cwd=tmp_path)
    refused(result, f"{data} has no train/ folder")  # DATA was read: the error is about its content
    result = hpctrain("train", "imagenet", "--epochs", "3", str(data), "extra", cwd=tmp_path)
    assert result.returncode == 2 and "error: unrecognized arguments: extra" in result.stderr, result.stderr
