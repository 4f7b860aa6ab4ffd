"""Kubeflow Trainer v2 TrainJobs (`--k8s-api trainjob`) through the CLI, on the local cluster's REAL node
(tests/real_node.py): submit, status, logs (with --replica), top, cancel, a failure that uses up the runtime's
JobSet restarts, and a 2-node `hpctrain train mnist` (gloo on CPU) that runs to completion.

Real: the scheduler, the kubelet and containerd running the training image, logs and exec through the API server,
the pod network, deletion with SIGTERM, the garbage collector. Still a stand-in: the controllers of Trainer v2,
JobSet and the Job controller (tests/trainer_standin.py, controllers only): the 1.20 API server has neither the JobSet
CRD nor Indexed Jobs, so the stand-in makes the pods a TrainJob implies, with JobSet's labels and the torch plugin's
PET_* variables, and node 0's name `<job>-node-0-0.<job>` as a host alias (no cluster DNS). The TrainJob's
multi-node command is `torchrun --no-python ...` (as rendered): the image's PATH has the venv's torchrun. A 2-pod job
takes the whole node (`real`): 1 CPU per pod.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpctrain.schedulers.kubernetes.queries.kubeflow_objects import jobset_restarts, replica_name
from real_node import DEADLINE_S, WHOLE, real_namespace
from standins import install
from trainer_standin import TRAINER_GROUP, TRAINER_VERSION, TrainerStandIn

SLEEPER = (
    "import os, time; print('hello from rank', os.environ['RANK'], 'node rank', os.environ['PET_NODE_RANK'], "
    "flush=True); time.sleep(300)"
)


def _with_trainer(tmp_path: Path, cpus: int | None) -> Iterator[SimpleNamespace]:
    with real_namespace(tmp_path, cpus, TrainerStandIn) as real:
        shared = tmp_path / "shared"
        shared.mkdir()
        where = [*real.where, "--k8s-api", "trainjob"]
        job = [
            *where,
            "--image",
            real.image,
            "--volume",
            f"host:{shared}:{shared}",
            "--run-dir",
            f"{shared}/runs/%j",
            "--cpus-per-task",
            "1",
            "--mem",
            "1G",
        ]
        yield SimpleNamespace(
            real=real, standin=real.standin, namespace=real.namespace, shared=shared, where=where, job=job
        )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SimpleNamespace]:
    """A namespace with the Trainer stand-in, holding the whole node (2-pod jobs)."""
    yield from _with_trainer(tmp_path, WHOLE)


@pytest.fixture
def cluster_cpu(tmp_path: Path) -> Iterator[SimpleNamespace]:
    """A namespace with the Trainer stand-in, holding one CPU of the node (1-pod jobs)."""
    yield from _with_trainer(tmp_path, 1)


def status_of(c: SimpleNamespace, name: str) -> dict:
    proc = c.real.cli("status", name, "--json", *c.where)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.k8s
@pytest.mark.slow
@pytest.mark.real_node
def test_trainjob_submit_status_logs_cancel(cluster: SimpleNamespace, tmp_path: Path) -> None:
    c = cluster
    bin_dir = install(c.shared / "bin")
    submitted = c.real.cli(
        "submit",
        *c.job,
        "--nodes",
        "2",
        "--signal-grace",
        "5",
        "--job-name",
        "tj-live",
        "--setenv",
        f"PATH={bin_dir}:/var/cache/hpctrain/venv/bin:/usr/local/bin:/usr/bin:/bin",
        "--setenv",
        "STANDIN_GPUS=0, 97, 70000, 81559",
        "--setenv",
        f"STANDIN_LOG={c.shared / 'calls.jsonl'}",
        "--",
        "python",
        "-c",
        SLEEPER,
        cwd=tmp_path,
    )
    assert submitted.returncode == 0 and submitted.stdout == "tj-live\n", submitted.stderr
    assert (c.shared / "runs" / "tj-live" / "trainjob.yaml").is_file()

    running = c.real.wait(
        "both pods running",
        lambda: (
            (s := status_of(c, "tj-live"))["state"] == "RUNNING"
            and [r["phase"] for r in s["replicas"]] == ["Running", "Running"]
            and s
        ),
    )
    # The pods are JobSet's: found by jobset-name, named by replicated job and completion index.
    assert [r["name"] for r in running["replicas"]] == ["node-0", "node-1"]
    pods = c.standin.core.list_namespaced_pod(
        c.namespace, label_selector="jobset.sigs.k8s.io/jobset-name=tj-live"
    ).items
    assert sorted(p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in pods) == ["0", "1"]
    assert {r["node"] for r in running["replicas"]} <= c.real.nodes, running
    listing = c.real.cli("status", *c.where)
    assert listing.stdout.splitlines()[1].split()[:3] == ["tj-live", "RUNNING", "2"], listing

    def log_of(*replica: str) -> str:
        return c.real.cli("logs", "tj-live", *replica, *c.where).stdout

    # torchrun (from the PET_* variables; node 1 reaches node 0 by its JobSet name) gives each pod's process its
    # global rank.
    assert c.real.wait("node 0's log", lambda: "hello from rank 0 node rank 0" in log_of())
    assert c.real.wait("node 1's log", lambda: "hello from rank 1 node rank 1" in log_of("--replica", "node-1"))
    bad = c.real.cli("logs", "tj-live", "--replica", "worker-0", *c.where)
    assert bad.returncode == 2 and "use one of node-0, node-1" in bad.stderr, bad.stderr

    # `top` finds a TrainJob by its name alone and runs its probe in each node's pod (real exec: API server ->
    # kubelet -> containerd; nvidia-smi is the stand-in of tests/standins.py, on the PATH the job was given).
    where = [w for w in c.where if w not in ("--k8s-api", "trainjob")]
    top = c.real.cli("top", "tj-live", *where)
    assert top.returncode == 0, top.stdout + top.stderr
    pods = [line for line in top.stdout.splitlines() if "(tj-live-node-0-" in line]
    assert len(pods) == 2 and all("97%" in line and "68.4 GiB/79.6 GiB" in line for line in pods), top.stdout

    cancelled = c.real.cli("cancel", "tj-live", "--wait", str(DEADLINE_S), *c.where)
    assert cancelled.returncode == 0 and "RUNNING -> deleted" in cancelled.stdout, cancelled
    gone = c.real.cli("status", "tj-live", *c.where)
    assert gone.returncode == 2 and "no TrainJob named 'tj-live'" in gone.stderr
    assert not c.standin.core.list_namespaced_pod(c.namespace).items


@pytest.mark.k8s
@pytest.mark.slow
@pytest.mark.real_node
def test_trainjob_failure_ends_the_wait_with_the_exit_status(cluster_cpu: SimpleNamespace, tmp_path: Path) -> None:
    """--max-restarts 1 on a TrainJob: it runs on hpctrain's own TrainingRuntime (restartPolicy Never, the Job's
    backoffLimit 0, JobSet failurePolicy maxRestarts 1), so a pod that keeps failing has JobSet recreate the set once
    (no in-place restart), then the TrainJob gets Failed and `submit --wait` exits with the pod's status. --replace
    makes the new job its own runtime; cancelling the job has the garbage collector remove the runtime (its owner)."""
    from kubernetes.client.rest import ApiException

    c = cluster_cpu
    proc = c.real.cli(
        "submit",
        *c.job,
        "--max-restarts",
        "1",
        "--job-name",
        "tj-exit-3",
        "--wait",
        "--",
        "python",
        "-c",
        "import sys; sys.exit(3)",
        cwd=tmp_path,
    )
    assert not c.standin.errors, c.standin.errors
    assert proc.returncode == 3, proc.stderr
    assert "its restart budget is its own TrainingRuntime hpctrain-tj-exit-3, owned by the TrainJob" in proc.stderr
    assert "job tj-exit-3 ended FAILED with exit status 3" in proc.stderr
    status = status_of(c, "tj-exit-3")
    assert status["message"] == "jobset failed due to reaching max number of restarts", status
    assert [r["name"] for r in status["replicas"]] == ["node-0"] and status["restarts"] == 1, status

    def runtime() -> dict | None:
        try:
            return c.standin.custom.get_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, c.namespace, "trainingruntimes", "hpctrain-tj-exit-3"
            )
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    first = runtime()["metadata"]["ownerReferences"][0]
    assert first["name"] == "tj-exit-3"
    # --replace with another budget: the old job goes (and its runtime with it), the new one gets its own runtime.
    again = c.real.cli(
        "submit",
        *c.job,
        "--max-restarts",
        "2",
        "--replace",
        "--job-name",
        "tj-exit-3",
        "--",
        "python",
        "-c",
        "import time; time.sleep(300)",
        cwd=tmp_path,
    )
    assert again.returncode == 0 and "--replace: deleted the earlier TrainJob tj-exit-3 (FAILED" in again.stderr, (
        again.stderr
    )
    new = runtime()
    assert new["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 2
    assert new["metadata"]["ownerReferences"][0]["uid"] != first["uid"]
    cancelled = c.real.cli("cancel", "tj-exit-3", "--wait", str(DEADLINE_S), *c.where)
    assert cancelled.returncode == 0, cancelled
    c.real.wait("the runtime to go with its job", lambda: runtime() is None)


@pytest.mark.k8s
@pytest.mark.slow
@pytest.mark.real_node
def test_trainjob_two_node_mnist_completes(cluster: SimpleNamespace, tmp_path: Path, fashion_data_dir: Path) -> None:
    c = cluster
    run_dir = c.shared / "runs" / "tj-mnist"
    submitted = c.real.cli(
        "submit",
        *c.job,
        "--volume",
        f"host:{fashion_data_dir}:{fashion_data_dir}:ro",
        "--nodes",
        "2",
        "--job-name",
        "tj-mnist",
        "--",
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
        str(fashion_data_dir),
        "--train-limit",
        "512",
        "--test-limit",
        "100",
        "--epochs",
        "1",
        "--threads",
        "1",
        "--log-interval",
        "1",
        "--run-dir",
        str(run_dir),
        cwd=tmp_path,
    )
    assert submitted.returncode == 0, submitted.stderr

    # Follow node 0's log to the end (the log stream ends when its container does), through the API server.
    c.real.wait(
        "node 0 running",
        lambda: (
            [r["phase"] for r in status_of(c, "tj-mnist")["replicas"]][:1] in (["Running"], ["Succeeded"], ["Failed"])
        ),
    )
    followed = c.real.cli("logs", "tj-mnist", "-f", "--replica", "node-0", *c.where)
    assert followed.returncode == 0, followed.stderr
    assert "with 2 process(es), ddp, cpu" in followed.stdout, followed.stdout
    assert "hpctrain: epoch 1/1: train loss" in followed.stdout, followed.stdout

    status = c.real.wait(
        "the TrainJob to complete", lambda: (s := status_of(c, "tj-mnist"))["state"] in ("SUCCEEDED", "FAILED") and s
    )
    worker = c.real.cli("logs", "tj-mnist", "--replica", "node-1", *c.where).stdout
    assert status["state"] == "SUCCEEDED" and status["exit_code"] == 0, (status, followed.stdout, worker)
    assert [(r["name"], r["phase"]) for r in status["replicas"]] == [("node-0", "Succeeded"), ("node-1", "Succeeded")]
    # torchrun's agent on node 1 may log its own traceback when node 0's agent (the rendezvous store's host) has
    # already left at the exit barrier: torch's end-of-job race, with the job SUCCEEDED; hpctrain's own never.
    tracebacks = [
        line
        for line in (followed.stdout + worker).splitlines()
        if "Traceback" in line and "elastic/agent/server/api.py" not in line
    ]
    assert not tracebacks, followed.stdout + worker
    assert (run_dir / "stop_reason").read_text().strip() == "completed"
    table = c.real.cli("status", "tj-mnist", *c.where)
    assert table.stdout.startswith("tj-mnist: SUCCEEDED"), table.stdout


def _pod(labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict:
    """A pod as the API server's JSON (the backend reads pods as dicts: rest.py)."""
    return {"metadata": {"name": "x-node-0-1-abcde", "labels": labels, "annotations": annotations}}


