"""Issue 4's contract on the real local Slurm cluster: a `train mnist` job stopped by its time limit, by a requeue
(what preemption does) or by `hpctrain cancel` resumes exactly. Its final weights are bitwise equal to those of an
uninterrupted local run of the same configuration, and every attempt resumed at the step after the checkpoint the
previous one wrote.

The jobs are small (classic recipe, a few thousand Fashion-MNIST images, one torch thread per process) so that the
numerics of a Slurm job and of a local run are the same. Nothing here depends on how fast the CPU trains: the
time-limit jobs are warned by Slurm itself, but at a moment the test chooses (`LocalSlurm.warn_mid_run` pauses the
training, shortens the job's limit until Slurm's time-limit pass sends the warning, and lets the training go on once
the warning is pending), and the requeued attempt gets a long limit back, so it always completes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest

from slurm_fixtures import Job, attempts, shared_run
from training_helpers import assert_bitwise_equal, final_weights, hpctrain, ok, run_torchrun, start_hpctrain

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# The training every job here runs; the local reference runs the same options. 2048 images, batch 64: 32 steps/epoch.
TRAIN_LIMIT = 2048
STEPS_PER_EPOCH = TRAIN_LIMIT // 64
TRAIN = [
    "--recipe",
    "classic",
    "--dataset",
    "fashion-mnist",
    "--train-limit",
    str(TRAIN_LIMIT),
    "--test-limit",
    "500",
    "--threads",
    "1",
    "--log-interval",
    "5",
]
# The number of epochs only has to leave room for a stop inside the run: the interruptions land a few steps in,
# whatever the machine's speed (the training processes are paused while the signal is sent: interrupt_mid_run).
SINGLE_EPOCHS = 2
DDP_EPOCHS = 2
# A limit that no attempt reaches by itself; the warning (hpctrain's default grace, 120 s) is brought on by the test.
TIME_LIMIT = ["--time", "30"]

_RESUMED = re.compile(r"hpctrain: resumed at epoch (\d+), step (\d+) of (\d+) \(global step (\d+)\)")
_STOPPED = re.compile(r"hpctrain: stopped \((\w+): [^)]*\) at global step (\d+) after writing a checkpoint")
_EPOCH_DONE = re.compile(r"hpctrain: epoch (\d+)/\d+: train loss")


# ---------------------------------------------------------------- helpers


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}


def reference_run(
    run_dir: Path,
    data_dir: Path,
    epochs: int,
    nproc: int = 1,
    extra: tuple[str, ...] | list[str] = (),
) -> dict:
    """A local run (uninterrupted unless `extra` says otherwise); its final weights. Several processes are started
    with a local torchrun: `train --nproc 4` refuses to start more processes than a 2-core machine has cores."""
    args = [
        "train",
        "mnist",
        *TRAIN,
        "--data-dir",
        str(data_dir),
        "--epochs",
        str(epochs),
        "--run-dir",
        str(run_dir),
        *extra,
    ]
    if nproc == 1:
        ok(hpctrain(*args, timeout=600))
    else:
        ok(run_torchrun(["--standalone", f"--nproc-per-node={nproc}"], ["-m", "hpctrain"], args))
    return final_weights(run_dir)


# The reference runs are shared by the session and made in the background from the first test that asks for one:
# they take the CPU while that test's Slurm job waits (for its start, Slurm's time-limit pass, the requeue hold). A
# test asks for the result (calls the fixture's value) only once its job has ended.


@pytest.fixture(scope="session")
def single_reference(tmp_path_factory, fashion_data_dir: Path) -> Iterator[Callable[[], dict]]:
    """The final weights of one uninterrupted local run."""

    def make() -> dict:
        run = partial(reference_run, data_dir=fashion_data_dir, epochs=SINGLE_EPOCHS)
        return final_weights(shared_run(tmp_path_factory, "single-reference", run))

    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(make).result


@pytest.fixture(scope="session")
def ddp_reference(tmp_path_factory, fashion_data_dir: Path) -> Iterator[Callable[[], Path]]:
    """One uninterrupted local 4-process run: its final weights are what the 2x2 Slurm job must end with, and its
    mid-epoch checkpoints are where the local resume test starts (checkpoints do not change the numbers)."""
    extra = ["--checkpoint-every", "40", "--keep-checkpoints", "9"]
    run = partial(reference_run, data_dir=fashion_data_dir, epochs=DDP_EPOCHS, nproc=4, extra=extra)

    def make() -> Path:
        return shared_run(tmp_path_factory, "ddp-reference", run)

    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(make).result


def scontrol_fields(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    return dict(word.split("=", 1) for word in out.split() if "=" in word)


def submit(tmp_path: Path, data_dir: Path, epochs: int, *options: str) -> Job:
    result = hpctrain(
        "submit",
        "--output",
        "job-%j.out",
        *options,
        "train",
        "mnist",
        *TRAIN,
        "--data-dir",
        str(data_dir),
        "--epochs",
        str(epochs),
        cwd=tmp_path,
    )
    job_id = ok(result).stdout.strip()
    assert job_id.isdigit(), result.stdout
    return Job(job_id, tmp_path, tmp_path / "runs" / f"mnist-fashion-mnist-classic-{job_id}")


def check_resumes(log: str) -> list[tuple[str, int, int]]:
    """Every attempt after the first resumed at the step after the newest checkpoint written before it (a stop
    checkpoint, or an epoch-end one). Returns each attempt's stop: (reason, global step, step within its epoch)."""
    parts = attempts(log)
    assert parts, log
    saved, stops = 0, []
    for number, text in enumerate(parts, start=1):
        resumed = _RESUMED.search(text)
        if number == 1 or saved == 0:
            assert resumed is None, f"attempt {number} resumed although nothing was saved before it:\n{log}"
        else:
            assert resumed, f"attempt {number} did not resume from the checkpoint at global step {saved}:\n{log}"
            epoch, in_epoch, per_epoch, step = map(int, resumed.groups())
            assert (step, per_epoch) == (saved, STEPS_PER_EPOCH), (
                f"attempt {number}: {resumed.group(0)!r}, but the newest checkpoint was at global step {saved}:\n{log}"
            )
            assert (epoch - 1) * per_epoch + in_epoch == step, resumed.group(0)
        for done in _EPOCH_DONE.finditer(text):
            saved = int(done.group(1)) * STEPS_PER_EPOCH
        stopped = _STOPPED.search(text)
        if stopped:
            saved = int(stopped.group(2))
            stops.append((stopped.group(1), saved, saved % STEPS_PER_EPOCH))
    return stops


