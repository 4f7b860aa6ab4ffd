"""`hpctrain train mnist` for real: run directory contents, exact resume, DDP on CPU (gloo), and bad input."""

from __future__ import annotations

import json
import signal

import pytest
import torch
import yaml

from hpctrain.training.metrics import read_metrics
from training_helpers import QUICK, assert_bitwise_equal, final_weights, hpctrain, ok, start_hpctrain, tree_digest

METRIC_KEYS = {"epoch", "step", "train_loss", "test_loss", "test_accuracy", "images_per_s", "epoch_seconds",
               "world_size"}


def train(data_dir, run_dir, *extra, expect=0, timeout=300):
    result = hpctrain("train", "mnist", *QUICK, "--data-dir", str(data_dir), "--run-dir", str(run_dir), *extra,
                      timeout=timeout)
    if expect == 0:
        return ok(result)
    assert result.returncode == expect, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def test_run_directory_holds_config_metrics_tensorboard_checkpoints_provenance(fashion_data_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    result = train(fashion_data_dir, run_dir, "--recipe", "classic", "--epochs", "2")

    records = read_metrics(run_dir)
    assert [r["epoch"] for r in records] == [1, 2]
    assert METRIC_KEYS <= records[0].keys()
    assert [r["step"] for r in records] == [8, 16]  # 512 images / batch 64 (the classic default) = 8 steps an epoch
    assert all(r["world_size"] == 1 and r["images_per_s"] > 0 and r["epoch_seconds"] > 0 for r in records)
    assert records[-1]["test_accuracy"] > 0.3, "two small epochs should beat chance (0.1) by far"

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (config["recipe"], config["batch_size"], config["lr"], config["epochs"]) == ("classic", 64, 1.0, 2)
    attempt = json.loads((run_dir / "provenance.json").read_text())["attempts"][0]
    assert attempt["versions"]["torch"] == torch.__version__ and attempt["hosts"]

    events = EventAccumulator(str(run_dir / "tb"))
    events.Reload()
    accuracy = [(e.step, e.value) for e in events.Scalars("test/accuracy")]
    assert accuracy == [(r["step"], pytest.approx(r["test_accuracy"])) for r in records]

    names = sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint_*.pt"))
    assert names == ["checkpoint_epoch_1.pt", "checkpoint_epoch_2.pt"]
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "checkpoint_epoch_2.pt"
    state = torch.load(run_dir / "checkpoints" / "checkpoint_epoch_2.pt", weights_only=True)
    assert not any(key.startswith("module.") for key in state["model"])
    assert {"model", "optimizer", "scheduler", "epoch", "step", "ranks", "config"} <= state.keys()

    # A batch log (stderr is not a terminal) gets plain progress lines, never carriage returns.
    assert "epoch 1/2 step 8/8" in result.stderr and "\r" not in result.stderr


def test_resume_after_an_epoch_is_bitwise_equal_to_an_uninterrupted_run(fashion_data_dir, tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train(fashion_data_dir, whole, "--recipe", "classic", "--epochs", "2")
    train(fashion_data_dir, parts, "--recipe", "classic", "--epochs", "1")
    train(fashion_data_dir, parts, "--recipe", "classic", "--epochs", "2", "--resume")
    assert_bitwise_equal(final_weights(whole), final_weights(parts))
    assert [r["epoch"] for r in read_metrics(parts)] == [1, 2]


def interrupt(data_dir, run_dir, signum, *extra, after_line="epoch 1/2 step 3/"):
    """Start a run, send `signum` once it has trained a few steps, and return its exit status and output."""
    process = start_hpctrain("train", "mnist", *QUICK, "--data-dir", str(data_dir), "--run-dir", str(run_dir),
                             "--epochs", "2", *extra)
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


@pytest.mark.parametrize("signum,code,reason", [(signal.SIGUSR1, 75, "preempted"), (signal.SIGTERM, 143, "cancelled")])
def test_signal_mid_epoch_checkpoints_and_resume_is_bitwise_exact(fashion_data_dir, tmp_path, signum, code, reason):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train(fashion_data_dir, whole, "--recipe", "classic", "--epochs", "2")
    status, output = interrupt(fashion_data_dir, parts, signum, "--recipe", "classic")
    assert status == code, output
    assert (parts / "stop_reason").read_text().strip() == reason
    step_checkpoints = list((parts / "checkpoints").glob("checkpoint_step_*.pt"))
    assert len(step_checkpoints) == 1, output
    stopped_at = int(step_checkpoints[0].stem.rsplit("_", 1)[1])
    assert 3 <= stopped_at < 16, "stopped inside the run, at a step boundary after the signal"

    resumed = train(fashion_data_dir, parts, "--recipe", "classic", "--epochs", "2", "--resume")
    assert f"global step {stopped_at}" in resumed.stdout
    assert (parts / "stop_reason").read_text().strip() == "completed"
    assert_bitwise_equal(final_weights(whole), final_weights(parts))
    assert [r["step"] for r in read_metrics(parts)] == [r["step"] for r in read_metrics(whole)]


def test_ddp_on_two_cpu_processes_matches_a_single_process(fashion_data_dir, tmp_path):
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    common = ("--recipe", "classic", "--epochs", "1", "--train-limit", "2048", "--test-limit", "1000")
    train(fashion_data_dir, single, *common)
    train(fashion_data_dir, ddp, *common, "--nproc", "2")
    one, two = read_metrics(single)[-1], read_metrics(ddp)[-1]
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert one["step"] == two["step"] == 32  # the same global batches, split over two processes
    # Same data order and initial weights; only dropout masks and summation order differ.
    assert abs(one["test_accuracy"] - two["test_accuracy"]) <= 0.05
    assert two["test_loss"] == pytest.approx(one["test_loss"], rel=0.15)


def test_checkpoints_move_between_ddp_and_single_process(fashion_data_dir, tmp_path):
    run_dir = tmp_path / "run"
    train(fashion_data_dir, run_dir, "--recipe", "classic", "--epochs", "1", "--nproc", "2")
    train(fashion_data_dir, run_dir, "--recipe", "classic", "--epochs", "2", "--resume")
    train(fashion_data_dir, run_dir, "--recipe", "classic", "--epochs", "3", "--resume", "--nproc", "2")
    records = read_metrics(run_dir)
    assert [(r["epoch"], r["world_size"]) for r in records] == [(1, 2), (2, 1), (3, 2)]
    assert records[-1]["step"] == 24


def test_ddp_stop_reaches_every_rank_and_resumes_bitwise(fashion_data_dir, tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train(fashion_data_dir, whole, "--recipe", "classic", "--epochs", "2", "--nproc", "2")
    status, output = interrupt(fashion_data_dir, parts, signal.SIGUSR1, "--recipe", "classic", "--nproc", "2")
    assert status == 75, output
    train(fashion_data_dir, parts, "--recipe", "classic", "--epochs", "2", "--nproc", "2", "--resume")
    assert_bitwise_equal(final_weights(whole), final_weights(parts))


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("args,message", [
    (["--dataset", "cifar"], "choose one of: mnist, fashion-mnist"),
    (["--epochs", "-1"], "--epochs must be at least 1"),
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--nproc", "512"], "--nproc 512 exceeds"),
    (["--strategy", "dp"], "--strategy dp needs several GPUs"),
    (["--device", "cuda"] if not torch.cuda.is_available() else ["--nproc", "4096"], "cuda"),
])
def test_bad_options_fail_clearly_and_touch_nothing(fashion_data_dir, tmp_path, args, message):
    run_dir = tmp_path / "run"
    result = hpctrain("train", "mnist", "--data-dir", str(fashion_data_dir), "--run-dir", str(run_dir), *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert not run_dir.exists()


def test_missing_data_dir_names_the_download_command(tmp_path):
    result = hpctrain("train", "mnist", "--data-dir", str(tmp_path / "nowhere"), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "hpctrain download mnist" in result.stderr
    assert not (tmp_path / "run").exists()


def test_corrupt_checkpoint_for_resume_is_refused_and_the_run_is_untouched(fashion_data_dir, tmp_path):
    run_dir = tmp_path / "run"
    train(fashion_data_dir, run_dir, "--recipe", "classic", "--epochs", "1")
    bad = run_dir / "checkpoints" / "checkpoint_epoch_1.pt"
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    before = tree_digest(run_dir)
    result = train(fashion_data_dir, run_dir, "--recipe", "classic", "--epochs", "2", "--resume", str(bad), expect=2)
    assert "checksum" in result.stderr and "earlier checkpoint" in result.stderr
    assert tree_digest(run_dir) == before


def test_a_new_run_refuses_a_run_dir_with_checkpoints(fashion_data_dir, tmp_path):
    run_dir = tmp_path / "run"
    train(fashion_data_dir, run_dir, "--recipe", "classic", "--epochs", "1")
    before = tree_digest(run_dir)
    result = train(fashion_data_dir, run_dir, "--recipe", "classic", "--epochs", "2", expect=2)
    assert "pass --resume" in result.stderr
    assert tree_digest(run_dir) == before


def test_resume_with_another_batch_size_is_refused(fashion_data_dir, tmp_path):
    run_dir = tmp_path / "run"
    train(fashion_data_dir, run_dir, "--recipe", "classic", "--epochs", "1")
    result = train(fashion_data_dir, run_dir, "--recipe", "classic", "--epochs", "2", "--resume",
                   "--batch-size", "32", expect=2)
    assert "batch_size: checkpoint 64, now 32" in result.stderr


def test_train_help_lists_the_options_the_issue_names():
    result = ok(hpctrain("train", "--help"))
    for flag in ("--dataset", "--data-dir", "--run-dir", "--epochs", "--batch-size", "--lr", "--seed",
                 "--train-limit", "--device", "--strategy", "--nproc", "--resume", "--recipe", "--dist-init-method"):
        assert flag in result.stdout



@pytest.mark.parametrize("damage", ["truncate", "drop_manifest"])
def test_resume_skips_a_damaged_newest_checkpoint_with_a_warning(fashion_data_dir, tmp_path, damage):
    run_dir = tmp_path / "run"
    train(fashion_data_dir, run_dir, "--recipe", "classic", "--epochs", "2")
    newest = run_dir / "checkpoints" / "checkpoint_epoch_2.pt"
    if damage == "truncate":
        newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 3])
    else:
        newest.with_name(newest.name + ".manifest.json").unlink()
    result = train(fashion_data_dir, run_dir, "--recipe", "classic", "--epochs", "3", "--resume")
    assert "skipping checkpoint" in result.stderr and "checkpoint_epoch_2.pt" in result.stderr
    assert "resumed at epoch 2, step 0 of 8 (global step 8)" in result.stdout
    assert [r["epoch"] for r in read_metrics(run_dir)] == [1, 2, 3]
