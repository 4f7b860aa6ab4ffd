"""hpctrain's own TrainingRuntime: how a TrainJob gets `--max-restarts N` (N whole-job incidents).

Trainer v2.3's runtime patch cannot set a restart budget (it patches the JobSet's pod templates, not its
failurePolicy), and the cluster's ClusterTrainingRuntimes carry whatever budget the admin chose (torch-distributed:
none at the JobSet, the Job's default backoffLimit 6 of in-place restarts). So a TrainJob with --max-restarts N > 0
runs on a namespaced TrainingRuntime that hpctrain renders with it, named `hpctrain-JOB`:

* the torch runtime's shape (Trainer v2.3.0 manifests/base/runtimes/torch_distributed.yaml: mlPolicy torch, one
  replicated job `node` labelled as the trainer's ancestor, its container `node`), with the job's image;
* the `node` Job with backoffLimit 0 and pods restartPolicy Never: any pod that fails (a crash, exit 75 at the time
  limit, an eviction) fails the Job at once (Kubernetes pkg/controller/job/job_controller.go: failed pods
  `> backoffLimit`), and nothing restarts in place beside the set's other pods;
* JobSet's failurePolicy.maxRestarts N: a failed Job makes JobSet delete and recreate every Job of the set (every
  pod, a new restart-attempt), while its restarts that count toward the limit are fewer than maxRestarts, and fail
  the set (reason ReachedMaxRestarts) after that (kubernetes-sigs/jobset v0.12.0, pkg/controllers/failure_policy.go
  restartJobSetActionApplier: `RestartsCountTowardsMax >= MaxRestarts` fails it). One incident costs one restart
  however many pods it took down: N incidents exactly.

The runtime belongs to its TrainJob: `submit` creates it first (Trainer's validator refuses a TrainJob whose
TrainingRuntime does not exist yet: pkg/runtime/core/trainingruntime.go ValidateObjects, "specified trainingRuntime
must be created before the TrainJob is created"), then the TrainJob, then makes the TrainJob the runtime's owner,
so deleting the job (`cancel`, `--replace`, `kubectl delete`) has Kubernetes' garbage collector remove the runtime
too. It carries the labels app.kubernetes.io/managed-by=hpctrain and hpctrain.io/job=JOB, so a runtime left by a
submit that died half-way is visible (`kubectl get trainingruntimes -l app.kubernetes.io/managed-by=hpctrain`) and
the next submit of that name replaces it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hpctrain.errors import UserError
from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers.kubernetes.options import KubernetesOptions

GROUP, VERSION, PLURAL, KIND = "trainer.kubeflow.org", "v1alpha1", "trainingruntimes", "TrainingRuntime"
JOB_LABEL = "hpctrain.io/job"
MANAGED_BY = ("app.kubernetes.io/managed-by", "hpctrain")
NODE = "node"  # the torch runtime's replicated job and container
GONE_WAIT_S = 120


def runtime_name(job_name: str) -> str:
    return f"hpctrain-{job_name}"


def own_runtime(job: JobSpec, options: KubernetesOptions) -> dict[str, Any] | None:
    """The TrainingRuntime a TrainJob with --max-restarts runs on (module docstring); None when it needs none."""
    if options.api != "trainjob" or not job.max_restarts:
        return None
    labels = {
        MANAGED_BY[0]: MANAGED_BY[1],
        **options.label_map,
        JOB_LABEL: job.name,
        "trainer.kubeflow.org/framework": "torch",
    }
    pod = {"restartPolicy": "Never", "containers": [{"name": NODE, "image": options.image}]}
    node = {
        "name": NODE,
        "replicas": 1,
        "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": {"backoffLimit": 0, "template": {"spec": pod}},
        },
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": runtime_name(job.name), "namespace": options.namespace, "labels": labels},
        "spec": {
            "mlPolicy": {"numNodes": job.resources.nodes, "torch": {}},
            "template": {"spec": {"failurePolicy": {"maxRestarts": job.max_restarts}, "replicatedJobs": [node]}},
        },
    }


def submit_with(sched: Any, job: JobSpec, runtime: dict[str, Any], create: Callable[[], str]) -> str:
    """Create `runtime`, then the TrainJob (`create`), then own the runtime by it; the runtime goes again when the
    TrainJob could not be made, so nothing is left half-made."""
    _create(sched, job, runtime)
    try:
        job_id = create()
    except BaseException:
        _delete(sched, runtime["metadata"]["name"])
        raise
    owner = sched.get_object(job_id)["metadata"]
    ref = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob", "name": owner["name"], "uid": owner["uid"]}
    sched.custom.patch_namespaced_custom_object(
        GROUP, VERSION, sched.namespace, PLURAL, runtime["metadata"]["name"], {"metadata": {"ownerReferences": [ref]}}
    )
    return job_id


def _create(sched: Any, job: JobSpec, runtime: dict[str, Any]) -> None:
    """Create the runtime; one of the name that hpctrain made for an earlier job of this name is replaced (after that
    job, with --replace), one that hpctrain did not make is left alone and refused."""
    from kubernetes.client.rest import ApiException

    name = runtime["metadata"]["name"]
    create = lambda: sched.custom.create_namespaced_custom_object(GROUP, VERSION, sched.namespace, PLURAL, runtime)  # noqa: E731
    try:
        create()
        return
    except ApiException as err:
        if err.status == 403:  # shared clusters may let users make jobs but not runtimes
            raise UserError(
                f"creating the TrainJob's own TrainingRuntime {name} (its --max-restarts budget) in namespace "
                f"{sched.namespace} is forbidden (403): ask the admin for the right to create trainingruntimes "
                "there, or drop --max-restarts (the job then has its runtime's budget)"
            ) from None
        if err.status != 409:
            raise
    old = sched.custom.get_namespaced_custom_object(GROUP, VERSION, sched.namespace, PLURAL, name)
    labels = old["metadata"].get("labels") or {}
    if labels.get(MANAGED_BY[0]) != MANAGED_BY[1] or labels.get(JOB_LABEL) != job.name:
        raise UserError(
            f"namespace {sched.namespace} has a TrainingRuntime {name!r} that hpctrain did not make for "
            f"this job; --max-restarts needs that name for the job's own runtime: pick another --job-name"
        )
    owners = [o for o in old["metadata"].get("ownerReferences") or [] if o.get("kind") == "TrainJob"]
    if owners and _exists(sched, owners[0]):
        if not sched.options.replace:  # the TrainJob of this name is there: the same refusal as its create's
            raise UserError(
                f"a TrainJob named {job.name!r} already exists in namespace {sched.namespace}: pick "
                f"another --job-name, cancel the old one (`{sched.command('cancel', job.name)}`), or "
                "pass --replace"
            )
        sched.replaced = sched._delete_and_wait(job.name)
    _delete(sched, name)  # the earlier job's: its garbage collection may not have come yet
    deadline = time.monotonic() + GONE_WAIT_S
    while time.monotonic() < deadline:
        try:
            create()
            return
        except ApiException as err:
            if err.status != 409:
                raise
        time.sleep(0.5)
    raise UserError(
        f"the earlier TrainingRuntime {name} is still being deleted after {GONE_WAIT_S} s: nothing new "
        f"was created; `{sched.kubectl('get', 'trainingruntime', '-n', sched.namespace, name)}` shows when "
        "it is gone"
    )


def _exists(sched: Any, owner: dict[str, Any]) -> bool:
    """Whether the TrainJob `owner` names is still there (the same object: its uid) and not being deleted."""
    from hpctrain.schedulers.base import JobNotFound

    try:
        meta = sched.get_object(owner["name"])["metadata"]
    except JobNotFound:
        return False
    return meta.get("uid") == owner.get("uid") and not meta.get("deletionTimestamp")


def _delete(sched: Any, name: str) -> None:
    from kubernetes.client.rest import ApiException

    try:
        sched.custom.delete_namespaced_custom_object(GROUP, VERSION, sched.namespace, PLURAL, name)
    except ApiException as err:
        if err.status != 404:
            raise
