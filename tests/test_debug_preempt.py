"""`hpctrain debug preempt JOB`: the warning signal is read from the job's own batch script and delivered where a
time limit would deliver it. Pure parts first; then, on the real local Slurm cluster, a `train mnist` job that is
warned mid-epoch, checkpoints, requeues itself and completes, and the errors for jobs that cannot be warned."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.schedulers.slurm.services.preempt import (
    TimeLimitWarning,
    _job_warning,
    parse_signal_option,
    scancel_argv,
    warning_from_script,
)
from hpctrain.errors import UserError
from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers.slurm.batch.script import render_sbatch
from training_helpers import run_hpctrain


def hpctrain(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_hpctrain(*args, cwd=cwd, timeout=timeout)


# ---------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("B:USR1@120", TimeLimitWarning("USR1", True, 120)),
        ("b:sigusr1@5", TimeLimitWarning("USR1", True, 5)),
        ("USR1@90", TimeLimitWarning("USR1", False, 90)),
        ("R:TERM@30", TimeLimitWarning("TERM", False, 30)),
        ("RB:USR2", TimeLimitWarning("USR2", True, 60)),  # sbatch's default: 60 s before the limit
        ("10@60", TimeLimitWarning("10", False, 60)),
        ("X:USR1@60", None),
        ("USR1@soon", None),
        ("", None),
    ],
)
def test_parse_signal_option(value: str, expected: TimeLimitWarning | None) -> None:
    assert parse_signal_option(value) == expected


def test_the_warning_of_a_script_that_hpctrain_renders() -> None:
    from hpctrain.schedulers.slurm.batch.options import SlurmOptions

    job = JobSpec(command=("hpctrain", "train", "mnist"), time_limit_s=3600, signal_grace=300)
    single = SlurmOptions(launcher="single")
    assert warning_from_script(render_sbatch(job, single)) == TimeLimitWarning("USR1", True, 300)
    assert warning_from_script(render_sbatch(job.replace(signal_grace=0), single)) is None  # no warning asked for


def test_warning_from_script_reads_sbatch_lines_as_sbatch_does() -> None:
    script = "\n".join(
        [
            "#!/bin/bash",
            "#SBATCH --job-name='a b' --signal=USR1@30",
            "",
            "# a comment between options",
            "#SBATCH --signal B:USR2@45   # the later one wins",
            "echo start",
            "#SBATCH --signal=B:TERM@10",  # after the first command: sbatch ignores it
        ]
    )
    assert warning_from_script(script) == TimeLimitWarning("USR2", True, 45)
    assert warning_from_script("#!/bin/sh\n# This script was created by sbatch --wrap.\n\nsleep 5\n") is None
    assert warning_from_script("#!/bin/bash\n#SBATCH --signal=B:nonsense!\n") is None


def test_scancel_targets_the_batch_shell_only_for_b_warnings() -> None:
    assert scancel_argv("42", TimeLimitWarning("USR1", True, 120)) == ["scancel", "--signal=USR1", "--batch", "42"]
    assert scancel_argv("42", TimeLimitWarning("USR1", False, 120)) == ["scancel", "--signal=USR1", "42"]


def test_named_signal_needs_no_script_and_steps_needs_a_signal() -> None:
    assert _job_warning("42", "sigusr1", steps=False) == (TimeLimitWarning("USR1", True), "")
    assert _job_warning("42", "USR2", steps=True) == (TimeLimitWarning("USR2", False), "")
    with pytest.raises(UserError, match="--signal 'US R1'"):
        _job_warning("42", "US R1", steps=False)
    with pytest.raises(UserError, match="add --signal SIG"):
        _job_warning("42", None, steps=True)


def test_malformed_job_id_is_refused_before_slurm_is_asked() -> None:
    result = hpctrain("debug", "preempt", "12; rm -rf x")
    assert result.returncode == 2
    assert "is not a Slurm job id" in result.stderr


# ---------------------------------------------------------------- on the local cluster


def _field(job_id: str, name: str) -> str | None:
    """A field of `scontrol show job`; "GONE" once the controller forgot the job, None when scontrol failed
    (a busy controller times out now and then: callers poll again)."""
    result = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    if result.returncode != 0:
        return "GONE" if "invalid job id" in result.stderr.lower() else None
    for word in result.stdout.split():
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def _wait(condition, what: str, timeout: float, job_id: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], capture_output=True)
            text = log.read_text() if log.exists() else "(no log)"
            pytest.fail(f"{what} did not happen within {timeout:.0f} s (job {job_id}):\n{text}")
        time.sleep(0.2)


@pytest.mark.slurm
@pytest.mark.slow
def test_preempt_rehearsal_checkpoints_mid_epoch_requeues_and_completes(
    slurm_cluster, tmp_path: Path, fashion_data_dir: Path
) -> None:
    submitted = hpctrain(
        "submit",
        "--launcher",
        "single",
        "--job-name",
        "h6-preempt",
        "--output",
        "job-%j.out",
        "train",
        "mnist",
        "--dataset",
        "fashion-mnist",
        "--data-dir",
        str(fashion_data_dir),
        "--train-limit",
        "2048",
        "--test-limit",
        "1000",
        "--epochs",
        "2",
        "--recipe",
        "classic",
        "--checkpoint-every",
        "0",
        "--log-interval",
        "0",
        cwd=tmp_path,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    log = tmp_path / f"job-{job_id}.out"
    run_dir = tmp_path / "runs" / f"mnist-fashion-mnist-classic-{job_id}"
    try:
        # Warn it once training has taken its first steps (a progress line per step: --log-interval 0).
        _wait(lambda: log.exists() and "epoch 1/2 step" in log.read_text(), "the first training step", 600, job_id, log)
        # The training is paused while the warning travels (LocalSlurm.interrupt_mid_run), so it lands mid-epoch
        # however fast this CPU trains; `--follow` runs on until the job has requeued itself.
        preempt = slurm_cluster.interrupt_mid_run(
            job_id,
            1,
            signal.SIGUSR1,
            lambda: subprocess.Popen(
                [sys.executable, "-m", "hpctrain", "debug", "preempt", job_id, "--follow", "--timeout", "300"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
        stdout, stderr = preempt.communicate(timeout=400)
        assert preempt.returncode == 0, stdout + stderr + log.read_text()
        assert f"sent USR1 to job {job_id} (its batch shell), as Slurm would 120 s before its time limit" in stdout
        assert (
            f"job {job_id} requeued itself after its program said it stopped with its state saved (restart 1)" in stdout
        )
        first_attempt = log.read_text()
        assert "stopped (preempted: SIGUSR1" in first_attempt and "requeueing job" in first_attempt, first_attempt
        assert (
            not (run_dir / "metrics.jsonl").exists()
            or json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["epoch"] < 2
        ), "finished before the warning"

        # Slurm holds a requeued job (BeginTime) until the old attempt's credential expires (30 s on the local
        # cluster); releasing it sooner by hand gets it killed ("Job credential revoked"), so the test waits.
        _wait(
            lambda: _field(job_id, "JobState") in ("COMPLETED", "FAILED", "CANCELLED", "GONE"),
            "the job's end",
            400,
            job_id,
            log,
        )

        text = log.read_text()
        assert "attempt 2" in text, text
        resumed = re.search(r"resumed at epoch (\d+), step (\d+) of (\d+) \(global step (\d+)\)", text)
        assert resumed, text
        epoch, step, per_epoch, global_step = map(int, resumed.groups())
        assert step > 0 and global_step == (epoch - 1) * per_epoch + step, text  # mid-epoch, not an epoch restart
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        assert [m["epoch"] for m in metrics] == [1, 2] and metrics[-1]["step"] == 2 * per_epoch, metrics
        assert (run_dir / "stop_reason").read_text().strip() == "completed"

        status = hpctrain("status", job_id, "--json")
        assert status.returncode == 0, status.stderr
        info = json.loads(status.stdout)
        assert (info["state"], info["restarts"], info["exit_code"]) == ("COMPLETED", 1, 0), (info, text)

        again = hpctrain("debug", "preempt", job_id)
        assert again.returncode == 2
        assert f"job {job_id} already ended (COMPLETED)" in again.stderr
    finally:
        slurm_cluster.cancel_quietly(job_id)


@pytest.mark.slurm
def test_preempt_refuses_jobs_that_cannot_be_warned(slurm_cluster, tmp_path: Path) -> None:
    unknown = hpctrain("debug", "preempt", "987654321")
    assert unknown.returncode == 2 and "job 987654321 not found" in unknown.stderr

    held = slurm_cluster.sbatch(
        "-J", "h6-held", "--hold", "--signal=B:USR1@60", "-o", "out-%j.txt", "--wrap", "true", cwd=tmp_path
    )
    plain = slurm_cluster.sbatch("-J", "h6-plain", "-o", "out-%j.txt", "--wrap", "sleep 120", cwd=tmp_path)
    try:
        pending = hpctrain("debug", "preempt", held)
        assert pending.returncode == 2
        assert f"job {held} is PENDING, reason JobHeldUser" in pending.stderr

        slurm_cluster.wait_state(plain, {"RUNNING"})
        no_warning = hpctrain("debug", "preempt", plain)
        assert no_warning.returncode == 2
        assert "has no `#SBATCH --signal` line" in no_warning.stderr and "--signal-grace" in no_warning.stderr
        assert slurm_cluster.state(plain) == "RUNNING"  # nothing was sent
    finally:
        slurm_cluster.cancel_quietly(held)
        slurm_cluster.cancel_quietly(plain)


STEP_RECORDER = """\
import os, signal, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append("USR1"))
open(sys.argv[1] + ".started", "w").close()
deadline = time.time() + 100
while not got and time.time() < deadline:
    time.sleep(0.1)
