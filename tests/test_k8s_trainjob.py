"""Kubeflow Trainer v2 TrainJobs (`--k8s-api trainjob`) through the CLI, against the real local API server
(scripts/local-k8s.sh), named by its kubeconfig context so no other cluster is ever touched: submit, status, logs
(with --replica), cancel, and a 2-node `hpctrain train mnist` (gloo on CPU) that runs to completion.

The pods are made and run by tests/trainer_standin.py's TrainerStandIn, a test-only fake of the Trainer v2
controller, JobSet, the Job controller and the kubelet (why these tests are not on the real node: its docstring): it creates the pods a TrainJob implies,
with JobSet's labels and the torch plugin's PET_* variables, and runs each pod's command as a local process. The
TrainJob's multi-node command is `torchrun --no-python ...` (as rendered), so `torchrun` must be on the "image's"
PATH: the pods get this interpreter's bin directory first. The "shared volume" is a directory of this machine.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpctrain.schedulers.kubernetes.scheduler import _replica_name
from k8s_fixtures import CONTEXT, DEADLINE_S, LocalK8s, hpctrain
from kubeflow_standin import create_namespace, delete_namespace, wait_for
from trainer_standin import TrainerStandIn
from standins import install

IMAGE = "example.invalid/hpctrain:test"
SLEEPER = ("import os, time; print('hello from rank', os.environ['RANK'], 'node rank', os.environ['PET_NODE_RANK'], "
           "flush=True); time.sleep(300)")




@pytest.fixture
def cluster(k8s_cluster: LocalK8s, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")  # torchrun
    api = k8s_cluster.api_client()
    namespace = create_namespace(api, prefix="hpct-tj")
    standin = TrainerStandIn(api, namespace, tmp_path / "standin", node_labels={"hpctrain-test-node": namespace}).start()
    shared = tmp_path / "shared"
    shared.mkdir()
    where = ["--scheduler", "kubernetes", "--k8s-api", "trainjob", "--context", CONTEXT, "--namespace", namespace]
    job = [*where, "--image", IMAGE, "--node-selector", f"hpctrain-test-node={namespace}",
           "--volume", f"host:{shared}:{shared}", "--run-dir", f"{shared}/runs/%j", "--mem", "1G"]
    yield SimpleNamespace(api=api, namespace=namespace, standin=standin, shared=shared, where=where, job=job)
    standin.stop()
    delete_namespace(api, namespace)


def status_of(c, name: str, cwd: Path) -> dict:
    proc = hpctrain("status", name, "--json", *c.where, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.k8s
@pytest.mark.slow
def test_trainjob_submit_status_logs_cancel(cluster, tmp_path: Path) -> None:
    c = cluster
    bin_dir = install(tmp_path / "bin")
    submitted = hpctrain("submit", *c.job, "--nodes", "2", "--signal-grace", "5", "--job-name", "tj-live",
                         "--setenv", f"PATH={bin_dir}:{os.environ['PATH']}", "--setenv", "STANDIN_GPUS=0, 97, 70000, 81559",
                         "--setenv", f"STANDIN_LOG={tmp_path / 'calls.jsonl'}",
                         "--", sys.executable, "-c", SLEEPER, cwd=tmp_path)
    assert submitted.returncode == 0 and submitted.stdout == "tj-live\n", submitted.stderr
    assert (c.shared / "runs" / "tj-live" / "trainjob.yaml").is_file()

    running = wait_for("both pods running", lambda: (s := status_of(c, "tj-live", tmp_path))["state"] == "RUNNING"
                       and [r["phase"] for r in s["replicas"]] == ["Running", "Running"] and s, c.standin)
    # The pods are JobSet's: found by jobset-name, named by replicated job and completion index.
    assert [r["name"] for r in running["replicas"]] == ["node-0", "node-1"]
    pods = c.standin.core.list_namespaced_pod(c.namespace, label_selector="jobset.sigs.k8s.io/jobset-name=tj-live").items
    assert sorted(p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in pods) == ["0", "1"]
    assert all(r["node"] == c.standin.node for r in running["replicas"])
    listing = hpctrain("status", *c.where, cwd=tmp_path)
    assert listing.stdout.splitlines()[1].split()[:3] == ["tj-live", "RUNNING", "2"], listing

    def log_of(*replica: str) -> str:
        return hpctrain("logs", "tj-live", *replica, *c.where, cwd=tmp_path).stdout

    # torchrun (from the PET_* variables) gives each pod's process its global rank.
    assert wait_for("node 0's log", lambda: "hello from rank 0 node rank 0" in log_of(), c.standin)
    assert wait_for("node 1's log", lambda: "hello from rank 1 node rank 1" in log_of("--replica", "node-1"), c.standin)
    bad = hpctrain("logs", "tj-live", "--replica", "worker-0", *c.where, cwd=tmp_path)
    assert bad.returncode == 2 and "use one of node-0, node-1" in bad.stderr, bad.stderr

    # `top` finds a TrainJob by its name alone and runs its probe in each node's pod (exec to the stand-in kubelet;
    # nvidia-smi is the stand-in of tests/standins.py, on the PATH the job was given: no GPU here).
    where = [w for w in c.where if w not in ("--k8s-api", "trainjob")]
    top = hpctrain("top", "tj-live", *where, cwd=tmp_path)
    assert top.returncode == 0, top.stdout + top.stderr
    pods = [line for line in top.stdout.splitlines() if "(tj-live-node-0-" in line]
    assert len(pods) == 2 and all("97%" in line and "70,000/81,559 MiB" in line for line in pods), top.stdout

    cancelled = hpctrain("cancel", "tj-live", "--wait", str(DEADLINE_S), *c.where, cwd=tmp_path)
    assert cancelled.returncode == 0 and "RUNNING -> deleted" in cancelled.stdout, cancelled
    gone = hpctrain("status", "tj-live", *c.where, cwd=tmp_path)
    assert gone.returncode == 2 and "no TrainJob named 'tj-live'" in gone.stderr
    assert not c.standin.core.list_namespaced_pod(c.namespace).items


@pytest.mark.k8s
@pytest.mark.slow
def test_trainjob_failure_ends_the_wait_with_the_exit_status(cluster, tmp_path: Path) -> None:
    """A pod that keeps failing uses up the Job's backoffLimit; the TrainJob gets Failed and `submit --wait` exits
    with the pod's status."""
    c = cluster
    proc = hpctrain("submit", *c.job, "--job-name", "tj-exit-3", "--wait", "--", sys.executable, "-c",
                    "import sys; sys.exit(3)", cwd=tmp_path)
    assert not c.standin.errors, c.standin.errors
    assert proc.returncode == 3, proc.stderr
    assert "job tj-exit-3 ended FAILED with exit status 3" in proc.stderr
    status = status_of(c, "tj-exit-3", tmp_path)
    assert status["message"] == "jobset failed due to one or more job failures", status
    assert [r["name"] for r in status["replicas"]] == ["node-0"] and status["restarts"] == 6, status


