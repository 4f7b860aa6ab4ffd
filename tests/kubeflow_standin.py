"""A TEST-ONLY STAND-IN for the Kubeflow training-operator v1's PyTorchJob controller, for the local cluster with a
real node (scripts/local-k8s.sh with HPCTRAIN_K8S_NODES=1: a kubelet with containerd, kube-scheduler and
kube-controller-manager beside the API server; tests/real_node.py). No Kubeflow controller can be built on the test
machines (the operator needs the Go module proxy), so this plays its part through the real API, just enough for
end-to-end tests of hpctrain's Kubernetes backend; everything else is the cluster's own: the scheduler places the
pods, the kubelet runs them (logs, exec, port-forward, volumes, /dev/shm, SIGTERM on deletion, in-place restarts),
kube-controller-manager's garbage collector deletes a job's pods and its namespace controller empties namespaces.

For each PyTorchJob in its namespace it creates the pods the job implies (`<job>-master-0`, `<job>-worker-N`, with
Kubeflow's labels and owner reference) and injects the variables Kubeflow v1 sets: PYTHONUNBUFFERED,
MASTER_ADDR/MASTER_PORT (and PET_MASTER_*), WORLD_SIZE = replicas x nprocPerNode, RANK = PET_NODE_RANK = replica
index (workers + 1), PET_NNODES, PET_NPROC_PER_NODE, with Kubeflow's own addressing: MASTER_ADDR = `<job>-master-0`
and port 23456 (`pytorchjob-port`, added to the container as the operator's defaulting does). Kubeflow resolves
that name through the master's headless Service and the cluster DNS, and holds the workers back with an init
container until it resolves; this cluster has no DNS and no kube-proxy, so the stand-in creates the workers once the
master pod has an address and gives them a hostAliases entry for the name (the master's own name is its pod
hostname, in the /etc/hosts the kubelet writes). The pod's restartPolicy is the replica's (ExitCode becomes Never),
so the real kubelet restarts OnFailure containers in place; the controller then does what training-operator v1 does
(pkg/core PastBackoffLimit, ReconcileJobs, the PyTorchJob UpdateJobStatus): the job fails once the restartCounts of
its running pods reach runPolicy.backoffLimit ("> 0" for a limit of 0), a Failed pod of an ExitCode replica with a
retryable code (>= 128) is deleted and made again (condition Restarting), and a failed job keeps its pods unless
runPolicy.cleanPodPolicy says otherwise (PyTorchJob's default: None). A pod the API server refuses (a namespace
ResourceQuota's admission) becomes a Warning event FailedCreatePod on the job, as the operator's pod control
records it. It keeps the job's conditions (Created, Running, Restarting, Succeeded, Failed) from the pods' phases.

What a real cluster refuses, it refuses: every job it sees first goes through tests/kubeflow_oracle.py (the CRD's
schema and CEL rules, the admission webhooks, core/v1's OpenAPI). A real API server would have refused the create;
here the object exists already, so the stand-in records the refusal in .errors (which fails the test) and marks the
job Failed (reason AdmissionRefused) with no pods, so a waiting CLI ends.

More of training-operator v1.9.4 it models, each from its source (github.com/kubeflow/trainer, tag v1.9.4):
* the variables go into every container of the pod (pkg/controller.v1/pytorch/envvar.go setPodEnv loops over all
  containers); the port only into the `pytorch` container (the defaulter's setDefaultPort)
* a headless Service per replica, named as its pod, selecting it by the job-name, replica-type and replica-index
  labels, with the job's port and no publishNotReadyAddresses (pkg/controller.v1/common/service.go CreateNewService)
* runPolicy.cleanPodPolicy defaults to None (pkg/apis/kubeflow.org/v1/pytorch_defaults.go); a finished job's
  pods and their Services are deleted by it, Running taking the Running and Pending ones
  (pkg/controller.v1/common/job.go DeletePodsAndServices, called whenever the job is finished)
* runPolicy.activeDeadlineSeconds counts from status.startTime, set at the first reconcile (queue time included):
  past it the job fails "because it was active longer than specified deadline" (pkg/core/job.go PastActiveDeadline)
* a Failed pod of an OnFailure or Always replica (evicted, or its node lost) is deleted and made again, the job
  Restarting (pkg/controller.v1/common/pod.go ReconcilePods), as for ExitCode with a retryable code
* a pod whose `pytorch` container it finds terminated: a Normal event ExitedWithCode, "Pod: NS.POD exited with code
  N" (the same ReconcilePods)
* an elasticPolicy (pkg/controller.v1/pytorch/elastic.go ElasticEnvVarGenerator, envvar.go setPodEnv): without a
  Master replica no MASTER_ADDR, WORLD_SIZE or RANK, only PYTHONUNBUFFERED, PET_NPROC_PER_NODE (nprocPerNode,
  defaulted to "auto" by pytorch_defaults.go) and the elastic variables: PET_RDZV_ENDPOINT `<job>-worker-0:PORT`
  (rdzvHost/rdzvPort when given, else the Worker's pytorchjob-port), PET_RDZV_BACKEND (c10d unless rdzvBackend),
  PET_NNODES `MIN:MAX` (the Worker replicas when neither is set), and PET_MAX_RESTARTS, PET_NPROC_PER_NODE (again,
  from nProcPerNode), PET_RDZV_ID, PET_RDZV_CONF (`k=v,...`), PET_STANDALONE when set. The rendezvous host's name
  resolves through its headless Service on a real cluster; here the other workers get worker-0's address as a host
  alias, as the master's. A deleted pod is made again (ReconcilePods makes every missing index), so a lost worker
  comes back and asks to join. The status of a job without a Master (pytorchjob_controller.go UpdateJobStatus):
  Succeeded once every worker has, or, under an elasticPolicy, once any one has; Running while any runs;
  Restarting when one failed and fewer run or succeeded than asked for, Failed instead under restartPolicy Never.

It polls (every POLL_S) rather than watching: simpler, and fast enough for tests. The helpers at the end make and
remove test namespaces (also on the API-server-only cluster, which has no namespace controller) and wait.
Kubeflow Trainer v2's TrainJobs have their controllers in tests/trainer_standin.py, which extends this one.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import kubeflow_oracle

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
POLL_S = 0.2
JOB_LABEL = "training.kubeflow.org/job-name"
OPERATOR_LABEL = "training.kubeflow.org/operator-name"
MASTER_PORT_NAME, MASTER_PORT = "pytorchjob-port", 23456  # Kubeflow v1's default port (controllers-only mode)
REPLICA_TYPE, REPLICA_INDEX = "training.kubeflow.org/replica-type", "training.kubeflow.org/replica-index"
ADMISSION_REFUSED = "AdmissionRefused"  # the stand-in's reason: a real cluster would have refused the create
EVENT_REPEAT_S = 5.0  # how often a repeated Warning event's count is bumped (the operator requeues with a backoff)


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class KubeflowStandIn:
    def __init__(self, api_client: Any, namespace: str) -> None:
        """The PyTorchJob controller of `namespace` (module docstring)."""
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.errors: list[str] = []
        # What the deadlines are counted against; a test moves it on rather than sleeping past a deadline.
        self.clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubeflow-standin", daemon=True)
        self._events: dict[
            tuple[str, str, str], tuple[str, float, int]
        ] = {}  # (job uid, reason, message) -> (event, when, count)
        self._admitted: dict[str, bool] = {}  # job uid -> what the oracle said

    # ---- life cycle --------------------------------------------------------------------------------------

    def start(self) -> KubeflowStandIn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self) -> KubeflowStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile()
            except Exception as err:  # a test reads .errors; the loop keeps going
                self.errors.append(f"{err!r} {getattr(err, 'body', '') or ''}".strip())
            self._stop.wait(POLL_S)

    # ---- one pass ----------------------------------------------------------------------------------------

    def reconcile(self) -> None:
        jobs = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)["items"]
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=OPERATOR_LABEL).items
        services = {
            s.metadata.name for s in self.core.list_namespaced_service(self.namespace, label_selector=JOB_LABEL).items
        }
        for job in jobs:
            # A deleted job's pods are the garbage collector's; a refused one has none.
            if not job["metadata"].get("deletionTimestamp") and self.admitted(job):
                self._control(job, [p for p in pods if _owner_uid(p) == job["metadata"]["uid"]], services)

    def admitted(self, job: dict[str, Any], runtimes: dict[str, Any] | None = None) -> bool:
        """Whether a real cluster would have created `job` (tests/kubeflow_oracle.py), decided once per job; a
        refusal goes to .errors and ends the job (module docstring)."""
        uid = job["metadata"]["uid"]
        if uid not in self._admitted:
            meta = {k: v for k, v in job["metadata"].items() if k in ("name", "namespace", "labels", "annotations")}
            submitted = {"apiVersion": job["apiVersion"], "kind": job["kind"], "metadata": meta, "spec": job["spec"]}
            problems = kubeflow_oracle.refusals(submitted, runtimes)
            self._admitted[uid] = not problems
            if problems:
                message = f"a real cluster refuses {job['kind']} {meta['name']}: " + "; ".join(problems)
                self.errors.append(message)
                self.refuse(job, message)
        return self._admitted[uid]

    def refuse(self, job: dict[str, Any], message: str) -> None:
        self._set_condition(job, "Failed", ADMISSION_REFUSED, message)

    def _delete_pod(self, name: str, grace: int | None) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=grace)
        except ApiException as err:
            if err.status != 404:
                raise

    # ---- controller --------------------------------------------------------------------------------

    JOB_KINDS: tuple[tuple[str, str, str], ...] = ((GROUP, VERSION, PLURAL),)
    """The job objects this stand-in controls (group, version, plural), shown by snapshot()."""

    def snapshot(self) -> str:
        """What a test that timed out should show: each job's conditions, each pod's phase, deletion and containers'
        states, and the namespace's last events (the cluster's side of a wait that never ended)."""
        lines = []
        try:
            jobs = [
                job
                for group, version, plural in self.JOB_KINDS
                for job in self.custom.list_namespaced_custom_object(group, version, self.namespace, plural)["items"]
            ]
            for job in jobs:
                conditions = [
                    (c["type"], c["status"], c.get("reason")) for c in (job.get("status") or {}).get("conditions") or []
                ]
                lines.append(f"{job['kind']} {job['metadata']['name']}: {conditions}")
            for pod in self.core.list_namespaced_pod(self.namespace).items:
                states = [
                    (c.name, c.state.to_dict() if c.state else None) for c in (pod.status.container_statuses or [])
                ]
                deleting = " deleting" if pod.metadata.deletion_timestamp else ""
                lines.append(f"pod {pod.metadata.name}: {pod.status.phase}{deleting} {states}")
            for event in self.core.list_namespaced_event(self.namespace).items[-15:]:
                lines.append(f"event {event.involved_object.name}: {event.reason} {event.message}")
        except Exception as err:  # a diagnosis must not hide the timeout it explains
            lines.append(f"(could not read the namespace: {err!r})")
        return "\n".join(lines)

    def _control(self, job: dict[str, Any], pods: list[Any], services: set[str]) -> None:
        name, spec = job["metadata"]["name"], job["spec"]
        run_policy = spec.get("runPolicy") or {}
        conditions = (job.get("status") or {}).get("conditions") or []
        finished = any(c["type"] in ("Succeeded", "Failed") and c["status"] == "True" for c in conditions)
        if finished:
            self._clean_pods(run_policy.get("cleanPodPolicy") or "None", pods)
            return
        replicas = spec["pytorchReplicaSpecs"]
        nproc = spec.get("nprocPerNode", "1")
        nnodes = sum(int(r.get("replicas", 1)) for r in replicas.values())
        world = nnodes * (int(nproc) if str(nproc).isdigit() else 1)
        master = f"{name}-master-0"
        address, port = master, MASTER_PORT
        existing = {p.metadata.name: p for p in pods}
        if not conditions:
            self._set_condition(job, "Created", "PyTorchJobCreated", f"PyTorchJob {name} is created.")
        started = (job.get("status") or {}).get("startTime")
        if _past_deadline(run_policy.get("activeDeadlineSeconds"), started, self.clock()):
            self._set_condition(
                job,
                "Failed",
                "PyTorchJobFailed",
                f"Job {name} has failed because it was active longer than specified deadline",
            )
            self._clean_pods(run_policy.get("cleanPodPolicy") or "None", pods)
            return
        master_ip = _pod_ip(existing.get(master))
        elastic = spec.get("elasticPolicy")
        if elastic is not None and "Master" not in replicas:
            self._control_elastic(job, elastic, existing, services)
            if not self._operator_restarts(job, pods):  # backoffLimit; a Failed pod deleted, to be made again
                self._status_without_master(job, pods)
            return
        for rtype in ("Master", "Worker"):
            if rtype not in replicas:
                continue
            for index in range(int(replicas[rtype].get("replicas", 1))):
                pod_name = f"{name}-{rtype.lower()}-{index}"
                if pod_name not in services:
                    self._create_service(job, rtype, index, pod_name)
                if pod_name in existing:
                    if (code := _exit_code(existing[pod_name], container="pytorch")) is not None:  # docstring
                        self._warn(
                            job, "ExitedWithCode", f"Pod: {self.namespace}.{pod_name} exited with code {code}", "Normal"
                        )
                    continue
                if rtype == "Worker" and "Master" in replicas and master_ip is None:
                    continue  # Kubeflow's init container holds workers until the master's name resolves
                rank = index if rtype == "Master" else index + (1 if "Master" in replicas else 0)
                self._create_pod(
                    job,
                    rtype,
                    index,
                    pod_name,
                    {
                        "PYTHONUNBUFFERED": "1",
                        "MASTER_ADDR": address,
                        "MASTER_PORT": str(port),
                        "PET_MASTER_ADDR": address,
                        "PET_MASTER_PORT": str(port),
                        "WORLD_SIZE": str(world),
                        "RANK": str(rank),
                        "PET_NODE_RANK": str(rank),
                        "PET_NNODES": str(nnodes),
                        "PET_NPROC_PER_NODE": str(nproc),
                    },
                    master_ip if rtype == "Worker" else None,
                )
        if self._operator_restarts(job, pods):
            return
        phases = {p.metadata.name: (p.status.phase if p.status else None) for p in pods}
        failed = [p for p in pods if p.status and p.status.phase == "Failed"]
        if phases.get(master) == "Succeeded":
            self._set_condition(
                job, "Succeeded", "PyTorchJobSucceeded", f"PyTorchJob {name} is successfully completed."
            )
        elif failed:
            code = _exit_code(failed[0])
            self._set_condition(
                job,
                "Failed",
                "PyTorchJobFailed",
                f"PyTorchJob {name} is failed because 1 {failed[0].metadata.name} replica(s) failed "
                f"(exit code {code}).",
            )
        elif pods and len(pods) == nnodes and all(ph == "Running" for ph in phases.values()):
            self._set_condition(job, "Running", "PyTorchJobRunning", f"PyTorchJob {name} is running.")

    def _control_elastic(
        self, job: dict[str, Any], elastic: dict[str, Any], existing: dict[str, Any], services: set[str]
    ) -> None:
        """The Worker pods of an elastic job (module docstring), each missing index made (again)."""
        name, spec = job["metadata"]["name"], job["spec"]
        worker = spec["pytorchReplicaSpecs"]["Worker"]
        count = int(worker.get("replicas", 1))
        low, high = elastic.get("minReplicas"), elastic.get("maxReplicas")
        if low is None and high is None:
            low = high = count
        low, high = (low if low is not None else high), (high if high is not None else low)  # setElasticPolicy
        host = elastic.get("rdzvHost") or f"{name}-worker-0"
        port = elastic.get("rdzvPort") or MASTER_PORT  # the Worker's pytorchjob-port, which the defaulter adds
        env = {"PYTHONUNBUFFERED": "1"}
        if elastic.get("nProcPerNode") is None:
            env["PET_NPROC_PER_NODE"] = str(spec.get("nprocPerNode", "auto"))
        env.update(
            {
                "PET_RDZV_ENDPOINT": f"{host}:{port}",
                "PET_RDZV_BACKEND": elastic.get("rdzvBackend") or "c10d",
                "PET_NNODES": f"{low}:{high}",
            }
        )
        for key, var in (("maxRestarts", "PET_MAX_RESTARTS"), ("nProcPerNode", "PET_NPROC_PER_NODE")):
            if elastic.get(key) is not None:
                env[var] = str(elastic[key])
        if elastic.get("rdzvId") is not None:
            env["PET_RDZV_ID"] = elastic["rdzvId"]
        if elastic.get("rdzvConf"):
            env["PET_RDZV_CONF"] = ",".join(f"{c['key']}={c['value']}" for c in elastic["rdzvConf"])
        if elastic.get("standalone"):
            env["PET_STANDALONE"] = ""
        first = f"{name}-worker-0"
        first_ip = _pod_ip(existing.get(first))
        for index in range(count):
            pod_name = f"{name}-worker-{index}"
            if pod_name not in services:
                self._create_service(job, "Worker", index, pod_name)
            if pod_name in existing:
                continue
            if index > 0 and host == first and first_ip is None:
                continue  # the rendezvous host's name resolves once worker-0 is Ready (its headless Service)
            self._create_pod(job, "Worker", index, pod_name, env, first_ip if index > 0 else None, alias_of=first)

    def _status_without_master(self, job: dict[str, Any], pods: list[Any]) -> None:
        """UpdateJobStatus of a job of Workers only (module docstring)."""
        name, spec = job["metadata"]["name"], job["spec"]
        worker = spec["pytorchReplicaSpecs"]["Worker"]
        live = [p for p in pods if not p.metadata.deletion_timestamp]
        phases = [p.status.phase if p.status else "Pending" for p in live]
        succeeded, running, failed = (phases.count(ph) for ph in ("Succeeded", "Running", "Failed"))
        replicas = int(worker.get("replicas", 1))
        if succeeded == replicas or (spec.get("elasticPolicy") is not None and succeeded > 0):
            message = f"PyTorchJob {self.namespace}/{name} successfully completed."
            self._set_condition(job, "Succeeded", "PyTorchJobSucceeded", message)
            self._clean_pods(spec.get("runPolicy", {}).get("cleanPodPolicy") or "None", pods)
            return
        if running > 0:
            self._set_condition(job, "Running", "PyTorchJobRunning", f"PyTorchJob {self.namespace}/{name} is running.")
        if failed > 0 and replicas > succeeded + running:
            message = f"PyTorchJob {name} is %s because {failed} Worker replica(s) failed."
            if worker.get("restartPolicy", "Never") != "Never":
                self._set_condition(job, "Restarting", "PyTorchJobRestarting", message % "restarting")
            else:
                self._set_condition(job, "Failed", "PyTorchJobFailed", message % "failed")

    def _operator_restarts(self, job: dict[str, Any], pods: list[Any]) -> bool:
        """Controllers-only mode: training-operator v1's part of restarts (module docstring); True when it ended the
        pass (the job failed, or a pod is being made again)."""
        name, spec = job["metadata"]["name"], job["spec"]
        replicas, run_policy = spec["pytorchReplicaSpecs"], spec.get("runPolicy") or {}
        if _past_backoff_limit(replicas, run_policy.get("backoffLimit"), pods):
            self._set_condition(
                job,
                "Failed",
                "PyTorchJobFailed",
                f"Job {name} has failed because it has reached the specified backoff limit",
            )
            self._clean_pods(run_policy.get("cleanPodPolicy") or "None", pods)
            return True
        for pod in pods:
            rtype = pod.metadata.labels[REPLICA_TYPE].capitalize()
            code, policy = _exit_code(pod), replicas[rtype].get("restartPolicy")
            retry = policy in ("OnFailure", "Always") or (policy == "ExitCode" and code is not None and code >= 128)
            if pod.status and pod.status.phase == "Failed" and not pod.metadata.deletion_timestamp and retry:
                self._delete_pod(pod.metadata.name, grace=None)
                self._set_condition(
                    job,
                    "Restarting",
                    "PyTorchJobRestarting",
                    f"PyTorchJob {name} is restarting because 1 {rtype} replica(s) failed.",
                )
                return True
        return False

    def _clean_pods(self, policy: str, pods: list[Any]) -> None:
        """runPolicy.cleanPodPolicy of a finished job: None keeps its pods, Running deletes the running and pending
        ones, All every one; a pod's Service goes with it."""
        for pod in pods:
            phase = pod.status.phase if pod.status else "Pending"
            if (
                policy == "All" or (policy == "Running" and phase in ("Running", "Pending"))
            ) and not pod.metadata.deletion_timestamp:
                self._delete_pod(pod.metadata.name, grace=None)
                self._delete_service(pod.metadata.name)

    def _create_service(self, job: dict[str, Any], rtype: str, index: int, name: str) -> None:
        """The replica's headless Service (module docstring), owned by the job."""
        from kubernetes.client.rest import ApiException

        selector = {JOB_LABEL: job["metadata"]["name"], REPLICA_TYPE: rtype.lower(), REPLICA_INDEX: str(index)}
        try:
            self.core.create_namespaced_service(
                self.namespace,
                {
                    "metadata": {"name": name, "labels": selector, "ownerReferences": [_owner(job)]},
                    "spec": {
                        "clusterIP": "None",
                        "selector": selector,
                        "ports": [{"name": MASTER_PORT_NAME, "port": MASTER_PORT}],
                    },
                },
            )
        except ApiException as err:
            if err.status != 409:  # an earlier job's of the same name, not yet collected: the next pass retries
                raise

    def _delete_service(self, name: str) -> None:
        from kubernetes.client.rest import ApiException

        try:
            # The 1.20 server answers a Status, which this client would read as a Service: not read.
            self.core.delete_namespaced_service(name, self.namespace, _preload_content=False)
        except ApiException as err:
            if err.status != 404:
                raise

    def _create_pod(
        self,
        job: dict[str, Any],
        rtype: str,
        index: int,
        pod_name: str,
        injected: dict[str, str],
        master_ip: str | None = None,
        alias_of: str | None = None,
    ) -> None:
        """The pod of one replica: the scheduler places it, its container gets Kubeflow's port and a worker gets the
        master's name as a host alias (`master_ip`; the cluster has no DNS)."""
        from kubernetes.client.rest import ApiException

        replica = job["spec"]["pytorchReplicaSpecs"][rtype]
        template = replica["template"]
        pod_spec = dict(template["spec"])
        containers = []
        for c in pod_spec["containers"]:
            c = dict(c)
            c["env"] = list(c.get("env", [])) + [{"name": k, "value": v} for k, v in injected.items()]
            if c["name"] == "pytorch":
                if not any(p.get("name") == MASTER_PORT_NAME for p in c.get("ports") or []):
                    c["ports"] = list(c.get("ports") or []) + [{"name": MASTER_PORT_NAME, "containerPort": MASTER_PORT}]
            containers.append(c)
        policy = replica.get("restartPolicy", "Never")
        pod_spec.update(containers=containers, restartPolicy={"ExitCode": "Never"}.get(policy, policy))
        if master_ip is not None:
            pod_spec["hostAliases"] = list(pod_spec.get("hostAliases") or []) + [
                {"ip": master_ip, "hostnames": [alias_of or f"{job['metadata']['name']}-master-0"]}
            ]
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        labels.update(
            {
                JOB_LABEL: job["metadata"]["name"],
                OPERATOR_LABEL: "pytorchjob-controller",
                REPLICA_TYPE: rtype.lower(),
                REPLICA_INDEX: str(index),
            }
        )
        if rtype == "Master":
            labels["training.kubeflow.org/job-role"] = "master"
        try:
            self.core.create_namespaced_pod(
                self.namespace,
                {"metadata": {"name": pod_name, "labels": labels, "ownerReferences": [_owner(job)]}, "spec": pod_spec},
            )
        except ApiException as err:
            if err.status not in (403, 422):  # refused by admission (a quota) or validation: the job's event, below
                raise
            self._warn(job, "FailedCreatePod", f"Error creating: {_api_message(err)}")

    def _warn(self, job: dict[str, Any], reason: str, message: str, kind: str = "Warning") -> None:
        """A Warning (or `kind`) event on the job, as training-operator v1's pod control records a refused pod create
        (pkg/controller.v1/control/pod_control.go: reason FailedCreatePod, "Error creating: <the API's error>").
        Repeats bump the event's count, as client-go's recorder does, at most every EVENT_REPEAT_S."""
        key = (job["metadata"]["uid"], reason, message)
        seen = self._events.get(key)
        if seen is not None and time.monotonic() - seen[1] < EVENT_REPEAT_S:
            return
        involved = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": job.get("kind", "PyTorchJob"),
            "name": job["metadata"]["name"],
            "namespace": self.namespace,
            "uid": job["metadata"]["uid"],
        }
        if seen is None:
            name = f"{job['metadata']['name']}.{uuid.uuid4().hex[:16]}"
            self.core.create_namespaced_event(
                self.namespace,
                {
                    "metadata": {"name": name},
                    "involvedObject": involved,
                    "type": kind,
                    "reason": reason,
                    "message": message,
                    "count": 1,
                    "firstTimestamp": now(),
                    "lastTimestamp": now(),
                    "source": {"component": f"{involved['kind'].lower()}-controller"},
                },
            )
            self._events[key] = (name, time.monotonic(), 1)
            return
        name, _, count = seen
        self.core.patch_namespaced_event(name, self.namespace, {"count": count + 1, "lastTimestamp": now()})
        self._events[key] = (name, time.monotonic(), count + 1)

    def _set_condition(self, job: dict[str, Any], ctype: str, reason: str, message: str) -> None:
        status = job.setdefault("status", {})
        conditions = status.setdefault("conditions", [])
        current = next((c for c in conditions if c["type"] == ctype), None)
        if current is not None and current["status"] == "True":
            return
        for c in conditions:
            if c["type"] in ("Running", "Restarting") and c["type"] != ctype and c["status"] == "True":
                c.update(status="False", lastTransitionTime=now())
        if current is None:
            conditions.append(
                {
                    "type": ctype,
                    "status": "True",
                    "reason": reason,
                    "message": message,
                    "lastUpdateTime": now(),
                    "lastTransitionTime": now(),
                }
            )
        else:
            conditions.remove(current)
            conditions.append(dict(current, status="True", reason=reason, message=message, lastTransitionTime=now()))
        if ctype in ("Succeeded", "Failed"):
            status["completionTime"] = now()
        status.setdefault("startTime", now())
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, self.namespace, PLURAL, job["metadata"]["name"], {"status": status}
        )


