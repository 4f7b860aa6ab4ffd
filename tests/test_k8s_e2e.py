"""End to end on the local cluster's REAL node (tests/real_node.py: kube-scheduler, a kubelet with containerd,
kube-controller-manager): a job that exits 75 is restarted in place within its restart budget; the preflight's sick
node reaches `hpctrain status` through the pods' termination messages; `hpctrain debug stacks` and `top` reach the
ranks through a pod's exec. The 2-pod mnist that is cancelled mid-run and resumed is in tests/test_k8s_real_jobs.py.

Still a stand-in: the Kubeflow PyTorchJob controller (tests/kubeflow_standin.py, controllers only). The pods run the
training image's python with hpctrain from the checkout that started the cluster; tests/ailing_rank.py, the data
and the run directory reach them on hostPath volumes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.schedulers.base import SUCCEEDED
from hpctrain.schedulers.kubernetes.scheduler import KubernetesScheduler
from real_node import Real, real, real_cpu  # noqa: F401 - fixtures: the whole node, one CPU of it

pytestmark = [pytest.mark.k8s, pytest.mark.slow]
TESTS = Path(__file__).parent
SRC = TESTS.parent / "src"  # this checkout's hpctrain, which the pods run (see _scheduler)


PREEMPTED_ONCE = """\
import os, pathlib, sys
marker = pathlib.Path(os.environ["HPCTRAIN_RUN_DIR"]) / ("attempted-" + os.environ["RANK"])
if not marker.exists():
    marker.touch()
    sys.exit(75)  # hpctrain's "preempted, resume me"