@pytest.mark.k8s
@pytest.mark.slow
def test_trainjob_two_node_mnist_completes(cluster, tmp_path: Path, fashion_data_dir: Path) -> None:
    c = cluster
    run_dir = c.shared / "runs" / "tj-mnist"
    submitted = hpctrain(
        "submit", *c.job, "--nodes", "2", "--job-name", "tj-mnist", "--", sys.executable, "-m", "hpctrain", "train",
        "mnist", "--recipe", "classic", "--dataset", "fashion-mnist", "--data-dir", str(fashion_data_dir),
        "--train-limit", "512", "--test-limit", "100", "--epochs", "1", "--threads", "1", "--log-interval", "1",
        "--run-dir", str(run_dir),
        cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr

    # Follow node 0's log to the end (the log stream ends when its process does), through the API server.
    followed = hpctrain("logs", "tj-mnist", "-f", "--replica", "node-0", *c.where, cwd=tmp_path)
    assert followed.returncode == 0, followed.stderr
    assert "with 2 process(es), ddp, cpu" in followed.stdout, followed.stdout
    assert "hpctrain: epoch 1/1: train loss" in followed.stdout, followed.stdout

    status = wait_for("the TrainJob to complete", lambda: (s := status_of(c, "tj-mnist", tmp_path))["state"]
                      in ("SUCCEEDED", "FAILED") and s, c.standin)
    worker = hpctrain("logs", "tj-mnist", "--replica", "node-1", *c.where, cwd=tmp_path).stdout
    assert status["state"] == "SUCCEEDED" and status["exit_code"] == 0, (status, followed.stdout, worker)
    assert [(r["name"], r["phase"]) for r in status["replicas"]] == [("node-0", "Succeeded"), ("node-1", "Succeeded")]
    # torchrun's agent on node 1 may log its own traceback when node 0's agent (the rendezvous store's host) has
    # already left at the exit barrier: torch's end-of-job race, with the job SUCCEEDED; hpctrain's own never.
    tracebacks = [line for line in (followed.stdout + worker).splitlines()
                  if "Traceback" in line and "elastic/agent/server/api.py" not in line]
    assert not tracebacks, followed.stdout + worker
    assert (run_dir / "stop_reason").read_text().strip() == "completed"
    table = hpctrain("status", "tj-mnist", *c.where, cwd=tmp_path)
    assert table.stdout.startswith("tj-mnist: SUCCEEDED"), table.stdout


def _pod(labels: dict[str, str], annotations: dict[str, str] | None = None) -> SimpleNamespace:
    return SimpleNamespace(metadata=SimpleNamespace(name="x-node-0-1-abcde", labels=labels, annotations=annotations))


def test_trainjob_replica_names_come_from_the_completion_index_label_or_annotation() -> None:
    """Before Kubernetes 1.28 the Job controller sets the completion index only as an annotation."""
    rjob = {"jobset.sigs.k8s.io/replicatedjob-name": "node"}
    index = {"batch.kubernetes.io/job-completion-index": "1"}
    assert _replica_name(_pod({**rjob, **index}, index)) == "node-1"
    assert _replica_name(_pod(rjob, index)) == "node-1"
    assert _replica_name(_pod({"jobset.sigs.k8s.io/replicatedjob-name": "dataset-initializer"}, {
        "batch.kubernetes.io/job-completion-index": "0"})) == "dataset-initializer-0"
    assert _replica_name(_pod({})) == "x-node-0-1-abcde"