def _owner(job: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": job["apiVersion"],
        "kind": job["kind"],
        "name": job["metadata"]["name"],
        "uid": job["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _past_deadline(seconds: int | None, start: str | None, now: dt.datetime) -> bool:
    """PastActiveDeadline: activeDeadlineSeconds have passed since startTime (the first reconcile)."""
    if seconds is None or start is None:
        return False
    return (now - parse_time(start)).total_seconds() >= int(seconds)


def parse_time(timestamp: str) -> dt.datetime:
    """A Kubernetes timestamp (whole seconds, UTC)."""
    return dt.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)


def _pod_ip(pod: Any | None) -> str | None:
    """The address the master's name resolves to: its headless Service has no publishNotReadyAddresses, so only a
    Ready pod's, and never a terminating one's (a worker made again while the old master was still being deleted,
    after a preemption, would otherwise be given the old pod's address and wait on it forever)."""
    if pod is None or not pod.status or pod.metadata.deletion_timestamp:
        return None
    ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
    return pod.status.pod_ip if ready else None


def _past_backoff_limit(replicas: dict[str, Any], limit: int | None, pods: list[Any]) -> bool:
    """training-operator v1's PastBackoffLimit: the restartCounts of the running pods of replicas restarted by the
    kubelet or the operator (OnFailure, Always, ExitCode) reach the limit (exceed it, for a limit of 0)."""
    if limit is None:
        return False
    counted = {
        rtype.lower()
        for rtype, spec in replicas.items()
        if spec.get("restartPolicy", "Never") in ("OnFailure", "Always", "ExitCode")
    }
    restarts = sum(
        cs.restart_count or 0
        for pod in pods
        if pod.metadata.labels.get(REPLICA_TYPE) in counted and pod.status and pod.status.phase == "Running"
        for cs in (pod.status.container_statuses or []) + (pod.status.init_container_statuses or [])
    )
    return restarts > 0 if limit == 0 else restarts >= limit


def _api_message(err: Any) -> str:
    """The API server's own words for a refused request (the Status' message), as client-go's error prints them."""
    try:
        return json.loads(err.body)["message"]
    except (TypeError, ValueError, KeyError):
        return str(err.reason)


def _owner_uid(pod: Any) -> str | None:
    return next((o.uid for o in pod.metadata.owner_references or []), None)


def _exit_code(pod: Any, container: str | None = None) -> int | None:
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        if cs.state and cs.state.terminated and container in (None, cs.name):
            return cs.state.terminated.exit_code
    return None


# ---- test namespaces: created per test, emptied and removed afterwards (no namespace controller runs here) ----


def create_namespace(api_client: Any, prefix: str = "hpct") -> str:
    from kubernetes import client

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api_client).create_namespace({"metadata": {"name": name, "labels": {"hpctrain-test": "true"}}})
    return name


