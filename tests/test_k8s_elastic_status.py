"""Issue 42 item 2 on Kubernetes: `hpctrain status` and `status JOB` of an elastic PyTorchJob (`--nodes 1:2`) show
its running worker pods against its elasticPolicy's minReplicas:maxReplicas ("1 of 1:2"), and `status JOB` the
run's own node count and membership changes where this machine reads the run directory.

Against the real local API server (scripts/local-k8s.sh): hpctrain submits the rendered PyTorchJob; the PyTorchJob
controller is tests/kubeflow_standin.py (training-operator v1.9.4's elastic behaviour: the Worker pods, worker-1
made once worker-0 is Ready, a deleted worker made again); no kubelet runs there, so the pod phases are written
through the status subresource as a kubelet would (test_kubeflow_standins.set_phase). The run directory's record
is written by the training loop's own writer (provenance.record_attempt), as an elastic group's rank 0 writes it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.schedulers.base import Table, View
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
from hpctrain.schedulers.kubernetes.scheduler import KubernetesScheduler
from hpctrain.training.provenance import record_attempt
from k8s_fixtures import LocalK8s
from kubeflow_standin import KubeflowStandIn, create_namespace, delete_namespace
from test_kubeflow_standins import pods, set_phase

pytestmark = pytest.mark.k8s
IMAGE = "example.invalid/pytorch:latest"


@pytest.fixture
def standin(k8s_cluster: LocalK8s) -> Iterator[KubeflowStandIn]:
    api = k8s_cluster.api_client()
    namespace = create_namespace(api, "hpct-elastic")
    try:
        yield KubeflowStandIn(api, namespace)  # not started: the test runs its passes
    finally:
        delete_namespace(api, namespace)


def submit(standin: KubeflowStandIn, host_dir: Path, name: str, min_nodes: int | None) -> KubernetesScheduler:
    options = KubernetesOptions(namespace=standin.namespace, image=IMAGE, volumes=(f"host:{host_dir}:/mnt/runs",))
    sched = KubernetesScheduler(options, api_client=standin.core.api_client)
    job = JobSpec(
        command=("hpctrain", "train", "mnist"),
        name=name,
        run_dir=f"/mnt/runs/{name}",
        max_restarts=3,
        resources=Resources(nodes=2, min_nodes=min_nodes, nproc_per_node=1, cpus_per_task=1),
    )
    sched.submit(job, sched.render(job))
    return sched


def shown(view: View) -> str:
    parts = view.text_parts()
    return "\n".join(p if isinstance(p, str) else "\n".join("  ".join(row) for row in p.rows) for p in parts)


def replicas_cells(sched: KubernetesScheduler) -> dict[str, str]:
    [table] = sched.status_view(None).text_parts()
    assert isinstance(table, Table)
    return {row[0]: row[2] for row in table.rows}


def test_status_shows_an_elastic_pytorchjobs_running_workers_against_its_range(
    standin: KubeflowStandIn, tmp_path: Path
) -> None:
    sched = submit(standin, tmp_path, "ej", min_nodes=1)
    submit(standin, tmp_path, "fixed", min_nodes=None)  # a fixed-size job beside it keeps its replica count
    standin.reconcile()
    set_phase(standin, "ej-worker-0", "Running")
    standin.reconcile()  # worker-1 is made once worker-0 is Ready
    assert "ej-worker-1" in pods(standin)

    assert replicas_cells(sched) == {"ej": "1 of 1:2", "fixed": "2"}
    records = sched.status_view(None).json_records()
    assert {r["job_id"]: r.get("nodes") for r in records} == {"ej": "1 of 1:2", "fixed": None}
    one = shown(sched.status_view("ej"))
    assert re.search(r"^workers: +1 of 1:2 running ", one, re.MULTILINE), one
    assert "nodes:" not in one  # no run record yet: nothing read from it

    set_phase(standin, "ej-worker-1", "Running")
    run_dir = tmp_path / "ej"
    run_dir.mkdir()
    record_attempt(run_dir, ["ej-worker-0", "ej-worker-1"], {"world_size": 2, "nodes": 2, "requested_nodes": "1:2"})
    assert replicas_cells(sched)["ej"] == "2 of 1:2"

    standin.core.delete_namespaced_pod("ej-worker-1", standin.namespace, grace_period_seconds=0)
    lost = {"lost_nodes": ["ej-worker-1"], "lost_at_step": 9, "since_loss_s": 40, "resumed_step": 8}
    record_attempt(
        run_dir,
        ["ej-worker-0"],
        {"world_size": 1, "nodes": 1, "requested_nodes": "1:2", "worker_group_restart": 1, **lost},
    )
    one = shown(sched.status_view("ej"))
    assert re.search(r"^workers: +1 of 1:2 running ", one, re.MULTILINE), one
    assert re.search(r"^nodes: +1 of 1:2 \(elastic; the run's last group\)$", one, re.MULTILINE), one
    assert re.search(r"^membership: +ej-worker-1 lost at step 9; continued on 1 node at step 8 after 40 s", one, re.M)
    fixed = shown(sched.status_view("fixed"))
    assert "workers:" not in fixed and "nodes:" not in fixed
    assert not standin.errors, standin.errors
