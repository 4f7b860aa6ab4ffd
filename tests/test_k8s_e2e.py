"""End to end through the real local API server: a 2-pod PyTorchJob running `hpctrain train mnist` (gloo on CPU) is
checked, submitted, followed with status and logs, cancelled mid-run (its pods get SIGTERM and the run writes a
checkpoint), submitted again with the same run directory and --resume, and completes from that checkpoint.

The pods are run by tests/kubeflow_standin.py, a test-only fake of the Kubeflow controller and the kubelet (none
can run here): it creates the pods the job implies with Kubeflow v1's variables and runs each pod's command as a
local process of this interpreter (`sys.executable -m hpctrain`), so the "shared volume" is a directory of this
machine that every pod process sees. The logs are read through the API server's pod log endpoint.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.schedulers import blocking
from hpctrain.schedulers.base import CANCELLED, RUNNING, SUCCEEDED
from hpctrain.schedulers.kubernetes.options import KubernetesOptions
from hpctrain.schedulers.kubernetes.scheduler import KubernetesScheduler
from k8s_fixtures import LocalK8s
from kubeflow_standin import KubeflowStandIn, create_namespace, delete_namespace
from kubeflow_standin import wait_for as _wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.slow]
DEADLINE_S = 300  # generous on a loaded 2-core machine; never asserted on, only a bound on waiting
TRAIN_LIMIT = 2048  # classic recipe, batch 64: 32 steps per epoch



def wait_for(what, predicate, standin, timeout=DEADLINE_S):
    return _wait_for(what, predicate, standin, timeout)


@pytest.fixture
def cluster(k8s_cluster: LocalK8s, tmp_path: Path):
    api = k8s_cluster.api_client()
    namespace = create_namespace(api, prefix="hpct-e2e")
    tag = namespace
    standin = KubeflowStandIn(api, namespace, tmp_path / "standin", node_labels={"hpctrain-test-node": tag}).start()
    yield api, namespace, tag, standin
    standin.stop()
    delete_namespace(api, namespace)


def test_submit_follow_cancel_resume(cluster, tmp_path: Path, fashion_data_dir: Path) -> None:
    api, namespace, tag, standin = cluster
    shared = tmp_path / "shared"  # what every pod mounts; here a local directory all pod processes see
    shared.mkdir()
    run_dir = shared / "runs" / "mnist-e2e"
    options = KubernetesOptions(namespace=namespace, image="example.invalid/hpctrain:test", shm="1Gi",
                                volumes=(f"host:{shared}:{shared}",), node_selector=(f"hpctrain-test-node={tag}",))
    sched = KubernetesScheduler(options, api_client=api)
    command = (sys.executable, "-m", "hpctrain", "train", "mnist", "--recipe", "classic", "--dataset", "fashion-mnist",
               "--data-dir", str(fashion_data_dir), "--train-limit", str(TRAIN_LIMIT), "--test-limit", "200",
               "--epochs", "4", "--threads", "1", "--log-interval", "1", "--run-dir", str(run_dir))  # no --resume: pods resume by themselves (HPCTRAIN_AUTO_RESUME)
    job = JobSpec(command=command, name="mnist-e2e", run_dir=str(run_dir), signal_grace=60,
                  resources=Resources(nodes=2, cpus_per_task=1, mem="2G"))

    assert blocking(sched.check(job)) == [], sched.check(job)
    assert sched.submit(job, sched.render(job)) == "mnist-e2e"

    status = wait_for("both pods running", lambda: (s := sched.status("mnist-e2e")).state == RUNNING
                      and [r.phase for r in s.replicas] == ["Running", "Running"] and s, standin)
    assert [r.name for r in status.replicas] == ["master-0", "worker-0"]
    assert all(r.node == standin.node for r in status.replicas)

    # Follow rank 0's log through the API server until training is under way, then cancel.
    seen = []
    for line in sched.logs("mnist-e2e", follow=True, replica="master-0"):
        seen.append(line)
        if re.match(r"epoch 1/4 step \d+/32", line):
            break
    assert any("with 2 process(es), ddp, cpu" in line for line in seen), seen
    sched.cancel("mnist-e2e")
    assert sched.status("mnist-e2e").state == CANCELLED
    wait_for("the job and its pods to be gone", lambda: not sched.list_jobs(), standin)
    log = standin.log_path("mnist-e2e-master-0").read_text()
    assert re.search(r"hpctrain: stopped \(cancelled: [^)]*\) at global step \d+ after writing a checkpoint", log), log
    assert (run_dir / "stop_reason").read_text().strip() == "cancelled"
    assert list((run_dir / "checkpoints").iterdir()), "no checkpoint written on SIGTERM"
    worker_log = standin.log_path("mnist-e2e-worker-0").read_text()
    assert "Traceback" not in log + worker_log, log + worker_log

    # The same job again, as `hpctrain submit` would resubmit it: it resumes from the checkpoint and completes.
    for pod in ("mnist-e2e-master-0", "mnist-e2e-worker-0"):
        standin.log_path(pod).unlink()
    sched.submit(job, sched.render(job))
    # Kubeflow marks the job Succeeded when the master succeeds; the worker exits a moment later.
    status = wait_for("the job and its pods to finish", lambda: (s := sched.status("mnist-e2e")).finished
                      and all(r.phase in ("Succeeded", "Failed") for r in s.replicas) and s, standin)
    log = "\n".join(sched.logs("mnist-e2e"))
    assert status.state == SUCCEEDED, (status, log)
    assert status.exit_code == 0 and [r.phase for r in status.replicas] == ["Succeeded", "Succeeded"]
    assert re.search(r"hpctrain: resumed at epoch [1-4], step \d+ of 32", log), log
    assert "hpctrain: epoch 4/4: train loss" in log, log
    assert (run_dir / "stop_reason").read_text().strip() == "completed"


PREEMPTED_ONCE = """\
import os, pathlib, sys
marker = pathlib.Path(os.environ["HPCTRAIN_RUN_DIR"]) / ("attempted-" + os.environ["RANK"])
if not marker.exists():
    marker.touch()
    sys.exit(75)  # hpctrain's "preempted, resume me"