def delete_namespace(api_client: Any, name: str) -> None:
    """Remove everything a test made in `name`, then the namespace: the parts of the garbage collector and the
    namespace controller that this API server lacks (finalizers are dropped by hand)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    for group, version, plural in ((GROUP, VERSION, PLURAL), ("trainer.kubeflow.org", "v1alpha1", "trainjobs")):
        for obj in custom.list_namespaced_custom_object(group, version, name, plural)["items"]:
            obj_name = obj["metadata"]["name"]
            try:
                if obj["metadata"].get("finalizers"):
                    custom.patch_namespaced_custom_object(
                        group, version, name, plural, obj_name, {"metadata": {"finalizers": None}}
                    )
                custom.delete_namespaced_custom_object(group, version, name, plural, obj_name)
            except ApiException as err:
                if err.status != 404:
                    raise
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    for service in core.list_namespaced_service(name).items:  # no deletecollection for Services before 1.30
        try:
            core.delete_namespaced_service(service.metadata.name, name, _preload_content=False)  # a Status (1.20)
        except ApiException as err:
            if err.status != 404:
                raise
    for pvc in core.list_namespaced_persistent_volume_claim(name).items:
        if pvc.metadata.finalizers:
            core.patch_namespaced_persistent_volume_claim(pvc.metadata.name, name, {"metadata": {"finalizers": None}})
    core.delete_collection_namespaced_persistent_volume_claim(name)
    core.delete_collection_namespaced_resource_quota(name)
    core.delete_collection_namespaced_event(name)
    core.delete_namespace(name)
    core.replace_namespace_finalize(name, {"metadata": {"name": name}, "spec": {"finalizers": []}})


def wait_for(what: str, predicate, standin: KubeflowStandIn, timeout: float = 300, poll: float = 0.2):
    """Poll `predicate` until it returns something true (returned), failing the test after `timeout` seconds or as
    soon as the stand-in reports an error of its own. The timeout only bounds the wait; nothing asserts on time."""
    import pytest

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        assert not standin.errors, standin.errors
        time.sleep(poll)
    pytest.fail(f"timed out waiting for {what}; the namespace then:\n{standin.snapshot()}")
