"""Issue 42 on the REAL node (tests/real_node.py: a kubelet with containerd, kube-scheduler, kube-controller-manager;
the PyTorchJob controller is tests/kubeflow_standin.py, which models training-operator v1.9.4's elasticPolicy): an
elastic PyTorchJob (`--nodes 1:2 --max-restarts 3`, Worker pods under torchrun with the controller's PET_*) has one
worker pod deleted mid-epoch and goes on to complete from its checkpoint, never recorded as a cancel. CPU, gloo.

What happens on the way, as seen on this node (torch 2.14): the controller makes the deleted pod again at once
(ReconcilePods), so worker-0 never trains alone: the new pod's agent asks to join, worker-0's agent stops its worker
for the new round (torch's scale-up), and that round died in torch's own rendezvous on both agents (DistStoreError,
wait timeout on role_info: pytorch/pytorch#123678, #147064); the kubelet restarted both containers (restartPolicy
OnFailure, within backoffLimit) and the fresh group of two resumed from the checkpoint. The test asserts the outcome
(completed, resumed from a checkpoint, no cancel), not that path: a torch that fixes scale-up re-forms in place.

The training processes are paused (SIGSTOP, from this host: the node) while the pod is deleted, so nothing depends
on how fast the CPUs train."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

client = pytest.importorskip("kubernetes.client", reason="the k8s extra (pip install 'hpctrain[k8s]') is not installed")

from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.schedulers import blocking
from hpctrain.schedulers.base import SUCCEEDED
from real_node import Real, real  # noqa: F401 - the fixture: the whole node
from slurm_fixtures import paused
from test_k8s_real_jobs import RESUME_LIMIT, finished, mnist

pytestmark = [pytest.mark.k8s, pytest.mark.slow]


def test_an_elastic_pytorchjob_goes_on_when_a_worker_pod_is_deleted(
    real: Real, tmp_path: Path, fashion_data_dir: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    run_dir = shared / "elastic"
    sched = real.scheduler(f"host:{fashion_data_dir}:{fashion_data_dir}:ro", f"host:{shared}:{shared}")
    job = JobSpec(
        command=(*mnist(fashion_data_dir, run_dir, RESUME_LIMIT, 2), "--checkpoint-every", "8"),
        name="elastic",
        run_dir=str(run_dir),
        max_restarts=3,
        resources=Resources(nodes=2, min_nodes=1, cpus_per_task=1, mem_bytes=2 * 1024**3),
    )
    assert blocking(sched.check(job)) == [], sched.check(job)
    assert sched.submit(job, sched.render(job)) == "elastic"
    pids = real.training_pids(run_dir, 2)
    [table] = sched.status_view(None).text_parts()  # both workers' pods run: `status` says so against the range
    assert [row[2] for row in table.rows if row[0] == "elastic"] == ["2 of 1:2"], table.rows
    checkpoints = run_dir / "checkpoints"
    real.wait("a first checkpoint", lambda: checkpoints.is_dir() and any(checkpoints.glob("checkpoint_step_*.pt")))
    with paused(pids):
        client.CoreV1Api(real.api).delete_namespaced_pod("elastic-worker-1", real.namespace, grace_period_seconds=0)
        real.wait("worker-1's training process to end", lambda: sum(Path(f"/proc/{p}").exists() for p in pids) < 2)
    status = real.wait("the job to finish", lambda: finished(sched, "elastic"))
    log = "\n".join(sched.logs("elastic", replica="worker-0"))
    assert status.state == SUCCEEDED, (status, log)
    assert (run_dir / "stop_reason").read_text().strip() == "completed", log
    record = json.loads((run_dir / "provenance.json").read_text())["attempts"]
    assert len(record) >= 2 and record[0]["world_size"] == 2, record  # a second group started after the loss
    resumed = [
        int(m) for m in re.findall(r"hpctrain: resumed at epoch \d+, step \d+ of \d+ \(global step (\d+)\)", log)
    ]
    assert resumed and resumed[-1] >= 8, log  # from a checkpoint the two wrote (every 8 steps), not from scratch
    assert "cancelled" not in log.lower(), log
    shown = "\n".join(p for p in sched.status_view("elastic").text_parts() if isinstance(p, str))
    assert re.search(r"^workers: +\d of 1:2 running ", shown, re.MULTILINE), shown
    last = record[-1]["nodes"]  # the run directory is read here: its last group beside the range asked for
    assert re.search(rf"^nodes: +{last} of 1:2 \(elastic; the run's last group\)$", shown, re.MULTILINE), shown