import time
time.sleep(float(os.environ["RETRY_S"]))
"""


def test_exit_75_is_retried_within_the_restart_budget(real_cpu: Real, tmp_path: Path) -> None:
    """restartPolicy OnFailure (not ExitCode, which treats 1-127 as permanent) restarts a replica that exits 75,
    as long as --max-restarts (backoffLimit) allows. One 1-CPU pod: one CPU of the node."""
    real = real_cpu
    sched = real.scheduler(f"host:{tmp_path}:{tmp_path}")
    job = JobSpec(
        command=("python", "-c", PREEMPTED_ONCE),
        name="preempted",
        run_dir=str(tmp_path),
        max_restarts=1,
        resources=Resources(nodes=1, mem_bytes=1 << 30),
        env=(("RETRY_S", "0"),),
    )
    sched.submit(job, sched.render(job))
    status = real.wait(
        "the job to finish",
        lambda: (s := sched.status("preempted")).finished and all(r.exit_code is not None for r in s.replicas) and s,
    )
    assert (status.state, status.exit_code, status.restarts) == (SUCCEEDED, 0, 1)


def test_a_job_past_its_restart_budget_leaves_no_running_pod(real_cpu: Real, tmp_path: Path) -> None:
    """With no budget the real kubelet restarts the container in place at once; the controller fails the job when it
    sees the restart count reach the limit, and cleanPodPolicy Running (what hpctrain renders) has it delete the
    restarted pod, which would otherwise run on (here for 10 minutes; on a GPU node, holding its GPUs): the pod
    goes, with SIGTERM and its grace period, as the real kubelet does it. One 1-CPU pod: one CPU of the node."""
    real = real_cpu
    sched = real.scheduler(f"host:{tmp_path}:{tmp_path}")
    job = JobSpec(
        command=("python", "-c", PREEMPTED_ONCE),
        name="preempted",
        run_dir=str(tmp_path),
        signal_grace=5,
        max_restarts=0,
        resources=Resources(nodes=1, mem_bytes=1 << 30),
        env=(("RETRY_S", "600"),),
    )
    manifest = sched.render(job)
    assert manifest.payload["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    sched.submit(job, manifest)
    real.wait("the job to fail", lambda: sched.status("preempted").state == "FAILED")
    real.wait("its pods to be deleted", lambda: sched.pods_of("preempted") == [])
    assert sched.status("preempted").state == "FAILED"
    assert (tmp_path / "attempted-0").is_file()  # the first attempt ran and exited 75


def test_a_job_past_its_deadline_leaves_no_running_pod(real_cpu: Real, tmp_path: Path) -> None:
    """A PyTorchJob past runPolicy.activeDeadlineSeconds: the controller fails it ("active longer than specified
    deadline", counted from status.startTime) and cleanPodPolicy Running has it delete the running pod, which would
    otherwise train on (here sleep 10 minutes; on a GPU node, holding its GPUs); the real kubelet stops it. hpctrain
    renders the deadline as a backstop of --time x attempts + 24 h; the test shortens the rendered one to 5 s so that it
    passes in seconds. One 1-CPU pod: one CPU of the node."""
    real = real_cpu
    sched = real.scheduler(f"host:{tmp_path}:{tmp_path}")
    job = JobSpec(
        command=(
            "python",
            "-c",
            "import pathlib, sys, time; pathlib.Path(sys.argv[1]).touch(); time.sleep(600)",
            str(tmp_path / "started"),
        ),
        name="expiring",
        run_dir=str(tmp_path),
        signal_grace=5,
        time_limit_s=600,
        resources=Resources(nodes=1, mem_bytes=1 << 30),
    )
    manifest = sched.render(job)
    run_policy = manifest.payload["spec"]["runPolicy"]
    assert run_policy["cleanPodPolicy"] == "Running" and run_policy["activeDeadlineSeconds"] == 600 + 24 * 3600
    run_policy["activeDeadlineSeconds"] = 5
    sched.submit(job, manifest)
    real.wait("the pod to start", lambda: (tmp_path / "started").is_file())
    status = real.wait("the job to fail", lambda: (s := sched.status("expiring")).state == "FAILED" and s)
    assert "active longer than specified deadline" in (status.message or ""), status
    real.wait("its pod to be deleted", lambda: sched.pods_of("expiring") == [])
    assert sched.status("expiring").state == "FAILED"


def test_a_sick_node_is_named_in_the_pods_status_with_the_flag_that_avoids_it(
    real: Real, tmp_path: Path, fashion_data_dir: Path
) -> None:
    """The preflight's finding reaches `hpctrain status` through the pods' own status (their termination message),
    with no run directory to read: the node the pods ran on (spec.nodeName, not the pod's host name) and the
    --exclude-nodes to submit with. Rank 1's preflight GEMM reports a twentieth of its rate (tests/ailing_rank.py).
    Two 1-CPU pods: the whole node."""
    from hpctrain.schedulers.kubernetes.queries.display import ended_lines

    sched, node = _scheduler(real, tmp_path, fashion_data_dir), sorted(real.nodes)[0]
    job = JobSpec(
        command=(*_ailing_mnist(fashion_data_dir, tmp_path / "run", 256), "--preflight"),
        name="sick",
        run_dir=str(tmp_path / "run"),
        max_restarts=0,
        resources=Resources(nodes=2, cpus_per_task=1, mem_bytes=2 << 30),
        env=(*THIS_CHECKOUT, ("HPCTRAIN_TEST_AILING_RANK", "1"), ("HPCTRAIN_TEST_AILING", "sick-gemm")),
    )
    manifest = sched.render(job)
    # The job fails at the first restart (no budget); the kubelet keeps restarting the containers meanwhile. The
    # termination messages are read from pods a failed job keeps: those of cleanPodPolicy None (training-operator
    # v1.9.4's default). hpctrain renders Running, which deletes a job's running pods when it fails (and v1.9.3 and
    # earlier deleted them whatever the policy); while the job restarts, `status` reads the same messages.
    manifest.payload["spec"]["runPolicy"]["cleanPodPolicy"] = "None"
    sched.submit(job, manifest)
    status = real.wait(
        "the job to fail",
        lambda: (s := sched.status("sick")).finished and all(r.exit_code is not None for r in s.replicas) and s,
    )
    assert status.state == "FAILED" and status.exit_code == 144, status
    assert [r.message for r in status.replicas] == [f"sick_node: {node}"] * 2, status
    lines = ended_lines(status)
    assert lines[0] == f"ended: master-0, worker-0: sick_node: {node}", lines
    assert f"submit again away from them with `hpctrain submit --exclude-nodes {node} ...`" in lines[1]
    assert (tmp_path / "run" / "bad_nodes").read_text() == f"{node}\n"


def test_debug_stacks_and_top_reach_the_ranks_through_a_pod(real: Real, tmp_path: Path, fashion_data_dir: Path) -> None:
    """Without --run-dir (the pods' volume need not be visible where the user is), `hpctrain debug stacks` asks
    through one pod's exec and prints every rank's answer; `top` shows the ranks' records the same way. Rank 1's
    forward pass never returns after 3 steps (tests/ailing_rank.py: the job stays up, a rank blocked in its
    compute and one in a collective, until the hang watchdog's 120 s, long after the test cancelled it). Two
    1-CPU pods: the whole node."""
    from hpctrain.health import read_progress

    run_dir = tmp_path / "run"
    sched = _scheduler(real, tmp_path, fashion_data_dir)
    job = JobSpec(
        command=_ailing_mnist(fashion_data_dir, run_dir, 12288),
        name="stacks",
        signal_grace=5,
        run_dir=str(run_dir),
        resources=Resources(nodes=2, mem_bytes=2 << 30),
        env=(
            *THIS_CHECKOUT,
            ("HPCTRAIN_TEST_AILING_RANK", "1"),
            ("HPCTRAIN_TEST_AILING", "stall"),
            ("HPCTRAIN_TEST_AILING_S", "3"),
        ),
    )
    sched.submit(job, sched.render(job))
    real.wait("both ranks training", lambda: [r.phase for r in read_progress(run_dir)] == ["training", "training"])
    asked = real.cli("debug", "stacks", "stacks", *real.where, "--wait", "30")
    assert asked.returncode == 0, asked.stdout + asked.stderr
    # The run directory is a host path of this machine's node, so the CLI sees it here (as on a shared file system)
    # and asks the ranks through it, listing each answer's file; where it is not seen, it asks from inside the pod
    # (the exec path: tests/test_top_probe.py's stand-in stream, and test_k8s_replica_logs for the run dir's lookup).
    listed = [Path(line) for line in asked.stdout.splitlines() if line.strip()]
    assert [p.name for p in listed] == ["rank-0.txt", "rank-1.txt"], asked.stdout
    said = "".join(p.read_text() for p in listed)
    assert said.count("hpctrain/health/watchdog.py") >= 2 and "hpctrain/training/" in said
    shown = real.cli("top", "stacks", *real.where)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    rows = [line.split() for line in shown.stdout.splitlines() if line.split()[:1] in (["0"], ["1"])]
    assert [row[0] for row in rows] == ["0", "1"] and all(row[2] == "training" for row in rows), shown.stdout
    sched.cancel("stacks")


# The image's PYTHONPATH names the src/ of the checkout that started the node, which may be another one (a CI base
# at an older commit): the ranks would then speak an older hpctrain's protocol to this checkout's CLI (an older rank
# answers `debug stacks` without the request's token, and every rank looks frozen). THIS_CHECKOUT in a job's env
# and _scheduler's volume make the pods run the hpctrain under test.
THIS_CHECKOUT = (("PYTHONPATH", str(SRC)),)


def _scheduler(real: Real, tmp_path: Path, data_dir: Path) -> KubernetesScheduler:
    """The scheduler of the test's namespace: tmp_path (the run), the data (read-only), tests/ (ailing_rank.py,
    read-only) and this checkout's src/ (read-only; a job's env adds THIS_CHECKOUT) mounted as the pods' volumes."""
    return real.scheduler(
        f"host:{tmp_path}:{tmp_path}",
        f"host:{data_dir}:{data_dir}:ro",
        f"host:{TESTS}:{TESTS}:ro",
        f"host:{SRC}:{SRC}:ro",
    )


def _ailing_mnist(data_dir: Path, run_dir: Path, train_limit: int) -> tuple[str, ...]:
    """`hpctrain train mnist` through tests/ailing_rank.py (HPCTRAIN_TEST_AILING* in the job's env pick the ailment)."""
    return (
        "python",
        str(TESTS / "ailing_rank.py"),
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
        "100",
        "--epochs",
        "1",
        "--threads",
        "1",
        "--run-dir",
        str(run_dir),
    )
