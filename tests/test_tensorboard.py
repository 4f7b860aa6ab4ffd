"""`hpctrain tensorboard`: TensorBoard's own server on real event files (written by hpctrain's MetricsLog), here and
as a job on the local Slurm cluster; the scalars it serves over HTTP are compared with what TensorBoard's
EventAccumulator reads from the files. The TensorBoard pod on the local Kubernetes cluster's real node is
tests/test_k8s_real_jobs.py's test_tensorboard_on_cluster_through_a_real_port_forward."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from around_helpers import cli_env, hpctrain, venv_args
from hpctrain.errors import UserError
from hpctrain.servers.common import http_get
from hpctrain.servers.tensorboard import logdir_spec
from hpctrain.training.metrics import train_hint

TAG = "train/loss"


def make_run(directory: Path, losses: list[float]) -> Path:
    from hpctrain.training.metrics import MetricsLog

    directory.mkdir(parents=True)
    log = MetricsLog(directory, resumed_step=None)
    for step, loss in enumerate(losses):
        log.epoch({"step": (step + 1) * 10, "epoch": step, "train_loss": loss, "images_per_s": 100.0 + step})
    log.close()
    return directory


def expected(run_dir: Path) -> list[list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return [[e.step, pytest.approx(e.value, rel=1e-6)] for e in acc.Scalars(TAG)]


def served(base: str, run: str) -> list[list[float]]:
    query = urllib.parse.urlencode({"run": run, "tag": TAG})
    status, body = http_get(f"{base}/data/plugin/scalars/scalars?{query}")
    assert status == 200, status
    return [[step, value] for _wall, step, value in json.loads(body)]


def test_spec_names_runs_by_folder_and_refuses_commas(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a" / "mnist", [1.0])
    b = make_run(tmp_path / "b" / "mnist", [2.0])
    assert logdir_spec([a, b]) == f"a/mnist:{a}/tb,b/mnist:{b}/tb"
    with pytest.raises(UserError, match="no such run directory"):
        logdir_spec([tmp_path / "missing"])
    comma = tmp_path / "x,y"
    comma.mkdir()
    with pytest.raises(UserError, match="comma"):
        logdir_spec([comma])
    assert train_hint("runs/my run", {}) == "TensorBoard: hpctrain tensorboard 'runs/my run'"


def test_the_hint_in_a_kubernetes_pod_names_a_command_for_the_submitting_machine() -> None:
    """Issue 39 §18: in a pod the hint named the pod's path as if TensorBoard could read it where the user
    submitted. A job's pod (KUBERNETES_SERVICE_HOST, which Kubernetes sets in every container, and the
    HPCTRAIN_RUN_DIR the job's manifest sets) says to run TensorBoard on the cluster, on the job's volume."""
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "HPCTRAIN_RUN_DIR": "/data/runs/mnist"}  # as render sets it
    assert train_hint("runs/x", {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}).endswith("tensorboard runs/x")  # dev pod
    hint = train_hint("/data/runs/mnist", pod)
    assert hint == (
        "TensorBoard: where you submitted, hpctrain tensorboard --scheduler kubernetes --on-cluster --volume VOLUME "
        "/data/runs/mnist (a path in this job's pods; VOLUME: the --volume that holds it)"
    )


def test_on_cluster_refuses_the_other_schedulers_flags(tmp_path: Path) -> None:
    """--venv means nothing to a TensorBoard pod (the --image is its environment): refused with the fix before any
    cluster is asked (the kubeconfig named here does not exist), as `dev start` refuses it."""
    run = make_run(tmp_path / "mnist", [1.0])
    env = cli_env(tmp_path / "home", KUBECONFIG=str(tmp_path / "no-kubeconfig"))
    result = hpctrain(
        "tensorboard",
        str(run),
        "--on-cluster",
        "--scheduler",
        "kubernetes",
        "--image",
        "img",
        "--venv",
        str(tmp_path),
        env=env,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert (
        "--conda-env/--venv/--module/--mount apply to Slurm: on Kubernetes the --image is the environment"
        in result.stderr
    )


def test_local_server_serves_the_event_files(tmp_path: Path) -> None:
    one = make_run(tmp_path / "one", [2.5, 1.25, 0.75])
    two = make_run(tmp_path / "two", [3.0, 2.0])
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "tensorboard", str(one), str(two)],
        env=cli_env(tmp_path / "home"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        match = re.search(r"TensorBoard at (http://127\.0\.0\.1:\d+)/", line)
        assert match, line
        base = match[1]
        status, body = http_get(f"{base}/data/runs")
        # TensorBoard names a run NAME/SUBFOLDER within each named log dir: the event files sit in tb/ itself.
        assert status == 200 and set(json.loads(body)) == {"one/.", "two/."}
        for run_dir in (one, two):
            # TensorBoard loads in the background: poll (bounded) until all points are in.
            deadline = time.monotonic() + 120
            while len(served(base, f"{run_dir.name}/.")) < len(expected(run_dir)) and time.monotonic() < deadline:
                time.sleep(1)
            assert served(base, f"{run_dir.name}/.") == expected(run_dir)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def children(pid: int) -> list[int]:
    """The processes `pid` started (Linux /proc)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its (new) parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_the_server_dies_with_hpctrain_tensorboard_and_prints_its_url_once(tmp_path: Path, signum) -> None:
    one = make_run(tmp_path / "one", [2.5])
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "tensorboard", str(one)],
        env=cli_env(tmp_path / "home"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    servers: list[int] = []
    try:
        line = proc.stdout.readline()
        assert "TensorBoard at http://127.0.0.1:" in line, line
        servers = children(proc.pid)
        assert len(servers) == 1 and alive(servers[0]), servers
        proc.send_signal(signum)
        assert proc.wait(timeout=60) in (128 + signum, -signum)
        deadline = time.monotonic() + 60  # the kernel signals the server; it takes a moment to exit
        while alive(servers[0]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive(servers[0]), "TensorBoard kept serving after hpctrain tensorboard ended"
        out, err = proc.communicate(timeout=60)  # the server held the pipes too: read them once it is gone
        # One URL (hpctrain's), no TensorFlow or loader notes from TensorBoard's start-up.
        assert "http://" not in out + err and "TensorFlow installation not found" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in servers:  # never leave a server running, whatever failed above
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slurm
def test_on_cluster_job_serves_the_shared_folder(slurm_cluster, tmp_path: Path) -> None:
    run = make_run(tmp_path / "shared" / "mnist", [0.5, 0.25])
    env = cli_env(tmp_path / "home")
    result = hpctrain(
        "tensorboard", str(run), "--on-cluster", "--scheduler", "slurm", "--wait", "500", *venv_args(), env=env
    )
    job = re.search(r"hpctrain cancel (\d+)", result.stdout)
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        up = re.search(r"up on (\S+):(\d+) \(job", result.stdout)
        assert up and f"ssh -N -L {up[2]}:{up[1]}:{up[2]} " in result.stdout
        base = f"http://{up[1]}:{up[2]}"
        deadline = time.monotonic() + 120
        while len(served(base, "mnist/.")) < 2 and time.monotonic() < deadline:
            time.sleep(1)
        assert served(base, "mnist/.") == expected(run)
        cancelled = hpctrain("cancel", job[1], env=env)
        assert cancelled.returncode == 0, cancelled.stderr
        assert slurm_cluster.state(job[1]) in ("CANCELLED", "COMPLETED", "GONE")
    finally:
        if job:
            slurm_cluster.cancel_quietly(job[1])