def metrics_epochs(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record["epoch"] for record in map(json.loads, filter(str.strip, lines)) if "test_loss" in record]


def assert_time_limit_run(job: Job, epochs: int, reference: dict) -> None:
    log = job.log
    parts = attempts(log)
    assert len(parts) >= 2, f"the first attempt was never interrupted (make the training longer):\n{log}"
    assert "time-limit warning (USR1)" in parts[0] and "requeueing job" in parts[0], log
    # A planned stop reads as one: no traceback (torchrun's SignalException), no failed step before the requeue.
    assert "Traceback" not in log and "SignalException" not in log and not re.search(r"exit code 1\b", log), log
    if "torchrun rendezvous" in parts[0]:
        assert "stopped its workers on SIGUSR1 as planned (exit status 75)" in parts[0], log
    stops = check_resumes(log)
    preempted = [(step, in_epoch) for reason, step, in_epoch in stops if reason == "preempted"]
    assert preempted, f"no attempt checkpointed after the warning:\n{log}"
    # The stop checkpoint lands where the warning came, a step or two into the first epoch (Job.wait_until_training);
    # the next attempt resumes from it (check_resumes) and ends with the reference weights. The mid-epoch case on
    # its own is test_ddp_resume_from_a_mid_epoch_checkpoint_is_exact_locally.
    assert all(0 <= in_epoch < STEPS_PER_EPOCH for _, in_epoch in preempted), (preempted, log)
    assert "step finished with exit status 0" in parts[-1], log
    # A run that had finished is never requeued (see DDP_REQUEUE_AFTER_COMPLETION).
    assert f"resumed at epoch {epochs + 1}," not in log, log
    assert scontrol_fields(job.job_id).get("JobState") in ("COMPLETED", None), log
    assert (job.run_dir / "stop_reason").read_text().strip() == "completed", log
    assert metrics_epochs(job.run_dir)[-1] == epochs
    assert_bitwise_equal(final_weights(job.run_dir), reference)


