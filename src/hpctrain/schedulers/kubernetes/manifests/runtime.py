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

The runtime belongs to its TrainJob, and `submit` owns what lies between its steps (submit_with):

1. the runtime, not yet owned (Trainer's validator refuses a TrainJob whose TrainingRuntime does not exist yet:
   pkg/runtime/core/trainingruntime.go ValidateObjects, "specified trainingRuntime must be created before the
   TrainJob is created");
2. the TrainJob, suspended (spec.suspend, in the vendored CRD): nothing runs while its runtime is not its own;
3. the runtime deleted and created again with the TrainJob as its owner (the uid from step 2): a create, so a user
   who may create and delete runtimes but not patch them gets an owned runtime too;
4. the TrainJob resumed (a merge patch of spec.suspend).

A step that fails (a refusal, a 403, Ctrl-C) deletes what the steps before it made, and the error says what, if
anything, could not be deleted. Deleting the job (`cancel`, `--replace`, `kubectl delete`) has Kubernetes' garbage
collector remove the runtime too. It carries the labels app.kubernetes.io/managed-by=hpctrain and
hpctrain.io/job=JOB, so a runtime left by a submit killed half-way (SIGKILL) is visible (`kubectl get
trainingruntimes -l app.kubernetes.io/managed-by=hpctrain`) and the next submit of that name replaces it; a runtime
of the name that another TrainJob owns, or that hpctrain did not make, is refused and never deleted, --replace or
not.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hpctrain.errors import UserError
from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions

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
    # The container's termination message: the end of its log when it fails (render.py, replica_logs.py); the
    # cluster's runtimes set what their admin chose, and a TrainJob's runtime patch cannot set it (Trainer v2.3).
    container = {"name": NODE, "image": options.image, "terminationMessagePolicy": "FallbackToLogsOnError"}
    pod = {"restartPolicy": "Never", "containers": [container]}
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


def submit_with(sched: Any, job: JobSpec, runtime: dict[str, Any], manifest: dict[str, Any]) -> str:
    """The four steps of the module docstring; a failure at any of them deletes what the earlier ones made."""
    from kubernetes.client.rest import ApiException

    name = runtime["metadata"]["name"]
    _create(sched, job, runtime)  # 1
    made = [("TrainingRuntime", name, lambda: _delete(sched, name))]
    step = f"creating the TrainJob {job.name}"
    try:
        suspended = {**manifest, "spec": {**manifest["spec"], "suspend": True}}
        created = sched._create(job, suspended)  # 2
        made.insert(0, ("TrainJob", job.name, lambda: _delete_job(sched, job.name)))
        meta = created["metadata"]
        owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob", "name": meta["name"], "uid": meta["uid"]}
        step = f"making the TrainingRuntime {name} the TrainJob's own (deleting it and creating it again, owned)"
        _delete(sched, name)  # 3
        _create_anew(sched, {**runtime, "metadata": {**runtime["metadata"], "ownerReferences": [owner]}})
        step = f"resuming the suspended TrainJob {job.name}"
        sched.custom.patch_namespaced_custom_object(  # 4
            GROUP, VERSION, sched.namespace, "trainjobs", job.name, {"spec": {"suspend": False}}
        )
    except BaseException as err:
        left = _undo(made)
        if isinstance(err, ApiException) and err.status == 403:
            raise UserError(
                f"{step} in namespace {sched.namespace} is forbidden (403): --max-restarts on a TrainJob needs the "
                "rights to create and delete trainingruntimes and to create and patch trainjobs there; ask the "
                "admin for them, or drop --max-restarts (the job then has its runtime's budget); " + left
            ) from None
        if isinstance(err, UserError):
            raise UserError(f"{err}; {left}") from None
        raise
    return meta["name"]


def _undo(made: list[tuple[str, str, Callable[[], None]]]) -> str:
    """Delete what a failed submit made, newest first; what was (not) left, as the end of its error."""
    kept = []
    for kind, name, delete in made:
        try:
            delete()
        except Exception:  # said in the error on its way; the next undo still runs
            kept.append(f"{kind} {name}")
    if not kept:
        return "nothing was left behind"
    return f"could not delete {' and '.join(kept)}: delete it by hand (`kubectl delete`)"


def _delete_job(sched: Any, name: str) -> None:
    from kubernetes.client.rest import ApiException

    try:
        sched.custom.delete_namespaced_custom_object(GROUP, VERSION, sched.namespace, "trainjobs", name)
    except ApiException as err:
        if err.status != 404:
            raise


def _create_anew(sched: Any, body: dict[str, Any]) -> None:
    """Create `body`, waiting while an object of its name is still being deleted."""
    from kubernetes.client.rest import ApiException

    name = body["metadata"]["name"]
    deadline = time.monotonic() + GONE_WAIT_S
    while True:
        try:
            sched.custom.create_namespaced_custom_object(GROUP, VERSION, sched.namespace, PLURAL, body)
            return
        except ApiException as err:
            if err.status != 409:
                raise
            if time.monotonic() > deadline:
                break
        time.sleep(0.5)
    raise UserError(
        f"the earlier TrainingRuntime {name} is still being deleted after {GONE_WAIT_S} s; "
        f"`{sched.kubectl('get', 'trainingruntime', '-n', sched.namespace, name)}` shows when it is gone"
    )


def _create(sched: Any, job: JobSpec, runtime: dict[str, Any]) -> None:
    """Step 1: create the runtime; one of the name that hpctrain made for an earlier job of this name is replaced
    (after that job, with --replace); one that hpctrain did not make, or that another TrainJob owns, is left alone
    and refused."""
    from kubernetes.client.rest import ApiException

    name = runtime["metadata"]["name"]
    try:
        sched.custom.create_namespaced_custom_object(GROUP, VERSION, sched.namespace, PLURAL, runtime)
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
    owners = old["metadata"].get("ownerReferences") or []
    others = [o for o in owners if (o.get("kind"), o.get("name")) != ("TrainJob", job.name)]
    if others:  # never ours to delete, whatever --replace says
        raise UserError(
            f"namespace {sched.namespace} has a TrainingRuntime {name!r} owned by the {others[0].get('kind')} "
            f"{others[0].get('name')!r}, not by a TrainJob {job.name!r}; --max-restarts needs that name for the "
            "job's own runtime: pick another --job-name"
        )
    if owners and _exists(sched, owners[0]):
        if not sched.options.replace:  # the TrainJob of this name is there: the same refusal as its create's
            raise UserError(
                f"a TrainJob named {job.name!r} already exists in namespace {sched.namespace}: pick "
                f"another --job-name, cancel the old one (`{sched.command('cancel', job.name)}`), or "
                "pass --replace"
            )
        sched.replaced = sched._delete_and_wait(job.name)
    _delete(sched, name)  # the earlier job's (its garbage collection may not have come yet), or a leftover
    _create_anew(sched, runtime)


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
