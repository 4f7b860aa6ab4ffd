"""hpctrain's Kubernetes backend end to end on REAL pods: scripts/local-k8s.sh with HPCTRAIN_K8S_NODES=1 runs a
kubelet (node hpctrain-node-1) with containerd, kube-scheduler and kube-controller-manager beside the API server,
and every job here goes through hpctrain's own KubernetesScheduler or CLI, in the training image that `status`
names (the host's Python, torch and hpctrain mounted read-only into an almost empty root).

Real: scheduling (and a pod that does not fit staying Pending with the scheduler's reason), the containers, their
environment, hostPath volumes and the memory-backed /dev/shm, the pod network between the two pods (gloo), logs and
exec through the API server to the kubelet, deletion with a grace period (SIGTERM to the container), the garbage
collector's foreground deletion of a job's pods, `kubectl port-forward`.
Still a stand-in: the Kubeflow PyTorchJob controller (tests/kubeflow_standin.py, a controller only), which turns a
PyTorchJob into its pods and sets the job's conditions from their phases. No Kubeflow controller can be built here
(it needs the Go module proxy). It addresses the master by Kubeflow's name `<job>-master-0` through a host alias,
since the cluster has no DNS.

The cluster is chosen as in tests/test_k8s_real_pods.py: HPCTRAIN_K8S_NODE_DIR and HPCTRAIN_K8S_NODE_CONTEXT name
the one with the node (scripts/test.sh starts it; then a missing node fails each test); without them each test
skips, with the reason, unless `scripts/local-k8s.sh status` reports a Ready node and a training image.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.schedulers import blocking
from hpctrain.schedulers.base import RUNNING, SUCCEEDED
from hpctrain.schedulers.kubernetes.scheduler import KubernetesScheduler
from real_node import DEADLINE_S, Real, real, real_cpu  # noqa: F401 - fixtures: the whole node, one CPU of it
from slurm_fixtures import paused, wait_delivered
from test_k8s_real_pods import CONTEXT

pytestmark = [pytest.mark.k8s, pytest.mark.slow]
# Classic recipe, batch 64: 32 steps per epoch. A stop lands inside the run whatever the machine's speed: the test
# pauses the training processes (SIGSTOP from this host, the node) while the stop is on its way (slurm_fixtures.paused).
RESUME_LIMIT, STEPS = 2048, 32


def mnist(data_dir: Path, run_dir: Path, train_limit: int, epochs: int) -> tuple[str, ...]:
    """`hpctrain train mnist` as the pods run it (the image's python, hpctrain from the mounted checkout)."""
    return (
        "python",
        "-m",
        "hpctrain",
        "train",
        "mnist",
        "--recipe",
        "classic",
        "--dataset",
        "fashion-mnist",
        "--data-dir",
        str(data_dir),
        "--train-limit",
        str(train_limit),
        "--test-limit",
        "200",
        "--epochs",
        str(epochs),
        "--threads",
        "1",
        "--log-interval",
        "1",
        "--run-dir",
        str(run_dir),
    )


def finished(sched: KubernetesScheduler, job: str) -> Any:
    status = sched.status(job)
    return status.finished and all(r.phase in ("Succeeded", "Failed") for r in status.replicas) and status


def test_mnist_on_two_real_pods_completes_with_world_size_2(real: Real, tmp_path: Path, fashion_data_dir: Path) -> None:
    """`hpctrain submit --wait` of a 2-pod PyTorchJob `train mnist`: the scheduler places both pods on the real
    node, the kubelet starts them from the training image with the Fashion-MNIST data (read-only) and the run
    directory on hostPath volumes, rank 1 reaches rank 0 over the pod network, and the job completes.
    Stand-in: the PyTorchJob controller only."""
    runs = tmp_path / "runs"
    runs.mkdir()
    submitted = real.cli(
        "submit",
        *real.where,
        "--image",
        real.image,
        "--job-name",
        "mnist-real",
        "--volume",
        f"host:{fashion_data_dir}:{fashion_data_dir}:ro",
        "--volume",
        f"host:{runs}:{runs}",
        "--nodes",
        "2",
        "--cpus-per-task",
        "1",
        "--mem",
        "2G",
        "--run-dir",
        f"{runs}/%j",
        "--wait",
        "--",
        *mnist(fashion_data_dir, runs / "mnist-real", 1024, 1),
    )
    shown = real.cli("status", "mnist-real", "--json", *real.where)
    log = real.cli("logs", "mnist-real", *real.where).stdout
    assert submitted.returncode == 0, (submitted.stdout, submitted.stderr, shown.stdout, log)
    status = json.loads(shown.stdout)
    assert status["state"] == SUCCEEDED and [r["name"] for r in status["replicas"]] == ["master-0", "worker-0"], status
    assert {r["node"] for r in status["replicas"]} <= real.nodes, status
    assert "with 2 process(es), ddp, cpu" in log, log
    assert "hpctrain: epoch 1/1: train loss" in log, log
    assert (runs / "mnist-real" / "stop_reason").read_text().strip() == "completed"
    worker = real.cli("logs", "mnist-real", "--replica", "worker-0", *real.where).stdout
    assert "Traceback" not in log + worker, log + worker


def test_shm_is_a_memory_volume_of_the_asked_size(real: Real) -> None:
    """--shm 256Mi: inside the real container /dev/shm is a tmpfs of exactly 256 MiB (the kubelet sizes a
    memory-backed emptyDir by its sizeLimit, feature gate SizeMemoryBackedVolumes). No stand-in involved but the
    PyTorchJob controller."""
    sched = real.scheduler(shm="256Mi")
    probe = (
        "import os; s = os.statvfs('/dev/shm'); kinds = [l.split()[2] for l in open('/proc/mounts') "
        "if l.split()[1] == '/dev/shm']; print('shm', s.f_frsize * s.f_blocks, kinds, flush=True)"
    )
    job = JobSpec(command=("python", "-c", probe), name="shm", resources=Resources(nodes=1, mem="1G"))
    assert sched.submit(job, sched.render(job)) == "shm"
    status = real.wait("the job to finish", lambda: finished(sched, "shm"))
    log = "\n".join(sched.logs("shm"))
    assert status.state == SUCCEEDED, (status, log)
    assert f"shm {256 * 2**20} ['tmpfs']" in log, log


def test_cancel_checkpoints_top_execs_and_resubmission_resumes(
    real: Real, tmp_path: Path, fashion_data_dir: Path
) -> None:
    """While a 2-pod `train mnist` trains: `hpctrain top` runs its probe in both pods through real exec
    (API server -> kubelet -> containerd); `hpctrain cancel` deletes the job in the foreground, kube-controller-
    manager's garbage collector deletes the pods with their grace period (--signal-grace), the kubelet sends
    SIGTERM, the run writes a checkpoint and stop_reason `cancelled`; the same job submitted again resumes from
    it and completes (this was tests/test_k8s_e2e.py's cancel-and-resume on the fake kubelet). Stand-in: the
    PyTorchJob controller only."""
    shared = tmp_path / "shared"
    shared.mkdir()
    run_dir = shared / "resume"
    sched = real.scheduler(f"host:{fashion_data_dir}:{fashion_data_dir}:ro", f"host:{shared}:{shared}")
    job = JobSpec(
        command=mnist(fashion_data_dir, run_dir, RESUME_LIMIT, 2),
        name="resume",
        run_dir=str(run_dir),
        signal_grace=60,
        resources=Resources(nodes=2, cpus_per_task=1, mem="2G"),
    )
    assert blocking(sched.check(job)) == [], sched.check(job)
    assert sched.submit(job, sched.render(job)) == "resume"
    real.wait(
        "both pods running",
        lambda: (
            (s := sched.status("resume")).state == RUNNING and [r.phase for r in s.replicas] == ["Running", "Running"]
        ),
    )

    # The master's log, followed through the API server until its container ends (its pod is gone after).
    lines: list[str] = []
    follower = threading.Thread(
        target=lambda: lines.extend(sched.logs("resume", follow=True, replica="master-0")), daemon=True
    )
    follower.start()
    real.wait("training under way", lambda: any(re.match(rf"epoch 1/2 step \d+/{STEPS}", line) for line in lines))

    pids = real.training_pids(run_dir, 2)
    with paused(pids):
        top = real.cli("top", "resume", *real.where)
        assert top.returncode == 0, top.stdout + top.stderr
        for pod in ("resume-master-0", "resume-worker-0"):
            assert f"({pod})" in top.stdout, top.stdout  # a row `NODE (POD)`: the probe ran in that pod
        ranks = [line.split() for line in top.stdout.splitlines() if line.split()[:1] in (["0"], ["1"])]
        assert [row[0] for row in ranks] == ["0", "1"], top.stdout
        # `cancel --wait` returns once the pods are gone: it runs on while the training, paused, gets the SIGTERM.
        cancel = real.start_cli("cancel", "resume", "--wait", str(DEADLINE_S), *real.where)
        wait_delivered(pids, signal.SIGTERM, DEADLINE_S, "resume")
    out, err = cancel.communicate(timeout=DEADLINE_S)
    assert cancel.returncode == 0 and "-> deleted" in out, out + err
    follower.join(timeout=60)
    log = "\n".join(lines)
    assert "with 2 process(es), ddp, cpu" in log and "Traceback" not in log, log
    assert re.search(r"hpctrain: stopped \(cancelled: [^)]*\) at global step \d+ after writing a checkpoint", log), log
    assert (run_dir / "stop_reason").read_text().strip() == "cancelled"
    assert list((run_dir / "checkpoints").iterdir()), "no checkpoint written on SIGTERM"
    assert not sched.list_jobs()

    assert sched.submit(job, sched.render(job)) == "resume"
    status = real.wait("the resubmitted job to finish", lambda: finished(sched, "resume"))
    log = "\n".join(sched.logs("resume"))
    assert status.state == SUCCEEDED and [r.phase for r in status.replicas] == ["Succeeded", "Succeeded"], (status, log)
    assert re.search(rf"hpctrain: resumed at epoch [12], step \d+ of {STEPS}", log), log
    assert "hpctrain: epoch 2/2: train loss" in log, log
    assert (run_dir / "stop_reason").read_text().strip() == "completed"


def test_a_higher_priority_job_preempts_and_the_preempted_job_resumes_exactly(
    real: Real, tmp_path: Path, fashion_data_dir: Path
) -> None:
    """kube-scheduler's own preemption: a low-priority 2-pod `train mnist` holds the node's CPUs; a high-priority job
    asking for all of them makes the scheduler evict both pods (graceful deletion: SIGTERM, the run checkpoints);
    the controller makes the pods again, they wait Pending until the high-priority job has finished, then resume by
    themselves (HPCTRAIN_AUTO_RESUME) and end with the weights of an uninterrupted local 2-process run, bitwise.
    Stand-in: the PyTorchJob controller only."""
    from kubernetes import client

    from hpctrain.health import read_progress
    from training_helpers import assert_bitwise_equal, clean_environ, final_weights, ok

    scheduling, core = client.SchedulingV1Api(real.api), client.CoreV1Api(real.api)
    low, high = f"{real.namespace}-low", f"{real.namespace}-high"
    for name, value in ((low, 1000), (high, 1_000_000)):
        scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
    try:
        shared = tmp_path / "shared"
        shared.mkdir()
        run_dir = shared / "low"
        volumes = (f"host:{fashion_data_dir}:{fashion_data_dir}:ro", f"host:{shared}:{shared}")
        cpus = min(int(float(core.read_node(n).status.allocatable["cpu"])) for n in real.nodes)
        job = JobSpec(
            command=mnist(fashion_data_dir, run_dir, RESUME_LIMIT, 2),
            name="low",
            run_dir=str(run_dir),
            signal_grace=60,
            resources=Resources(nodes=2, cpus_per_task=max(1, cpus // 2), mem="2G"),
        )
        low_sched = real.scheduler(*volumes, priority_class=low)
        low_sched.submit(job, low_sched.render(job))
        real.wait(
            "the low-priority job training",
            lambda: any(r.phase == "training" and r.step >= 5 for r in read_progress(run_dir)),
        )

        big = JobSpec(
            command=("python", "-c", "import time; time.sleep(5)"),
            name="high",
            resources=Resources(nodes=1, cpus_per_task=cpus, mem="1G"),
        )
        high_sched = real.scheduler(priority_class=high)
        pids = real.training_pids(run_dir, 2)
        with paused(pids):  # the eviction's SIGTERM reaches the run mid-epoch, however fast this machine trains
            high_sched.submit(big, high_sched.render(big))
            wait_delivered(pids, signal.SIGTERM, DEADLINE_S, "low")
        real.wait(
            "the preempted run's checkpoint",
            lambda: (
                (run_dir / "stop_reason").is_file() and (run_dir / "stop_reason").read_text().strip() == "cancelled"
            ),
        )
        assert real.wait("the high-priority job to finish", lambda: finished(high_sched, "high")).state == SUCCEEDED
        events = core.list_namespaced_event(real.namespace).items
        assert any(e.reason == "Preempted" for e in events), [(e.reason, e.message) for e in events]

        status = real.wait("the low-priority job to finish", lambda: finished(low_sched, "low"))
        log = "\n".join(low_sched.logs("low"))
        assert status.state == SUCCEEDED, (status, log)
        assert re.search(rf"hpctrain: resumed at epoch [12], step \d+ of {STEPS}", log), log
        assert (run_dir / "stop_reason").read_text().strip() == "completed"
    finally:
        for name in (low, high):
            scheduling.delete_priority_class(name)
    reference = tmp_path / "reference"
    ok(
        subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "2",
                *mnist(fashion_data_dir, reference, RESUME_LIMIT, 2)[1:],
            ],
            env=clean_environ(),
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
    )
    assert_bitwise_equal(final_weights(run_dir), final_weights(reference))


def test_a_job_that_does_not_fit_stays_pending_with_the_schedulers_reason(real: Real) -> None:
    """64 CPUs per pod on a node of a few: `hpctrain check` says no node offers that (from the real node's
    allocatable), and once submitted the pod stays Pending while `hpctrain status` shows kube-scheduler's own
    FailedScheduling event. Stand-in: the PyTorchJob controller only."""
    job = [
        "--image",
        real.image,
        "--job-name",
        "too-big",
        "--nodes",
        "1",
        "--cpus-per-task",
        "64",
        "--mem",
        "1G",
        "--",
        "python",
        "-c",
        "print('never')",
    ]
    checked = real.cli("check", *real.where, *job)
    assert checked.returncode == 2, checked.stdout + checked.stderr
    node = sorted(real.nodes)[0]
    assert f"more than any node offers (largest: {node} with cpu" in checked.stdout + checked.stderr, checked

    sched = real.scheduler()
    spec = JobSpec(
        command=("python", "-c", "print('never')"),
        name="too-big",
        resources=Resources(nodes=1, cpus_per_task=64, mem="1G"),
    )
    sched.submit(spec, sched.render(spec))
    reason = re.compile(r"too-big-master-0: FailedScheduling: 0/\d+ nodes are available: \d+ Insufficient cpu")
    shown = real.wait(
        "the scheduler's reason in `hpctrain status`",
        lambda: reason.search((s := real.cli("status", "too-big", *real.where)).stdout) and s,
    )
    assert shown.stdout.startswith("too-big: PENDING"), shown.stdout
    status = sched.status("too-big")
    assert [(r.phase, r.reason) for r in status.replicas] == [("Pending", "Unschedulable")], status


def test_a_job_over_the_namespace_quota_stays_pending_with_the_quota_reason(real: Real) -> None:
    """A ResourceQuota of 500m CPU in the job's namespace (kube-controller-manager's quota controller fills in its
    status) and a 1-pod job asking for 1 CPU: `hpctrain check` says the quota can never allow it; once submitted,
    the API server's quota admission refuses the controller's pod, the controller records that as a Warning event
    on the job (FailedCreatePod, as training-operator v1 does), and `hpctrain status` shows it as the reason the job
    waits, with the fix. Stand-in: the PyTorchJob controller only."""
    from kubernetes import client

    core = client.CoreV1Api(real.api)
    core.create_namespaced_resource_quota(
        real.namespace, {"metadata": {"name": "team"}, "spec": {"hard": {"requests.cpu": "500m"}}}
    )
    real.wait(
        "the quota controller's status of the quota",
        lambda: (core.read_namespaced_resource_quota("team", real.namespace).status.hard or {}).get("requests.cpu"),
    )
    job = [
        "--image",
        real.image,
        "--job-name",
        "over-quota",
        "--nodes",
        "1",
        "--cpus-per-task",
        "1",
        "--mem",
        "1G",
        "--",
        "python",
        "-c",
        "print('never')",
    ]
    checked = real.cli("check", *real.where, *job)
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert (
        f"the job asks for requests.cpu 1 but the quota team of namespace {real.namespace} allows 0.5 in all: it "
        "can never run"
    ) in checked.stdout + checked.stderr, checked

    sched = real.scheduler()
    spec = JobSpec(
        command=("python", "-c", "print('never')"),
        name="over-quota",
        resources=Resources(nodes=1, cpus_per_task=1, mem="1G"),
    )
    sched.submit(spec, sched.render(spec))
    shown = real.wait(
        "the quota's refusal in `hpctrain status`",
        lambda: "exceeded quota" in (s := real.cli("status", "over-quota", *real.where)).stdout and s,
    )
    assert shown.stdout.startswith("over-quota: PENDING"), shown.stdout
    assert re.search(
        r"^waiting: over-quota: FailedCreatePod: Error creating: pods \"over-quota-master-0\" is forbidden: "
        r"exceeded quota: team, requested: requests.cpu=1, used: requests.cpu=0, limited: requests.cpu=500m "
        r"-- the namespace's ResourceQuota refuses the pods: wait for the quota to free, submit with less "
        r"\(fewer --nodes or less per pod\) or ask for a larger quota \(`hpctrain cluster ",
        shown.stdout,
        re.M,
    ), shown.stdout
    assert "is the PyTorchJob operator running?" not in shown.stdout, shown.stdout
    assert sched.pods_of("over-quota") == []
    cluster = real.cli("cluster", *real.where)
    assert f"quota: {real.namespace}/team requests.cpu: 0 of 500m used" in cluster.stdout, (
        cluster.stdout + cluster.stderr
    )


def test_tensorboard_on_cluster_through_a_real_port_forward(real_cpu: Real, tmp_path: Path) -> None:
    """`hpctrain tensorboard --on-cluster`: a plain pod (no stand-in at all: the scheduler places it, the kubelet
    runs the venv's TensorBoard from the training image, the run on a hostPath volume) reached through the
    `kubectl port-forward` command hpctrain prints; it serves the run's scalars; `hpctrain cancel` removes it. One
    CPU: it shares the node."""
    from test_tensorboard import expected, make_run, served

    real = real_cpu
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    shared = tmp_path / "shared"
    run = make_run(shared / "mnist", [0.5, 0.25])
    started = real.cli(
        "tensorboard",
        str(run),
        "--on-cluster",
        *real.where,
        "--image",
        real.image,
        "--volume",
        f"host:{shared}:{shared}",
    )
    assert started.returncode == 0, started.stdout + started.stderr
    name = re.search(r"TensorBoard pod (\S+) created", started.stdout)[1]
    command = re.search(
        rf"(kubectl --context {CONTEXT} port-forward -n {real.namespace} pod/{name} \d+:\d+)", started.stdout
    )[1]
    stop = re.search(r"Stop it with: (.*)", started.stdout)[1]
    assert stop == f"hpctrain cancel --scheduler kubernetes --namespace {real.namespace} --context {CONTEXT} {name}"
    core = real.standin.core
    real.wait(
        "the TensorBoard pod to be ready",
        lambda: any(
            c.type == "Ready" and c.status == "True"
            for c in core.read_namespaced_pod(name, real.namespace).status.conditions or []
        ),
    )
    with port_forward(real, command) as base:
        deadline = time.monotonic() + 120
        while len(served(base, "mnist/.")) < 2 and time.monotonic() < deadline:
            time.sleep(1)
        assert served(base, "mnist/.") == expected(run)
        with urllib.request.urlopen(base + "/", timeout=30) as response:
            assert response.status == 200
    cancelled = real.cli(*shlex.split(stop)[1:])  # the printed command, as pasted
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    real.wait("the pod to be gone", lambda: not core.list_namespaced_pod(real.namespace).items)


def test_the_stand_in_leaves_placement_to_the_scheduler(real: Real) -> None:
    """The controllers-only stand-in's pods carry no nodeName, Kubeflow's master address and port, and the host
    alias that replaces the cluster DNS for the workers; the scheduler binds them to the real node, and the worker
    reaches the master by that name over the pod network."""
    sched = real.scheduler()
    # The master waits for the worker, as a training's rendezvous would (the stand-in makes workers once the master
    # has an address), and outlives it: once the master succeeds the job has succeeded, and cleanPodPolicy Running
    # has the operator delete a worker still running, its container and log with it (training-operator v1.9.x,
    # PyTorchJob's UpdateJobStatus: the master's success is the job's; common/job.go DeletePodsAndServices).
    probe = (
        "import os, socket, time\n"
        "addr, port = os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])\n"
        "print(addr, port, flush=True)\n"
        "if os.environ['RANK'] == '0':\n"
        "    server = socket.create_server(('', port)); server.settimeout(120)\n"
        "    peer = server.accept()[0]; peer.settimeout(120); peer.recv(1)\n"  # b'' once the worker is gone
        "    time.sleep(5)\n"  # for the kubelet to report the worker Succeeded before the master
        "else:\n"
        "    for _ in range(600):\n"
        "        try:\n"
        "            socket.create_connection((addr, port), timeout=5).close(); break\n"
        "        except OSError:\n"
        "            time.sleep(0.2)\n"
        "    else:\n"
        "        raise SystemExit('the master never listened')\n"
    )
    job = JobSpec(command=("python", "-c", probe), name="addr", resources=Resources(nodes=2, mem="512M"))
    sched.submit(job, sched.render(job))
    status = real.wait("the job to finish", lambda: finished(sched, "addr"))
    assert status.state == SUCCEEDED and [r.phase for r in status.replicas] == ["Succeeded", "Succeeded"], status
    pods = {p.metadata.name: p for p in real.standin.core.list_namespaced_pod(real.namespace).items}
    master, worker = pods["addr-master-0"], pods["addr-worker-0"]
    assert {master.spec.node_name, worker.spec.node_name} <= real.nodes
    assert [(a.ip, a.hostnames) for a in worker.spec.host_aliases] == [(master.status.pod_ip, ["addr-master-0"])]
    assert "\n".join(sched.logs("addr", replica="worker-0")).strip() == "addr-master-0 23456"


def test_dev_start_jupyterlab_through_a_real_port_forward(real_cpu: Real, tmp_path: Path) -> None:
    """`hpctrain dev start`: a plain pod (no stand-in at all) runs the venv's JupyterLab from the training image,
    with its token from a Secret (never in the pod's spec) and the kubelet's readiness probe; the `kubectl
    port-forward` command hpctrain prints reaches it, the server answers with the token and only with it; `dev list`
    shows it; `hpctrain dev stop` removes it and its Secret. One CPU: it shares the node."""
    import base64

    from hpctrain.servers.common import http_get
    from kubeflow_standin import free_port

    real = real_cpu
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    local = free_port()
    started = real.cli(
        "dev",
        "start",
        "nb",
        *real.where,
        "--image",
        real.image,
        "--shm",
        "1Gi",
        "--cpus",
        "1",
        "--mem",
        "2G",
        "--local-port",
        str(local),
        "--wait",
        str(DEADLINE_S),
    )
    assert started.returncode == 0, started.stdout + started.stderr
    command = re.search(
        rf"(kubectl --context {CONTEXT} port-forward -n {real.namespace} pod/dev-nb {local}:\d+)", started.stdout
    )[1]
    stop = re.search(r"Stop it when done: (.*)", started.stdout)[1]
    assert stop == f"hpctrain dev stop --scheduler kubernetes --namespace {real.namespace} --context {CONTEXT} nb"
    token = (tmp_path / "home" / "dev" / "nb" / "token").read_text().strip()
    assert f"http://localhost:{local}/lab?token={token}" in started.stdout
    core = real.standin.core
    pod = core.read_namespaced_pod("dev-nb", real.namespace)
    assert pod.spec.containers[0].resources.limits == {"cpu": "1", "memory": "2Gi"}
    assert token not in json.dumps(real.api.sanitize_for_serialization(pod))
    assert base64.b64decode(core.read_namespaced_secret("dev-nb", real.namespace).data["token"]).decode() == token
    with port_forward(real, command) as base:
        assert http_get(f"{base}/api/status", token)[0] == 200
        assert http_get(f"{base}/api/status")[0] == 403
    again = real.cli("dev", "start", "nb", *real.where, "--image", "img", "--wait", "0")
    assert again.returncode == 2 and "already exists" in again.stderr
    listed = real.cli("dev", "list", *real.where)
    assert re.search(rf"^nb\s+kubernetes\s+{real.namespace}/dev-nb\s+RUNNING", listed.stdout, re.M), listed.stdout
    stopped = real.cli(*shlex.split(stop)[1:])  # the printed command, as pasted
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert not [s for s in core.list_namespaced_secret(real.namespace).items if s.metadata.name == "dev-nb"]
    real.wait("the pod to be gone", lambda: not core.list_namespaced_pod(real.namespace).items)
    assert real.cli("dev", "list", *real.where).stdout.startswith("no dev sessions")


@contextlib.contextmanager
def port_forward(real: Real, command: str) -> Iterator[str]:
    """Run the `kubectl --context CTX port-forward -n NS pod/NAME LOCAL:PORT` command hpctrain printed, as printed,
    until it says it forwards; the local base URL while it runs."""
    words = shlex.split(command)
    local = words[-1].split(":")[0]
    forward = subprocess.Popen(words, env=real.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()
        assert f"Forwarding from 127.0.0.1:{local}" in line, line
        yield f"http://127.0.0.1:{local}"
    finally:
        forward.terminate()
        forward.wait(timeout=30)


def test_an_ended_job_is_removed_by_cancel_and_by_submit_replace(real_cpu: Real, tmp_path: Path) -> None:
    """A PyTorchJob that failed (--max-restarts 0: the kubelet restarted its crashing container once, which ends
    the job) keeps its object, so its name stays taken: `submit` of the same name is refused with a `cancel`
    command, that command (as printed) deletes what is left, the garbage collector takes any pod; `submit --replace`
    does the same by itself and creates the new job. Its restarting pod may be gone already or not: cleanPodPolicy
    Running has the operator (here the stand-in) delete it once the job has failed, so the pod counts are either.
    One pod: one CPU of the node."""
    real = real_cpu
    sched = real.scheduler()
    failing = ["--", "python", "-c", "import sys, time; time.sleep(1); sys.exit(3)"]

    def submit(*flags: str) -> subprocess.CompletedProcess[str]:
        return real.cli(
            "submit",
            "--no-check",
            *real.where,
            "--image",
            real.image,
            "--job-name",
            "ended-1",
            "--mem",
            "512M",
            *flags,
            cwd=tmp_path,
        )

    def ended() -> Any:
        status = sched.status("ended-1")
        return status.finished and status

    assert submit(*failing).returncode == 0
    assert real.wait("the job to fail", ended).state == "FAILED"
    assert sched.get_object("ended-1"), "a failed job keeps its object: the name stays taken"
    again = submit(*failing)
    assert again.returncode == 2, again.stdout + again.stderr
    cancel = re.search(r"cancel the old one \(`(hpctrain cancel [^`]*)`\), or pass --replace", again.stderr)
    assert cancel, again.stderr
    cancelled = real.cli(*shlex.split(cancel[1])[1:], "--wait", str(DEADLINE_S))  # as printed, on a loaded machine
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert re.search(r"hpctrain cancel: job ended-1 has ended \(FAILED\); deleting its object", cancelled.stderr)
    assert re.fullmatch(r"job ended-1: FAILED -> deleted( \(its pods are gone\))?\n", cancelled.stdout), (
        cancelled.stdout
    )
    assert not sched.list_jobs() and not sched.pods_of("ended-1")

    assert submit(*failing).returncode == 0
    real.wait("the job to fail again", ended)
    old_uid = sched.get_object("ended-1")["metadata"]["uid"]
    replaced = submit("--replace", "--", "python", "-c", "print('new', flush=True)")
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    assert re.search(
        r"--replace: deleted the earlier PyTorchJob ended-1 \(FAILED, (no pods|1 pod)\) first", replaced.stderr
    ), replaced.stderr
    assert sched.get_object("ended-1")["metadata"]["uid"] != old_uid
    status = real.wait("the new job to finish", lambda: finished(sched, "ended-1"))
    assert status.state == SUCCEEDED and "new" in list(sched.logs("ended-1")), status


def test_a_failed_jobs_last_lines_outlive_its_pods(real_cpu: Real, tmp_path: Path) -> None:
    """A PyTorchJob whose rank fails at its restart budget loses its pods (cleanPodPolicy Running: they are
    restarting in place when it fails) and, before, every line its rank wrote: `logs` printed nothing, `status` said
    "exit status 3". Now each start of the container appends its output to RUN_DIR/pod-logs/HOST.log on the shared
    volume, and the container's termination message holds its log's end (FallbackToLogsOnError) while the pod
    exists: `submit --wait` and `status JOB` end with the failed replica's last lines, `logs JOB` reads the kept log
    once the pods are gone. One pod: one CPU of the node."""
    real = real_cpu
    runs = tmp_path / "runs"
    runs.mkdir()
    failing = "import sys, time; print('loading shard 7', flush=True); time.sleep(1); sys.exit('bad shard 7')"
    proc = real.cli(
        "submit",
        "--no-check",
        *real.where,
        "--image",
        real.image,
        "--job-name",
        "lost-1",
        "--mem",
        "512M",
        "--max-restarts",
        "1",
        "--volume",
        f"host:{runs}:/mnt/runs",
        "--run-dir",
        "/mnt/runs/%j",
        "--wait",
        "--",
        "python",
        "-c",
        failing,
        cwd=tmp_path,
    )
    # 1, or 143 where the last restart was stopped as its pod went and the operator recorded that.
    assert proc.returncode in (1, 143), proc.stdout + proc.stderr
    said = proc.stderr.splitlines()
    at = said.index("hpctrain submit: the last lines of the failed replica(s):")
    assert "  master-0: bad shard 7" in said[at + 1 :], proc.stderr
    sched = real.scheduler(f"host:{runs}:/mnt/runs")
    real.wait("the pods to go", lambda: not sched.pods_of("lost-1"))
    kept = (runs / "lost-1" / "pod-logs" / "lost-1-master-0.log").read_text()
    # The first run and its restarts in place (the last may have been stopped as its pod went), each kept.
    assert kept.count("bad shard 7\n") >= 2, kept
    status = real.cli("status", "lost-1", *real.where)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    at = lines.index("last lines of the failed replica(s):")
    assert "  master-0: bad shard 7" in lines[at + 1 :], status.stdout
    logs = real.cli("logs", "lost-1", *real.where)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.count("bad shard 7\n") >= 2 and "exited with status 1\n" in logs.stdout, logs.stdout
    assert "has no pods: the log master-0 kept in its run directory" in logs.stderr, logs.stderr


def test_a_failed_containers_termination_message_is_its_logs_end(real_cpu: Real) -> None:
    """Without a run directory the pod's own status keeps the end of a failed container's log (terminationMessagePolicy
    FallbackToLogsOnError, the kubelet's 80 lines), read by `status` while the pod exists. One pod: one CPU."""
    real = real_cpu
    sched = real.scheduler()
    spec = JobSpec(
        command=("python", "-c", "import sys; print('cuda init failed', flush=True); sys.exit(4)"),
        name="said-1",
        max_restarts=1,
        resources=Resources(nodes=1, mem="512M"),
    )
    sched.submit(spec, sched.render(spec))

    def message() -> Any:
        pods = sched.pods_of("said-1")
        statuses = [s for p in pods for s in (p.get("status") or {}).get("containerStatuses") or []]
        ended = [
            (s.get("lastState") or {}).get("terminated") or (s.get("state") or {}).get("terminated") for s in statuses
        ]
        return next((t["message"] for t in ended if t and t.get("message")), None)

    assert real.wait("a termination message", message).strip() == "cuda init failed"
