"""A TEST-ONLY STAND-IN for the controllers of Kubeflow Trainer v2 (TrainJob, trainer.kubeflow.org/v1alpha1), JobSet
and the Job controller, on the local cluster's real node (tests/real_node.py), for tests/test_k8s_trainjob.py. Like
tests/kubeflow_standin.py (whose PyTorchJob controller it extends) it plays controllers only: the real scheduler
places the pods, the real kubelet runs them (logs, exec, SIGTERM on deletion), kube-controller-manager's garbage
collector deletes a deleted TrainJob's pods.

The real chain is TrainJob -> JobSet (same name) -> one Indexed batch/v1 Job per replicated job (`<job>-node-0`,
completions = parallelism = numNodes) -> pods. The 1.20 API server has neither the JobSet CRD nor Indexed Jobs, so the
stand-in skips the middle objects and creates the pods the Job controller would: `<job>-node-0-<index>-<suffix>`
with hostname `<job>-node-0-<index>` and subdomain `<job>`, JobSet's and the Job controller's labels and annotations
(jobset-name, replicatedjob-name=node, job-index, restart-attempt, batch.kubernetes.io/job-completion-index...),
owned directly by the TrainJob. The `node` container is the runtime's with the TrainJob's trainer (image, command,
args, env, resourcesPerNode) and the runtimePatches' pod template merged in, and the variables Trainer's torch plugin
injects: PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the completion-index annotation, as a fieldRef),
PET_MASTER_ADDR = `<job>-node-0-0.<job>` (node 0 through JobSet's headless Service), PET_MASTER_PORT = 29500, plus
the Job controller's JOB_COMPLETION_INDEX. The cluster has no DNS, so that name is a hostAliases entry: node 0's
pod IP for the other nodes (created once node 0 has one, as the PyTorchJob stand-in does for its workers) and
127.0.0.1 for node 0 itself (it cannot know its own IP before it is scheduled).

Restarts are the runtime's, as the real controllers apply them (defaults: JobSet's webhook sets restartPolicy
OnFailure, a Job's backoffLimit is 6, no failurePolicy):
* the Job controller: OnFailure pods are restarted in place by the kubelet and the Job fails once their restartCounts
  reach the backoffLimit (exceed it, for 0); a Never pod that fails counts one, and a replacement is made for its
  index while the failures stay within the backoffLimit. A failed Job's active pods are deleted.
* JobSet: a failed child Job fails the JobSet (reason FailedJobs) without a failurePolicy; with one, while
  fewer than failurePolicy.maxRestarts restarts were made it recreates the whole set (every pod deleted, then made
  again with restart-attempt + 1: JobSet deletes and recreates its child Jobs, so no kubelet back-off applies), and
  fails with reason ReachedMaxRestarts after that (kubernetes-sigs/jobset v0.12.0, pkg/controllers/failure_policy.go:
  executeFailurePolicy, no rule matching -> the default action RestartJobSet; restartJobSetActionApplier fails the
  set once `RestartsCountTowardsMax >= MaxRestarts`, else failurePolicyRecreateAll counts one more restart).
  The runtime is the TrainJob's runtimeRef: a ClusterTrainingRuntime, or a TrainingRuntime of the namespace
  (hpctrain's own for --max-restarts, schedulers/kubernetes/manifests/runtime.py).
The TrainJob's status is the JobSet's, as Trainer copies it: conditions Complete (AllJobsCompleted) or Failed, and
jobsStatus counted in Jobs; a TrainJob has no Running condition. It polls like the PyTorchJob stand-in.

As there, every TrainJob first goes through tests/kubeflow_oracle.py, with the cluster's own ClusterTrainingRuntimes:
Trainer's and JobSet's webhooks refuse what the stand-in refuses (Failed, reason AdmissionRefused, in .errors).
What else it models, from the sources (Trainer v2.3.0, JobSet v0.12.0, Kubernetes' Job controller):
* the pod template is the oracle's trainer_pod_template: the runtime's, the patches merged in, trainer env
  upserted by name and resourcesPerNode merged into the runtime's resources (not replacing them)
* JobSet's headless Service `<job>` for the pods' subdomain, publishNotReadyAddresses true (JobSet's webhook
  default, pkg/webhooks/jobset_webhook.go Default)
* spec.activeDeadlineSeconds counts from the TrainJob's creationTimestamp (queue time included): past it the job is
  Failed, reason DeadlineExceeded, "TrainJob exceeded its active deadline", and its JobSet (so every pod) deleted
  (Trainer pkg/controller/trainjob_controller.go reconcileDeadline)
* the Job's backoff counts the restarts of its Running and Pending pods' containers and init containers only (a
  Succeeded pod's earlier restarts no longer count), `>= backoffLimit` (`> 0` for 0), plus its Failed pods
  against `> backoffLimit` (Kubernetes pkg/controller/job/job_controller.go pastBackoffLimitOnFailure)
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import kubeflow_oracle
from kubeflow_standin import ADMISSION_REFUSED, KubeflowStandIn, now, parse_time

TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
# Pod labels and annotations JobSet and the Job controller set (jobset api/jobset/v1alpha2; k8s batch/v1).
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
REPLICATED_JOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
GLOBAL_REPLICAS = "jobset.sigs.k8s.io/global-replicas"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
JOB_KEY = "jobset.sigs.k8s.io/job-key"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
# The trainer's torch plugin: the replicated job and container of the trainer nodes, and torchrun's port.
NODE = "node"
TRAINER_PORT = 29500
JOB_BACKOFF_LIMIT = 6  # a batch/v1 Job's default
ACTIVE = ("Pending", "Running")


class TrainerStandIn(KubeflowStandIn):
    """The PyTorchJob controller of tests/kubeflow_standin.py, plus Trainer v2, JobSet and the Job controller for the
    namespace's TrainJobs (module docstring)."""

    JOB_KINDS = (*KubeflowStandIn.JOB_KINDS, (TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS))

    def __init__(self, api_client: Any, namespace: str) -> None:
        super().__init__(api_client, namespace)
        self._attempts: dict[str, int] = {}  # TrainJob uid -> the JobSet's restarts so far
        self._services: set[str] = set()  # the uids of the TrainJobs whose JobSet Service is made

    def reconcile(self) -> None:
        super().reconcile()
        jobs = self.custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, self.namespace, TRAINJOBS)[
            "items"
        ]
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=JOBSET_NAME).items
        runtimes = None
        if any(job["metadata"]["uid"] not in self._admitted for job in jobs):  # the cluster's and the namespace's
            listed = self.custom.list_cluster_custom_object(TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes")
            mine = self.custom.list_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, self.namespace, "trainingruntimes"
            )
            runtimes = {r["metadata"]["name"]: r for r in listed["items"] + mine["items"]}
        for job in jobs:
            if job["spec"].get("suspend"):
                # Trainer makes a suspended JobSet (no pods); `submit --max-restarts` owns its runtime meanwhile
                # (schedulers/kubernetes/manifests/runtime.py) and resumes it, when the webhook's update check sees it.
                continue
            # A deleted job's pods are the garbage collector's; a refused one has none.
            if not job["metadata"].get("deletionTimestamp") and self.admitted(job, runtimes):
                mine = [
                    p
                    for p in pods
                    if p.metadata.labels[JOBSET_NAME] == job["metadata"]["name"]
                    and p.metadata.labels.get(JOBSET_UID) == job["metadata"]["uid"]
                ]
                self._control_trainjob(job, mine)

    def refuse(self, job: dict[str, Any], message: str) -> None:
        if job["kind"] != "TrainJob":
            return super().refuse(job, message)
        self._set_trainjob_status(job, {"conditions": [_condition("Failed", ADMISSION_REFUSED, message)]})

    def _set_trainjob_status(self, job: dict[str, Any], status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            TRAINER_GROUP, TRAINER_VERSION, self.namespace, TRAINJOBS, job["metadata"]["name"], {"status": status}
        )

    # ---- JobSet and Trainer: the set's status, its restarts ----------------------------------------------

    def _control_trainjob(self, job: dict[str, Any], pods: list[Any]) -> None:
        conditions = (job.get("status") or {}).get("conditions") or []
        if any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions):
            self._delete_active(pods)  # the Job controller removes the active pods of a failed Job
            return
        deadline = job["spec"].get("activeDeadlineSeconds")
        age = self.clock() - parse_time(job["metadata"]["creationTimestamp"])
        if deadline and age.total_seconds() > int(deadline):
            self._set_trainjob_status(
                job,
                {
                    "conditions": conditions
                    + [_condition("Failed", "DeadlineExceeded", "TrainJob exceeded its active deadline")]
                },
            )
            self._delete_all(pods)  # Trainer deletes the JobSet: its Jobs and their pods go
            return
        runtime, spec = self._runtime_spec(job)
        self._jobset_service(job)
        attempt = self._attempts.get(job["metadata"]["uid"], 0)
        current = [p for p in pods if int(p.metadata.labels.get(RESTART_ATTEMPT, "0")) == attempt]
        if len(current) < len(pods):  # a restart: the new attempt's pods wait until the earlier ones are gone
            self._delete_all([p for p in pods if p not in current])
            return
        nnodes = int((job["spec"].get("trainer") or {}).get("numNodes", 1))
        outcome = self._job_outcome(job, runtime, spec, current, nnodes, attempt)
        counts = {
            "active": int(outcome is None and any(_phase(p) in ACTIVE for p in current)),
            "ready": int(outcome is None and sum(_phase(p) in ("Running", "Succeeded") for p in current) >= nnodes),
            "succeeded": int(outcome == "Complete"),
            "failed": int(outcome == "Failed"),
            "suspended": 0,
        }
        status: dict[str, Any] = {"jobsStatus": [{"name": NODE, **counts}]}
        if outcome == "Failed":
            policy = spec["template"]["spec"].get("failurePolicy")
            if policy is not None and attempt < int(policy.get("maxRestarts", 0)):
                self._attempts[job["metadata"]["uid"]] = attempt + 1  # the JobSet's status.restarts
                self._delete_all(
                    current
                )  # JobSet deletes its child Jobs (their pods go with them) and makes them again
                return
            reason = (
                ("FailedJobs", "jobset failed due to one or more job failures")
                if policy is None
                else ("ReachedMaxRestarts", "jobset failed due to reaching max number of restarts")
            )
            status["conditions"] = conditions + [_condition("Failed", *reason)]
            self._delete_active(current)
        elif outcome == "Complete":
            status["conditions"] = conditions + [
                _condition("Complete", "AllJobsCompleted", "jobset completed successfully")
            ]
        if status != {k: (job.get("status") or {}).get(k) for k in status}:
            self._set_trainjob_status(job, status)

    def _jobset_service(self, job: dict[str, Any]) -> None:
        """JobSet's headless Service for the pods' subdomain (module docstring), made once."""
        from kubernetes.client.rest import ApiException

        name = job["metadata"]["name"]
        if job["metadata"]["uid"] in self._services:
            return
        owner = {
            "apiVersion": job["apiVersion"],
            "kind": job["kind"],
            "name": name,
            "uid": job["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        try:
            self.core.create_namespaced_service(
                self.namespace,
                {
                    "metadata": {"name": name, "labels": {JOBSET_NAME: name}, "ownerReferences": [owner]},
                    "spec": {"clusterIP": "None", "selector": {JOBSET_NAME: name}, "publishNotReadyAddresses": True},
                },
            )
        except ApiException as err:
            if err.status != 409:  # an earlier job's of the same name, not yet collected: the next pass retries
                raise
            return
        self._services.add(job["metadata"]["uid"])

    def _runtime_spec(self, job: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The runtime, and its spec with the TrainJob's runtimePatches merged in."""
        ref = job["spec"]["runtimeRef"]
        if ref.get("kind", "ClusterTrainingRuntime") == "ClusterTrainingRuntime":
            runtime = self.custom.get_cluster_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", ref["name"]
            )
        else:
            runtime = self.custom.get_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, self.namespace, "trainingruntimes", ref["name"]
            )
        spec = runtime["spec"]
        for patch in job["spec"].get("runtimePatches") or []:
            spec = kubeflow_oracle.merge(spec, patch.get("trainingRuntimeSpec") or {})
        return runtime, spec

    # ---- the Job controller of `<job>-node-0` ------------------------------------------------------------

    def _job_outcome(
        self,
        job: dict[str, Any],
        runtime: dict[str, Any],
        spec: dict[str, Any],
        pods: list[Any],
        nnodes: int,
        attempt: int,
    ) -> str | None:
        """Make the pods the Job lacks; "Complete" or "Failed" once the Job is (backoffLimit), else None."""
        job_spec = _node_job(spec)["template"]["spec"]
        limit = int(job_spec.get("backoffLimit", JOB_BACKOFF_LIMIT))
        restarts = sum(_restarts(p) for p in pods if _phase(p) in ACTIVE)
        failed = sum(_phase(p) == "Failed" for p in pods)
        on_failure = _restart_policy(job_spec) == "OnFailure" and (restarts > 0 if limit == 0 else restarts >= limit)
        if failed > limit or on_failure:
            return "Failed"
        by_index: dict[int, list[Any]] = {}
        for pod in pods:
            by_index.setdefault(int(pod.metadata.annotations[COMPLETION_INDEX]), []).append(pod)
        if all(any(_phase(p) == "Succeeded" for p in by_index.get(i, [])) for i in range(nnodes)):
            return "Complete"
        node0 = [  # not a terminating pod's address: a pod made after it must reach the new node 0
            p
            for p in by_index.get(0, [])
            if _phase(p) in ACTIVE and p.status and p.status.pod_ip and not p.metadata.deletion_timestamp
        ]
        for index in range(nnodes):
            if not any(_phase(p) in ACTIVE or _phase(p) == "Succeeded" for p in by_index.get(index, [])):
                if index == 0 or node0:  # the other nodes reach node 0 by a host alias to its pod IP
                    master_ip = node0[0].status.pod_ip if index and node0 else None
                    self._create_trainjob_pod(job, runtime, spec, index, nnodes, attempt, master_ip)
        return None

    def _delete_all(self, pods: list[Any]) -> None:
        for pod in pods:
            if not pod.metadata.deletion_timestamp:
                self._delete_pod(pod.metadata.name, grace=None)

    def _delete_active(self, pods: list[Any]) -> None:
        for pod in pods:
            if _phase(pod) in ACTIVE and not pod.metadata.deletion_timestamp:
                self._delete_pod(pod.metadata.name, grace=None)

    def _create_trainjob_pod(
        self,
        job: dict[str, Any],
        runtime: dict[str, Any],
        spec: dict[str, Any],
        index: int,
        nnodes: int,
        attempt: int,
        master_ip: str | None,
    ) -> None:
        name, uid = job["metadata"]["name"], job["metadata"]["uid"]
        trainer = job["spec"].get("trainer") or {}
        template = kubeflow_oracle.trainer_pod_template(job, runtime)
        job_name = f"{name}-{NODE}-0"
        master = f"{job_name}-0.{name}"
        index_ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
        pod_spec = dict(template.get("spec") or {})
        containers = []
        for c in pod_spec.get("containers") or []:
            c = dict(c)
            if c["name"] == NODE:
                c["env"] = list(c.get("env") or []) + [
                    {"name": "PET_NNODES", "value": str(nnodes)},
                    {"name": "PET_NPROC_PER_NODE", "value": str(trainer.get("numProcPerNode", "auto"))},
                    {"name": "PET_NODE_RANK", "valueFrom": index_ref},
                    {"name": "PET_MASTER_ADDR", "value": master},
                    {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)},
                    {"name": "JOB_COMPLETION_INDEX", "valueFrom": index_ref},
                ]
                c["ports"] = [{"containerPort": TRAINER_PORT}]
            containers.append(c)
        aliases = list(pod_spec.get("hostAliases") or []) + [{"ip": master_ip or "127.0.0.1", "hostnames": [master]}]
        pod_spec.update(
            containers=containers,
            hostname=f"{job_name}-{index}",
            subdomain=name,
            hostAliases=aliases,
            restartPolicy=_restart_policy(_node_job(spec)["template"]["spec"]),
        )
        jobset = {
            JOBSET_NAME: name,
            JOBSET_UID: uid,
            REPLICATED_JOB: NODE,
            REPLICATED_JOB_REPLICAS: "1",
            GLOBAL_REPLICAS: "1",
            JOB_INDEX: "0",
            JOB_GLOBAL_INDEX: "0",
            RESTART_ATTEMPT: str(attempt),
            JOB_KEY: hashlib.sha1(f"{self.namespace}/{job_name}".encode()).hexdigest(),
        }
        batch = {"batch.kubernetes.io/job-name": job_name, "job-name": job_name, COMPLETION_INDEX: str(index)}
        labels = {**((template.get("metadata") or {}).get("labels") or {}), **jobset, **batch}
        owner = {
            "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
            "kind": "TrainJob",
            "name": name,
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        self.core.create_namespaced_pod(
            self.namespace,
            {
                "metadata": {
                    "name": f"{job_name}-{index}-{uuid.uuid4().hex[:5]}",
                    "labels": labels,
                    "annotations": {**jobset, COMPLETION_INDEX: str(index)},
                    "ownerReferences": [owner],
                },
                "spec": pod_spec,
            },
        )


def _node_job(spec: dict[str, Any]) -> dict[str, Any]:
    """The runtime's `node` replicated job."""
    return next(r for r in spec["template"]["spec"]["replicatedJobs"] if r["name"] == NODE)


def _restart_policy(job_spec: dict[str, Any]) -> str:
    """The pods' restartPolicy: the template's, else OnFailure (JobSet's webhook default)."""
    return ((job_spec.get("template") or {}).get("spec") or {}).get("restartPolicy") or "OnFailure"


def _phase(pod: Any) -> str:
    return (pod.status.phase if pod.status else None) or "Pending"


def _restarts(pod: Any) -> int:
    """Restarts of the pod's containers and init containers."""
    statuses = (pod.status.container_statuses or []) + (pod.status.init_container_statuses or []) if pod.status else []
    return sum(cs.restart_count or 0 for cs in statuses)


def _condition(ctype: str, reason: str, message: str) -> dict[str, str]:
    return {"type": ctype, "status": "True", "reason": reason, "message": message, "lastTransitionTime": now()}