# ---------------------------------------------------------------- tests


def test_time_limit_requeues_until_done_and_matches_an_uninterrupted_run(
    slurm_cluster, tmp_path: Path, fashion_data_dir: Path, single_reference: Callable[[], dict]
) -> None:
    job = submit(tmp_path, fashion_data_dir, SINGLE_EPOCHS, "--launcher", "single", *TIME_LIMIT, "--max-requeues", "8")
    job.wait_until_training()
    slurm_cluster.warn_mid_run(job.job_id, processes=1)
    slurm_cluster.restore_time_limit(job.job_id)
    job.follow()
    assert_time_limit_run(job, SINGLE_EPOCHS, single_reference())


@pytest.mark.fresh_steps(processes=12)  # 2 attempts of 2 torchrun agents and 4 ranks, fresh
@pytest.mark.floor
def test_ddp_2x2_time_limit_requeues_and_matches_a_local_4_process_run(
    slurm_cluster, tmp_path: Path, fashion_data_dir: Path, ddp_reference: Callable[[], Path]
) -> None:
    # Same global batch, split over 4 ranks in both. gloo's sums are the same whether the 4 ranks sit on one node
    # or on two: before its first resume the 2x2 job's per-epoch losses equal the local run's to the last bit.
    job = submit(
        tmp_path,
        fashion_data_dir,
        DDP_EPOCHS,
        "--launcher",
        "torchrun",
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        *TIME_LIMIT,
        "--max-requeues",
        "8",
    )
    job.wait_until_training()
    slurm_cluster.warn_mid_run(job.job_id, processes=4)
    slurm_cluster.restore_time_limit(job.job_id)
    job.follow()
    assert "4 process(es), ddp" in job.log, job.log
    assert_time_limit_run(job, DDP_EPOCHS, final_weights(ddp_reference()))


def test_ddp_resume_from_a_mid_epoch_checkpoint_is_exact_locally(
    tmp_path: Path, fashion_data_dir: Path, ddp_reference: Callable[[], Path]
) -> None:
    """The DDP resume contract in its smallest form, without Slurm: 4 local processes, resumed from a mid-epoch
    checkpoint of an uninterrupted run, end with its weights (DDP must not regroup its gradient buckets)."""
    reference = ddp_reference()
    mid_epoch = reference / "checkpoints" / "checkpoint_step_40.pt"
    assert 0 < 40 % STEPS_PER_EPOCH, "step 40 must lie inside an epoch"
    resumed = reference_run(
        tmp_path / "resumed", fashion_data_dir, DDP_EPOCHS, nproc=4, extra=["--resume", str(mid_epoch)]
    )
    assert_bitwise_equal(resumed, final_weights(reference))


def test_scontrol_requeue_of_a_running_job_resumes_exactly(
    slurm_cluster, tmp_path: Path, fashion_data_dir: Path, single_reference: Callable[[], dict]
) -> None:
    """What preemption with requeue does: Slurm itself requeues the job and sends SIGTERM; the run checkpoints,
    and the next attempt resumes on its own (SLURM_RESTART_COUNT > 0)."""
    job = submit(tmp_path, fashion_data_dir, SINGLE_EPOCHS, "--launcher", "single", "--time", "20")
    job.wait_until_training()
    slurm_cluster.interrupt_mid_run(
        job.job_id,
        1,
        signal.SIGTERM,
        lambda: subprocess.run(["scontrol", "requeue", job.job_id], check=True, capture_output=True),
    )
    job.follow()
    log = job.log
    parts = attempts(log)
    assert len(parts) == 2, log
    stops = check_resumes(log)
    assert [reason for reason, _, _ in stops] == ["cancelled"], log  # SIGTERM, at the step boundary after it
    assert "requeueing job" not in log, log  # Slurm requeued it, not the batch script
    assert "step finished with exit status 0" in parts[-1], log
    assert scontrol_fields(job.job_id).get("JobState") in ("COMPLETED", None), log
    assert (job.run_dir / "stop_reason").read_text().strip() == "completed", log
    assert_bitwise_equal(final_weights(job.run_dir), single_reference())