"""


@pytest.mark.parametrize("budget,state,exit_code", [(1, SUCCEEDED, 0), (0, "FAILED", 75)])
def test_exit_75_is_retried_within_the_restart_budget(cluster, tmp_path: Path, budget: int, state: str, exit_code: int) -> None:
    """restartPolicy OnFailure (not ExitCode, which treats 1-127 as permanent) restarts a replica that exits 75,
    as long as --max-restarts (backoffLimit) allows."""
    api, namespace, tag, standin = cluster
    options = KubernetesOptions(namespace=namespace, image="example.invalid/hpctrain:test",
                                volumes=(f"host:{tmp_path}:{tmp_path}",), node_selector=(f"hpctrain-test-node={tag}",))
    sched = KubernetesScheduler(options, api_client=api)
    job = JobSpec(command=(sys.executable, "-c", PREEMPTED_ONCE), name="preempted", run_dir=str(tmp_path),
                  max_restarts=budget, resources=Resources(nodes=1, mem="1G"))
    sched.submit(job, sched.render(job))
    status = wait_for("the job to finish", lambda: (s := sched.status("preempted")).finished
                      and all(r.phase in ("Succeeded", "Failed") for r in s.replicas) and s, standin)
    assert (status.state, status.exit_code, status.restarts) == (state, exit_code, budget)


def test_a_sick_node_is_named_in_the_pods_status_with_the_flag_that_avoids_it(cluster, tmp_path: Path,
                                                                               fashion_data_dir: Path) -> None:
    """The preflight's finding reaches `hpctrain status` through the pods' own status (their termination message),
    with no run directory to read: the node the pods ran on (spec.nodeName, not the pod's host name) and the
    --exclude-nodes to submit with. Rank 1's preflight GEMM reports a twentieth of its rate (tests/ailing_rank.py)."""
    from hpctrain.schedulers.kubernetes.display import ended_lines

    sched, standin = _scheduler(cluster, tmp_path), cluster[3]
    job = JobSpec(command=(*_ailing_mnist(fashion_data_dir, tmp_path / "run", 256), "--preflight"), name="sick",
                  run_dir=str(tmp_path / "run"), max_restarts=0, resources=Resources(nodes=2, cpus_per_task=1, mem="2G"),
                  env=(("HPCTRAIN_TEST_AILING_RANK", "1"), ("HPCTRAIN_TEST_AILING", "sick-gemm")))
    sched.submit(job, sched.render(job))
    status = wait_for("the job to fail", lambda: (s := sched.status("sick")).finished
                      and all(r.phase in ("Succeeded", "Failed") for r in s.replicas) and s, standin)
    assert status.state == "FAILED" and status.exit_code == 144, status
    assert [r.message for r in status.replicas] == [f"sick_node: {standin.node}"] * 2, status
    lines = ended_lines(status)
    assert lines[0] == f"ended: master-0, worker-0: sick_node: {standin.node}", lines
    assert f"submit again away from them with `hpctrain submit --exclude-nodes {standin.node} ...`" in lines[1]
    assert (tmp_path / "run" / "bad_nodes").read_text() == f"{standin.node}\n"


def test_debug_stacks_and_top_reach_the_ranks_through_a_pod(cluster, k8s_cluster: LocalK8s, tmp_path: Path,
                                                            fashion_data_dir: Path) -> None:
    """Without --run-dir (the pods' volume need not be visible where the user is), `hpctrain debug stacks` asks
    through one pod's exec and prints every rank's answer; `top` shows the ranks' records the same way. Rank 1's
    forward pass never returns after 3 steps (tests/ailing_rank.py: the job stays up, a rank blocked in its
    compute and one in a collective, until the hang watchdog's 120 s, long after the test cancelled it)."""
    from around_helpers import cli_env
    from around_helpers import hpctrain as cli
    from hpctrain.health import read_progress

    namespace, standin, run_dir = cluster[1], cluster[3], tmp_path / "run"
    sched = _scheduler(cluster, tmp_path)
    job = JobSpec(command=_ailing_mnist(fashion_data_dir, run_dir, 12288), name="stacks", signal_grace=5, run_dir=str(run_dir), resources=Resources(nodes=2, mem="2G"),
                  env=(("HPCTRAIN_TEST_AILING_RANK", "1"), ("HPCTRAIN_TEST_AILING", "stall"),
                       ("HPCTRAIN_TEST_AILING_S", "3")))
    sched.submit(job, sched.render(job))
    wait_for("both ranks training", lambda: [r.phase for r in read_progress(run_dir)] == ["training", "training"],
             standin)
    connection = ["--scheduler", "kubernetes", "--namespace", namespace, "--context", k8s_cluster.context]
    env = cli_env(tmp_path / "home")
    asked = cli("debug", "stacks", "stacks", *connection, "--wait", "30", env=env)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    headers = [line for line in asked.stdout.splitlines() if line.startswith("== rank ")]
    assert headers == [f"== rank {r}, from pod stacks-master-0's RUN/stacks/rank-{r}.txt ==" for r in (0, 1)], \
        asked.stdout
    assert asked.stdout.count("hpctrain/health/watchdog.py") >= 2 and "hpctrain/training/" in asked.stdout
    shown = cli("top", "stacks", *connection, env=env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    rows = [line.split() for line in shown.stdout.splitlines() if line.split()[:1] in (["0"], ["1"])]
    assert [row[0] for row in rows] == ["0", "1"] and all(row[2] == "training" for row in rows), shown.stdout
    sched.cancel("stacks")


def _scheduler(cluster, tmp_path: Path) -> KubernetesScheduler:
    """The scheduler of the test's namespace, its pods on the stand-in's node, tmp_path mounted as their volume."""
    api, namespace, tag, _ = cluster
    return KubernetesScheduler(KubernetesOptions(namespace=namespace, image="example.invalid/hpctrain:test",
                                                 volumes=(f"host:{tmp_path}:{tmp_path}",),
                                                 node_selector=(f"hpctrain-test-node={tag}",)), api_client=api)


def _ailing_mnist(data_dir: Path, run_dir: Path, train_limit: int) -> tuple[str, ...]:
    """`hpctrain train mnist` through tests/ailing_rank.py (HPCTRAIN_TEST_AILING* in the job's env pick the ailment)."""
    return (sys.executable, str(Path(__file__).with_name("ailing_rank.py")), "train", "mnist", "--recipe", "classic",
            "--dataset", "fashion-mnist", "--data-dir", str(data_dir), "--train-limit", str(train_limit),
            "--test-limit", "100", "--epochs", "1", "--threads", "1", "--run-dir", str(run_dir))
