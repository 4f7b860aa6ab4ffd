"""The rendered batch script's signal path on the real local Slurm cluster: the time-limit warning
(--signal=B:USR1@GRACE) reaches every worker through srun and torchrun, the script requeues the job within its
budget, and scancel reaches the workers as SIGTERM without a requeue. Workers are small Python scripts that
record the signals they get; the training loop's own handling is tested with the recipes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_fixtures import Job, slurm_cluster  # noqa: F401  (the shared session fixture)
from test_submit_slurm import hpctrain, job_log, slurm, wait_gone  # noqa: F401 (slurm is a fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

WORKER = """\
import os, signal, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append("USR1"))
signal.signal(signal.SIGTERM, lambda s, f: got.append("TERM"))
run_dir = os.environ["HPCTRAIN_RUN_DIR"]
rank = os.environ.get("RANK") or os.environ["SLURM_PROCID"]  # torchrun, or one srun task per process
open(os.path.join(run_dir, "handles_signals"), "w").close()  # says it handles USR1, as StopRequest().install() does
attempt = os.environ.get("SLURM_RESTART_COUNT", "0")
open(os.path.join(run_dir, f"started-{attempt}-{rank}"), "w").close()
if attempt == "0":
    deadline = time.time() + 600  # only for a test that failed elsewhere: the warning comes within a minute
    while not got and time.time() < deadline:
        time.sleep(0.1)
    with open(os.path.join(run_dir, f"signals-{attempt}-{rank}"), "w") as f:
        f.write(",".join(got))
    if rank == "0":
        with open(os.path.join(run_dir, "stop_reason"), "w") as f:
            f.write("preempted" if got and got[0] == "USR1" else "cancelled")
else:
    if rank == "0" and os.path.exists(os.path.join(run_dir, "stop_reason")):
        os.remove(os.path.join(run_dir, "stop_reason"))  # this attempt completes