with open(sys.argv[1], "w") as f:
    f.write(",".join(got))
"""


@pytest.mark.slurm
@pytest.mark.parametrize("batch", [True, False], ids=["B-batch-shell", "job-steps"])
def test_preempt_delivers_to_where_the_script_asks(slurm_cluster, tmp_path: Path, batch: bool) -> None:
    """`--signal=B:USR1@..` reaches only the batch shell; `--signal=USR1@..` only the job steps."""
    (tmp_path / "rec.py").write_text(STEP_RECORDER)
    option = "B:USR1@60" if batch else "USR1@60"
    (tmp_path / "job.sh").write_text(
        "#!/bin/bash\n"
        f"#SBATCH --signal={option}\n"
        "trap 'echo batch-shell-got-USR1 > batch.txt' USR1\n"
        f"srun --ntasks=1 {sys.executable} rec.py step.txt &\n"
        "while ! [ -f step.txt ]; do wait; done\n"
        "wait\n"
    )
    job_id = slurm_cluster.sbatch("-J", "h6-where", "-o", "out-%j.txt", "job.sh", cwd=tmp_path)
    log = tmp_path / f"out-{job_id}.txt"
    try:
        _wait(lambda: (tmp_path / "step.txt.started").exists(), "the step starting", 600, job_id, log)
        sent = hpctrain("debug", "preempt", job_id)
        assert sent.returncode == 0, sent.stderr
        target = "its batch shell" if batch else "its job steps"
        assert f"sent USR1 to job {job_id} ({target}), as Slurm would 60 s before its time limit" in sent.stdout
        if batch:
            # The batch shell's trap ran; the step saw nothing (end it so the job finishes).
            _wait(lambda: (tmp_path / "batch.txt").exists(), "the batch shell's trap", 60, job_id, log)
            time.sleep(1.0)
            assert not (tmp_path / "step.txt").exists()
            slurm_cluster.cancel_quietly(job_id)
        else:
            _wait(lambda: (tmp_path / "step.txt").exists(), "the step's handler", 60, job_id, log)
            assert (tmp_path / "step.txt").read_text() == "USR1"
            slurm_cluster.wait_state(job_id, {"COMPLETED"}, timeout_s=60)
            assert not (tmp_path / "batch.txt").exists()
    finally:
        slurm_cluster.cancel_quietly(job_id)


@pytest.mark.slurm
def test_a_job_that_just_started_is_warned_only_once_its_trap_is_set(slurm_cluster, tmp_path: Path) -> None:
    """A batch shell dies of USR1 until it has installed its trap (hpctrain's scripts do that after starting the
    step): `debug preempt` right after the start must not turn a rehearsal into a failed job."""
    (tmp_path / "job.sh").write_text(
        "#!/bin/bash\n"
        "#SBATCH --signal=B:USR1@60\n"
        "sleep 2\n"  # the set-up before the trap, stretched
        "trap 'echo got-USR1 > trap.txt' USR1\n"
        "for _ in $(seq 600); do [ -f trap.txt ] && exit 0; sleep 0.1; done\n"
        "exit 3\n"
    )
    job_id = slurm_cluster.sbatch("-J", "h6-early", "-o", "out-%j.txt", "job.sh", cwd=tmp_path)
    try:
        slurm_cluster.wait_state(job_id, {"RUNNING"})
        sent = hpctrain("debug", "preempt", job_id)
        assert sent.returncode == 0, sent.stderr
        slurm_cluster.wait_state(job_id, {"COMPLETED", "FAILED"}, timeout_s=90)
        assert slurm_cluster.state(job_id) == "COMPLETED", (tmp_path / f"out-{job_id}.txt").read_text()
        assert (tmp_path / "trap.txt").read_text() == "got-USR1\n"
    finally:
        slurm_cluster.cancel_quietly(job_id)
