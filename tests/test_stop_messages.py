"""The line a stopped run ends with says what happens next, truthfully (issue 17, section 2): inside a Slurm job
that hpctrain submitted, a time-limit warning makes the batch script requeue the job by itself."""

from __future__ import annotations

import signal
from pathlib import Path

from training_helpers import QUICK, signal_after


def stopped_line(data_dir: Path, run_dir: Path, env: dict[str, str]) -> str:
    status, text = signal_after(
        [
            "train",
            "mnist",
            *QUICK,
            "--recipe",
            "classic",
            "--epochs",
            "1",
            "--data-dir",
            str(data_dir),
            "--run-dir",
            str(run_dir),
        ],
        "epoch 1/1 step 2/",
        signal.SIGUSR1,
        env,
    )
    assert status == 75, text
    output = text.splitlines(keepends=True)
    [line] = [line for line in output if line.startswith("hpctrain: stopped (preempted")]
    return line


def test_inside_a_requeueing_job_the_stop_line_says_the_job_requeues_itself(fashion_data_dir, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "mnist-77"
    # What the batch script of `hpctrain submit` exports (the step's launcher variables are left out: one process).
    line = stopped_line(fashion_data_dir, run_dir, {"SLURM_JOB_ID": "77", "HPCTRAIN_RUN_DIR": str(run_dir)})
    assert "batch script requeues the job" in line and "resumes from that checkpoint by itself" in line, line
    assert "Continue with `--resume`" not in line


def test_by_hand_the_stop_line_says_how_to_continue(fashion_data_dir, tmp_path: Path) -> None:
    line = stopped_line(fashion_data_dir, tmp_path / "run", {})
    assert "Continue with `--resume` and the same --run-dir" in line, line
