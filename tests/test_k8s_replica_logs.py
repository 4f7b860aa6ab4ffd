"""Each replica's output kept where it outlives the pod (schedulers/kubernetes/queries/replica_logs.py): the in-pod
program
KEEP_LOG run for real here (this machine's python3, real processes, real signals, real files) as the pods run it,
and the readers over what it wrote. The pods themselves: tests/test_k8s_real_jobs.py."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.errors import UserError
from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.schedulers.kubernetes.checks.submit_host import path_here
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
from hpctrain.schedulers.kubernetes.manifests.render import render
from hpctrain.schedulers.kubernetes.queries.replica_logs import (
    run_dir_here,
    failed_tails,
    keep_log,
    kept_dir,
    kept_lines,
    kept_logs,
)

HOST = socket.gethostname()


def run(log_dir: Path, *command: str, **kw) -> subprocess.CompletedProcess[str]:
    assert log_dir.name == "pod-logs"
    return subprocess.run(
        keep_log([*command], str(log_dir.parent)),
        capture_output=True,
        text=True,
        timeout=60,
        **kw,
    )


def test_the_output_is_kept_beside_the_log_and_the_exit_status_passed_on(tmp_path: Path) -> None:
    logs = tmp_path / "run" / "pod-logs"
    code = "import sys; print('step 1'); print('boom', file=sys.stderr); sys.exit(3)"
    first = run(logs, sys.executable, "-c", code)
    assert first.returncode == 3
    assert "step 1\n" in first.stdout and "boom\n" in first.stdout  # both streams reach the container's log
    again = run(logs, sys.executable, "-c", "print('second start')")  # a restart in place appends
    assert again.returncode == 0
    kept = (logs / f"{HOST}.log").read_text().splitlines()
    assert kept[0].startswith(f"---- hpctrain: {HOST} started ")
    assert kept[1:4] == ["step 1", "boom", f"---- hpctrain: {HOST} exited with status 3"]
    assert kept[5:] == ["second start", f"---- hpctrain: {HOST} exited with status 0"]
    # The last run succeeded: no failed tail. A third, failed run is the one shown.
    assert failed_tails(logs, "job") == ()
    assert run(logs, sys.executable, "-c", code).returncode == 3
    tail = failed_tails(logs, "job", lines=4)
    assert tail[1:] == (f"{HOST}: step 1", f"{HOST}: boom", f"{HOST}: ---- hpctrain: {HOST} exited with status 3")
    assert tail[0].startswith(f"{HOST}: ---- hpctrain: {HOST} started ")
    assert list(kept_logs(logs, "job")) == [HOST]


def test_a_missing_command_is_127_and_said(tmp_path: Path) -> None:
    logs = tmp_path / "run" / "pod-logs"
    proc = run(logs, "/nonexistent/train")
    assert proc.returncode == 127 and "hpctrain: cannot run /nonexistent/train" in proc.stdout
    assert failed_tails(logs, "job")[-2].startswith(f"{HOST}: hpctrain: cannot run /nonexistent/train")


def test_signals_reach_the_command_and_its_status_is_the_pods(tmp_path: Path) -> None:
    """The container's SIGTERM (a cancel, an eviction) goes to the command, which checkpoints and exits as it
    chooses; a command killed by a signal N ends the container with 128+N."""
    logs = tmp_path / "run" / "pod-logs"
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('checkpoint written', flush=True), sys.exit(75)))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    argv = keep_log([sys.executable, "-c", code], str(logs.parent))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("---- hpctrain:") and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 75 and "checkpoint written" in out
    killed = run(logs, sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.returncode == 128 + signal.SIGKILL
    assert (logs / f"{HOST}.log").read_text().endswith(f"exited with status {128 + signal.SIGKILL}\n")


def test_a_planted_link_is_not_written_through(tmp_path: Path) -> None:
    logs = tmp_path / "run" / "pod-logs"
    logs.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    (logs / f"{HOST}.log").symlink_to(victim)
    proc = run(logs, sys.executable, "-c", "print('hello')")
    assert proc.returncode == 0 and "hello" in proc.stdout
    assert "this log is not kept in" in proc.stderr
    assert victim.read_text() == "keep me\n"
    with pytest.raises(UserError, match="symbolic link"):
        list(kept_lines(logs / f"{HOST}.log", logs.parent))


def test_a_long_log_is_read_by_its_tail(tmp_path: Path) -> None:
    logs = tmp_path / "run" / "pod-logs"
    code = "import sys\nfor i in range(200000): print('line', i)\nprint(b'\\xff bad'.decode('latin-1'))\nsys.exit(1)"
    assert run(logs, sys.executable, "-c", code).returncode == 1
    tail = failed_tails(logs, "job", lines=3)
    assert tail == (
        f"{HOST}: line 199999",
        f"{HOST}: \u00ff bad",
        f"{HOST}: ---- hpctrain: {HOST} exited with status 1",
    )
    assert sum(1 for _ in kept_lines(logs / f"{HOST}.log", logs.parent)) == 200003


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_the_run_directory_is_found_from_the_job_object(tmp_path: Path, api: str) -> None:
    """`status` and `logs` know only the job object: its HPCTRAIN_RUN_DIR and its volumes say where this machine
    sees the kept logs (a host path volume that exists here)."""
    job = JobSpec(command=("python3", "train.py"), name="tj", run_dir="/mnt/runs/%j", resources=Resources(nodes=2))
    options = KubernetesOptions(api=api, image="img", volumes=(f"host:{tmp_path}:/mnt/runs",))
    manifest = render(job, options)
    assert kept_dir(manifest, path_here) == tmp_path / "tj" / "pod-logs"
    assert run_dir_here(manifest, path_here) == tmp_path / "tj"  # the web console's plots, `status JOB`'s ranks
    elsewhere = KubernetesOptions(api=api, image="img", volumes=("host:/nonexistent/runs:/mnt/runs",))
    assert kept_dir(render(job, elsewhere), path_here) is None
    assert run_dir_here(render(job, elsewhere), path_here) is None
    assert kept_dir(render(job.replace(run_dir=None), options), path_here) is None


def test_replica_names_are_the_host_names_less_the_job(tmp_path: Path) -> None:
    for host in ("tj-master-0", "tj-worker-1", "other"):
        (tmp_path / f"{host}.log").write_text("")
    (tmp_path / "notes.txt").write_text("")
    assert list(kept_logs(tmp_path, "tj")) == ["master-0", "other", "worker-1"]


def test_status_of_a_job_whose_run_directory_is_seen_here_shows_each_rank(tmp_path: Path) -> None:
    """`hpctrain status JOB` (and the web console's job page) on Kubernetes: with the run directory seen through the
    pods' volume, rank 0's live record (what the training loop writes) is a line, as for a Slurm job."""
    from hpctrain.health.progress import ProgressRecorder
    from hpctrain.schedulers.base import JobStatus, ReplicaStatus
    from hpctrain.schedulers.kubernetes.queries.display import job_view

    recorder = ProgressRecorder(tmp_path, 0, 1, "tj-master-0", steps_per_epoch=32)
    recorder.step(1, 5, 5, 64, 0.02, 0.005, 0.01)
    status = JobStatus(job_id="tj", state="RUNNING", replicas=(ReplicaStatus(name="master-0", phase="Running"),))
    lines = [p for p in job_view(status, tmp_path).text_parts() if isinstance(p, str)]
    assert f"run dir: {tmp_path}" in lines
    rank = next(line for line in lines if line.lstrip().startswith("0 "))
    assert rank.split()[1:5] == ["tj-master-0", "training", "1", "5"], lines
    without = job_view(status)
    assert "ranks" not in without.records and not any("RANK" in p for p in without.parts if isinstance(p, str))
