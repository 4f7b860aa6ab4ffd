"""The neutral job summaries each backend's list_jobs returns (the web console's jobs table), read from what each
scheduler prints or stores: Slurm's TRES strings as squeue prints them per release, and PyTorchJob and TrainJob
objects as hpctrain's own renderer writes them, with pods as the API server returns them. (The live listings are
tested against the local Slurm cluster in tests/test_web_slurm.py.)"""

from __future__ import annotations

import pytest

from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.schedulers.base import RUNNING
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
from hpctrain.schedulers.kubernetes.manifests.render import render
from hpctrain.schedulers.kubernetes.queries.kubeflow_objects import job_summary
from hpctrain.schedulers.slurm.queries.job_summaries import gpus_of


@pytest.mark.parametrize(
    ("tres", "gpus"),
    [
        ("gres:gpu:2", 2),  # 22.05
        ("gres/gpu:2", 2),  # 23.02 on
        ("gres/gpu:a100:4", 4),
        ("gres:gpu:1,gres:shard:8", 1),
        ("gres/shard:16", 0),
        ("N/A", 0),
        ("", 0),
        ("gres/gpu:lots", 0),  # a form this reader does not know: no count, no error
    ],
)
def test_slurm_gpus_as_squeue_prints_them(tres, gpus):
    assert gpus_of(tres) == gpus


def pod(job: str, label: str, restarts: int, attempt: str | None = None) -> dict:
    labels = {label: job, **({"jobset.sigs.k8s.io/restart-attempt": attempt} if attempt else {})}
    return {
        "metadata": {"name": f"{job}-x", "labels": labels},
        "status": {"phase": "Running", "containerStatuses": [{"restartCount": restarts, "state": {"running": {}}}]},
    }


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_kubernetes_summary_of_a_rendered_job(api):
    job = JobSpec(
        command=("python", "train.py"),
        name="shape",
        resources=Resources(nodes=3, nproc_per_node=2, gpus_per_node=2, cpus_per_task=1),
    )
    obj = render(job, KubernetesOptions(image="img", api=api))
    obj["metadata"]["creationTimestamp"] = "2026-11-29T10:00:00Z"
    obj["status"] = {
        "conditions": [{"type": "Running", "status": "True"}],
        "jobsStatus": [{"name": "node", "ready": 3}],
    }
    label = "training.kubeflow.org/job-name" if api == "pytorchjob" else "jobset.sigs.k8s.io/jobset-name"
    pods = [pod("shape", label, 1), pod("shape", label, 2, attempt="1" if api == "trainjob" else None)]
    summary = job_summary(obj, api, pods)
    assert (summary.job_id, summary.name, summary.state) == ("shape", "shape", RUNNING)
    assert (summary.replicas, summary.processes_per_node, summary.gpus) == (3, 2, 6)
    assert summary.restarts == 3 + (1 if api == "trainjob" else 0)  # a TrainJob's JobSet recreating its pods too
    assert summary.created == "2026-11-29T10:00:00Z"


def test_kubernetes_summary_of_an_object_written_by_anyone():
    """Counts of the wrong type or sign are no numbers (None or 0), never an error."""
    obj = {
        "metadata": {"name": "odd"},
        "spec": {"nprocPerNode": "auto", "pytorchReplicaSpecs": {"Master": {"replicas": -1}, "Worker": "x"}},
    }
    summary = job_summary(obj, "pytorchjob", [])
    assert (summary.replicas, summary.processes_per_node, summary.gpus, summary.restarts) == (0, None, 0, 0)


def test_slurm_s_not_set_is_no_count():
    """squeue 22.05 prints NumTasks 4294967294 (NO_VAL) for a job that gave no task count: no number, not 4 billion."""
    from hpctrain.schedulers.slurm.queries.job_summaries import _count

    assert (_count("4294967294"), _count("4294967295"), _count("8"), _count("N/A")) == (None, None, 8, None)