"""


def scontrol_field(job_id: str, field: str) -> str | None:
    text = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    for word in text.split():
        if word.startswith(field + "="):
            return word.split("=", 1)[1]
    return None


def submit_worker(tmp_path: Path, *options: str, launcher: str = "torchrun") -> tuple[str, Path]:
    (tmp_path / "worker.py").write_text(WORKER)
    proc = hpctrain(
        "submit",
        "--launcher",
        launcher,
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--job-name",
        "sig",
        "--output",
        "job-%j.out",
        *options,
        "--",
        sys.executable,
        "worker.py",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    return job_id, tmp_path / "runs" / f"sig-{job_id}"


def wait_for(condition, what: str, timeout: float, job_id: str, tmp_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id])
            pytest.fail(f"{what} did not happen within {timeout} s:\n{job_log(tmp_path, job_id)}")
        time.sleep(0.5)


# torchrun is the hard path (the agents must forward USR1); srun's forwarding is covered by the recipe test below
# (launcher single = one srun task) and by test_render.py.
@pytest.mark.parametrize("launcher", ["torchrun"])
def test_time_limit_warning_reaches_every_worker_and_requeues(
    slurm, slurm_cluster, tmp_path: Path, launcher: str
) -> None:
    job_id, run_dir = submit_worker(tmp_path, "--time", "30", "--max-requeues", "1", launcher=launcher)
    # Attempt 1: once every worker has its handler, Slurm's time-limit pass warns the batch shell (the test brings
    # the limit close: no race with the workers' start-up on a slow or busy CPU); every worker must see USR1.
    wait_for(lambda: len(list(run_dir.glob("started-0-*"))) == 4, "4 workers starting", 600, job_id, tmp_path)
    slurm_cluster.warn_soon(job_id)
    wait_for(
        lambda: len(list(run_dir.glob("signals-0-*"))) == 4, "the warning reaching 4 workers", 240, job_id, tmp_path
    )
    # (slurmstepd may deliver it to the whole process tree as well as torchrun forwarding it: twice is fine,
    # since the handler only sets a flag)
    signals = [set(p.read_text().split(",")) for p in run_dir.glob("signals-0-*")]
    assert signals == [{"USR1"}] * 4, (signals, job_log(tmp_path, job_id))
    # The script requeues. The requeued job waits (BeginTime) until the old attempt's credential expires: 30 s on
    # the local cluster. Releasing it sooner by hand gets it killed ("Job credential revoked"), so wait.
    slurm_cluster.restore_time_limit(job_id)
    wait_gone(job_id, timeout=300)
    log = job_log(tmp_path, job_id)
    assert "requeueing job" in log and "attempt 2" in log, log
    assert len(list(run_dir.glob("started-1-*"))) == 4, log
    assert not (run_dir / "stop_reason").exists()
    state = scontrol_field(job_id, "JobState")
    assert state in ("COMPLETED", None), log  # None: the controller already forgot the finished job


@pytest.mark.fresh_steps(processes=6)  # scancel's TERM through fresh torchrun agents: 2 agents, 4 workers
def test_scancel_reaches_workers_as_term_and_does_not_requeue(slurm, tmp_path: Path) -> None:
    job_id, run_dir = submit_worker(tmp_path, "--time", "10")
    wait_for(lambda: len(list(run_dir.glob("started-0-*"))) == 4, "4 workers starting", 600, job_id, tmp_path)
    subprocess.run(["scancel", job_id], check=True)
    wait_gone(job_id, timeout=120)
    signals = sorted(p.read_text() for p in run_dir.glob("signals-0-*"))
    assert len(signals) == 4 and all(s.startswith("TERM") for s in signals), (signals, job_log(tmp_path, job_id))
    assert (run_dir / "stop_reason").read_text() == "cancelled"
    assert "requeueing" not in job_log(tmp_path, job_id)
    assert scontrol_field(job_id, "Restarts") in ("0", None)


IGNORES = """\
import os, pathlib, time
pathlib.Path(os.environ["HPCTRAIN_RUN_DIR"], "started").touch()
time.sleep(600)  # never handles SIGUSR1: Python's default action for it ends the process
"""


def test_a_program_that_never_said_it_handles_the_warning_is_not_sent_it_nor_requeued(slurm, tmp_path: Path) -> None:
    (tmp_path / "ignores.py").write_text(IGNORES)
    proc = hpctrain(
        "submit",
        "--nodes",
        "1",
        "--nproc-per-node",
        "1",
        "--job-name",
        "ign",
        "--output",
        "job-%j.out",
        "--time",
        "10",
        "--",
        sys.executable,
        "ignores.py",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "hpctrain submit: note: time limit: ignores.py does not use hpctrain.training.StopRequest, which says it "
        "handles SIGUSR1; a program that does not say so gets no SIGUSR1"
    ) in proc.stderr
    job_id = proc.stdout.strip()
    run_dir = tmp_path / "runs" / f"ign-{job_id}"
    try:
        wait_for(lambda: (run_dir / "started").exists(), "the program starting", 600, job_id, tmp_path)
        preempt = hpctrain("debug", "preempt", job_id, "--follow", "--timeout", "60", cwd=tmp_path)
        assert preempt.returncode == 1, preempt.stdout + preempt.stderr
        assert f"job {job_id}'s program has not said it handles USR1" in preempt.stdout
        assert "requeued itself" not in preempt.stdout
        wait_for(lambda: "not passed on" in job_log(tmp_path, job_id), "the batch script's word", 60, job_id, tmp_path)
        assert scontrol_field(job_id, "JobState") == "RUNNING", job_log(tmp_path, job_id)  # alive, not killed
        assert scontrol_field(job_id, "Restarts") == "0"
    finally:
        subprocess.run(["scancel", job_id])
    wait_gone(job_id, timeout=120)
    assert "requeueing" not in job_log(tmp_path, job_id)


# The warning lands a few steps into epoch 1 (LocalSlurm.warn_mid_run), whatever the CPU's speed: a short run will do.
RECIPE_EPOCHS = 2


def test_recipe_outlives_its_time_limit_by_requeueing(
    slurm, slurm_cluster, tmp_path: Path, fashion_data_dir: Path
) -> None:
    """The training loop and the batch script together: warned before the limit, the run checkpoints mid-epoch and
    stops, the script requeues the job, and the next attempt resumes (SLURM_RESTART_COUNT) until it completes."""
    # --wait must follow the job through its requeues and report the final attempt's status.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpctrain",
            "submit",
            "--wait",
            "--launcher",
            "single",
            "--time",
            "30",
            "--max-requeues",
            "6",
            "--output",
            "job-%j.out",
            "train",
            "mnist",
            "--recipe",
            "classic",
            "--dataset",
            "fashion-mnist",
            "--data-dir",
            str(fashion_data_dir),
            "--train-limit",
            "2048",
            "--test-limit",
            "500",
            "--epochs",
            str(RECIPE_EPOCHS),
            "--log-interval",
            "5",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    job_id = proc.stdout.readline().strip()
    assert job_id.isdigit(), proc.communicate()[1]
    run_dir = tmp_path / "runs" / f"mnist-fashion-mnist-classic-{job_id}"
    Job(job_id, tmp_path, run_dir).wait_until_training()
    slurm_cluster.warn_mid_run(job_id, processes=1)
    # A requeued job is held (reason BeginTime) until the old attempt's credential expires (30 s here); releasing
    # it by hand sooner gets it killed ("Job credential revoked"), so it is left alone, with a long limit again.
    slurm_cluster.restore_time_limit(job_id)
    deadline = time.monotonic() + 600
    while proc.poll() is None:
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id])
            proc.kill()
            pytest.fail(f"job {job_id} did not complete:\n{job_log(tmp_path, job_id)}")
        time.sleep(1)
    _, err = proc.communicate()
    assert proc.returncode == 0, err + job_log(tmp_path, job_id)
    assert "ended COMPLETED" in err and "attempt 2" in err, err
    log = job_log(tmp_path, job_id)
    assert "requeueing job" in log and "attempt 2" in log, log
    assert re.search(r"resumed at epoch [1-9]\d*, step \d+ of", log), log  # wherever the warning landed
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert metrics and metrics[-1]["epoch"] == RECIPE_EPOCHS, metrics
    assert (run_dir / "stop_reason").read_text().strip() == "completed"
    assert scontrol_field(job_id, "JobState") in ("COMPLETED", None), log


CRASHER = """\
import glob, os, signal, time
run_dir, rank = os.environ["HPCTRAIN_RUN_DIR"], os.environ["RANK"]
marker = os.path.join(run_dir, "killed")
first_group = not os.path.exists(marker)
open(os.path.join(run_dir, f"ran-{rank}-{os.getpid()}"), "w").close()
if first_group:
    if rank == "3":
        # A worker dies hard, once, when every rank of the group is running, however slowly they started.
        while len(glob.glob(os.path.join(run_dir, "ran-*"))) < 4:
            time.sleep(0.1)
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(300)  # until the agents stop the group to restart it (the bound is for a broken test only)
"""


def test_killed_worker_is_restarted_under_max_restarts(slurm, tmp_path: Path) -> None:
    (tmp_path / "crasher.py").write_text(CRASHER)
    proc = hpctrain(
        "submit",
        "--wait",
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--time",
        "5",
        "--job-name",
        "crash",
        "--output",
        "job-%j.out",
        "--",
        sys.executable,
        "crasher.py",
        cwd=tmp_path,
    )
    job_id = proc.stdout.strip()
    log = job_log(tmp_path, job_id)
    assert proc.returncode == 0, proc.stderr + log  # without the restart, torchrun and so the job would fail
    run_dir = tmp_path / "runs" / f"crash-{job_id}"
    assert (run_dir / "killed").exists() and "exitcode: -9" in log, log
    started = [p.name.split("-")[1] for p in run_dir.glob("ran-*")]
    # every rank ran in the first group and again in the restarted one
    assert sorted(set(started)) == ["0", "1", "2", "3"] and all(started.count(r) >= 2 for r in "0123"), (started, log)