def test_hpctrain_cancel_checkpoints_without_requeue_and_resumes_locally(
    slurm_cluster, tmp_path: Path, fashion_data_dir: Path, single_reference: Callable[[], dict]
) -> None:
    from hpctrain import checkpoint

    job = submit(tmp_path, fashion_data_dir, SINGLE_EPOCHS, "--launcher", "single", "--time", "20")
    job.wait_until_training()
    # `cancel --wait` returns once the job has ended: it runs on while the training, paused, receives the SIGTERM.
    cancel = slurm_cluster.interrupt_mid_run(
        job.job_id,
        1,
        signal.SIGTERM,
        lambda: subprocess.Popen(
            [sys.executable, "-m", "hpctrain", "cancel", job.job_id, "--wait", "120"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
    )
    out, err = cancel.communicate(timeout=300)
    assert cancel.returncode == 0, out + err
    job.follow(timeout=120)
    log = job.log
    assert len(attempts(log)) == 1 and "requeueing" not in log, log
    [(reason, step, _)] = check_resumes(log)
    assert reason == "cancelled", log
    status = json.loads(ok(hpctrain("status", job.job_id, "--json", cwd=tmp_path)).stdout)
    assert (status["state"], status["restarts"]) == ("CANCELLED", 0), status
    assert "CANCELLED" in ok(hpctrain("status", job.job_id, cwd=tmp_path)).stdout
    assert (job.run_dir / "stop_reason").read_text().strip() == "cancelled"
    info = checkpoint.find_latest(job.run_dir / "checkpoints")
    assert info is not None and info.step == step < SINGLE_EPOCHS * STEPS_PER_EPOCH, (info, log)

    # The same run continues here, to the end, from that checkpoint.
    resumed = ok(
        hpctrain(
            "train",
            "mnist",
            *TRAIN,
            "--data-dir",
            str(fashion_data_dir),
            "--epochs",
            str(SINGLE_EPOCHS),
            "--resume",
            "--run-dir",
            str(job.run_dir),
            timeout=600,
        )
    )
    match = _RESUMED.search(resumed.stdout)
    assert match and int(match.group(4)) == step, resumed.stdout
    assert (job.run_dir / "stop_reason").read_text().strip() == "completed"
    assert metrics_epochs(job.run_dir)[-1] == SINGLE_EPOCHS
    assert_bitwise_equal(final_weights(job.run_dir), single_reference())


def test_hpctrain_cancel_of_a_2x2_torchrun_job_stops_cleanly(
    slurm_cluster, tmp_path: Path, fashion_data_dir: Path
) -> None:
    """A cancel is planned: the workers checkpoint and stop (143) and nothing in the log looks like a crash (before:
    each torchrun agent's SignalException traceback). Slurm ends the job itself (CANCELLED) once its KillWait is
    over, so the agents' and the batch script's last lines may or may not make it into the log."""
    job = submit(
        tmp_path,
        fashion_data_dir,
        DDP_EPOCHS,
        "--launcher",
        "torchrun",
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--time",
        "20",
    )
    job.wait_until_training()
    # The four ranks are paused while the cancel's SIGTERM reaches them, so it lands mid-run however fast they train
    # (CI run n: unpaused, the 2,048 x 2 run had finished before it arrived).
    cancel = slurm_cluster.interrupt_mid_run(
        job.job_id, 4, signal.SIGTERM, lambda: start_hpctrain("cancel", job.job_id, "--wait", "120", cwd=tmp_path)
    )
    out, _ = cancel.communicate(timeout=300)
    assert cancel.returncode == 0, out
    job.follow(timeout=120)
    log = job.log
    assert "Traceback" not in log and "SignalException" not in log and not re.search(r"exit code 1\b", log), log
    assert re.search(r"stopped \(cancelled: SIGTERM received\) at global step \d+ after writing a checkpoint", log), log
    assert "requeueing" not in log and "stopped its workers on SIGUSR1" not in log, log
    assert (job.run_dir / "stop_reason").read_text().strip() == "cancelled", log