def test_trainjobreplica_names_come_from_the_completion_index_label_or_annotation() -> None:
    """Before Kubernetes 1.28 the Job controller sets the completion index only as an annotation."""
    rjob = {"jobset.sigs.k8s.io/replicatedjob-name": "node"}
    index = {"batch.kubernetes.io/job-completion-index": "1"}
    assert replica_name(_pod({**rjob, **index}, index)) == "node-1"
    assert replica_name(_pod(rjob, index)) == "node-1"
    assert (
        replica_name(
            _pod(
                {"jobset.sigs.k8s.io/replicatedjob-name": "dataset-initializer"},
                {"batch.kubernetes.io/job-completion-index": "0"},
            )
        )
        == "dataset-initializer-0"
    )
    assert replica_name(_pod({})) == "x-node-0-1-abcde"


def test_trainjob_restarts_count_the_jobsets_recreations() -> None:
    """JobSet's failurePolicy restarts make new pods (restartCount 0): their restart-attempt label counts them."""
    attempt = "jobset.sigs.k8s.io/restart-attempt"
    assert jobset_restarts([_pod({attempt: "2"}), _pod({attempt: "2"})]) == 2
    assert jobset_restarts([_pod({}), _pod({"jobset.sigs.k8s.io/replicatedjob-name": "node"})]) == 0
    assert jobset_restarts([]) == 0
