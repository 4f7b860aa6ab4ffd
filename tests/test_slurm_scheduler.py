"""SlurmScheduler, the Slurm backend behind hpctrain's scheduler interface, on real jobs of the local Slurm cluster:
render -> submit -> status -> logs (whole and followed) -> cancel, through the neutral dataclasses."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from hpctrain.errors import UserError
from hpctrain.jobs import JobSpec
from hpctrain.schedulers import base, get_scheduler
from slurm_fixtures import slurm_cluster  # noqa: F401  (the shared session fixture)

pytestmark = pytest.mark.slurm
DEADLINE_S = 400  # other tests may hold the nodes; a bound on waiting, never asserted on


def wait_status(sched, job_id: str, done) -> base.JobStatus:
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        status = sched.status(job_id)
        if done(status):
            return status
        time.sleep(0.5)
    pytest.fail(f"job {job_id} never got there: {status}")


def test_slurm_scheduler_follows_a_job_through_the_interface(slurm_cluster, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    sched = get_scheduler("slurm", launcher="single", output=str(tmp_path / "out-%j.txt"), python=sys.executable)
    job = JobSpec(
        command=("sh", "-c", "echo one; echo two; exit 3"),
        name="iface-exit",
        run_dir=str(tmp_path / "run-%j"),
    )
    rendered = sched.render(job)
    assert rendered.filename == "job.sbatch" and rendered.text.startswith("#!")
    assert sched.check(job) == []
    job_id = sched.submit(job, rendered)
    try:
        ended = wait_status(sched, job_id, lambda s: s.finished)
        assert (ended.state, ended.exit_code) == (base.FAILED, 3)
        lines = list(sched.logs(job_id))
        assert "one" in lines and "two" in lines
        with pytest.raises(UserError, match="drop --replica"):
            sched.logs(job_id, replica="worker-1")
    finally:
        slurm_cluster.cancel_quietly(job_id)


def test_slurm_scheduler_cancel_and_follow(slurm_cluster, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    sched = get_scheduler("slurm", launcher="single", output=str(tmp_path / "out-%j.txt"), python=sys.executable)
    job = JobSpec(
        command=("sh", "-c", "echo started; sleep 300"),
        name="iface-cancel",
        run_dir=str(tmp_path / "run-%j"),
    )
    job_id = sched.submit(job, sched.render(job))
    try:
        assert job_id in [j.job_id for j in sched.list_jobs()]
        wait_status(sched, job_id, lambda s: s.state == base.RUNNING)
        followed = sched.logs(job_id, follow=True)
        assert "started" in iter(followed)  # reads up to the line (the script's attempt line comes first)
        sched.cancel(job_id)
        list(followed)  # ends once the job has ended
        assert wait_status(sched, job_id, lambda s: s.finished).state == base.CANCELLED
    finally:
        slurm_cluster.cancel_quietly(job_id)
    view = sched.cluster()
    assert {n.name for n in view.nodes} == set(slurm_cluster.nodes)
    assert all(n.cpu_allocatable > 0 and n.memory_allocatable > 0 for n in view.nodes)
    assert os.path.isfile(tmp_path / f"out-{job_id}.txt")
