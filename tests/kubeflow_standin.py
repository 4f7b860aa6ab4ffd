"""A TEST-ONLY FAKE of the Kubeflow training-operator, the kubelet and kube-controller-manager's collectors.

None of those can run on the test machine (no kubelet, no container runtime, and the controllers need the Go
module proxy to build), while the API server they talk to is real (scripts/local-k8s.sh). This stand-in plays
their parts through that real API, just enough for end-to-end tests of hpctrain's Kubernetes backend:

* controller (Kubeflow v1): for each PyTorchJob in its namespace it creates the pods the job implies
  (`<job>-master-0`, `<job>-worker-N`, with Kubeflow's labels and owner reference) and injects the variables
  Kubeflow v1 sets: PYTHONUNBUFFERED, MASTER_ADDR/MASTER_PORT (and PET_MASTER_*), WORLD_SIZE = replicas x
  nprocPerNode, RANK = PET_NODE_RANK = replica index (workers + 1), PET_NNODES, PET_NPROC_PER_NODE. MASTER_ADDR
  is 127.0.0.1 and the port a free one, since the "pods" are local processes (Kubeflow uses the master's
  service name and port 23456). It keeps the job's conditions (Created, Running, Restarting, Succeeded, Failed)
  and honours restartPolicy OnFailure/Never/ExitCode with runPolicy.backoffLimit.
* kubelet: pods bound to its Node run their container's command as a local process (in the environment of the
  test, plus the container's env), their phase, restart count and exit code are patched into the pod's status;
  a pod being deleted gets SIGTERM, SIGKILL after its terminationGracePeriodSeconds, and is then removed. Its
  Node object points the API server at a small HTTPS server here, so `kubectl logs` / read_namespaced_pod_log
  and the Python client's exec (connect_get_namespaced_pod_exec, what `hpctrain top` uses) really go through the
  API server (which proxies to "the kubelet", as it does in a cluster). exec runs the command as one more local
  process with the container's environment and answers over WebSocket with the `v4.channel.k8s.io` subprotocol;
  no SPDY, stdin or tty, so kubectl 1.32's `exec` (which ends up on SPDY against this 1.20 server) is refused.
* garbage collector: a job being deleted in the foreground loses its pods first, then its finalizer; pods
  whose job is gone are deleted. `delete_namespace` plays the namespace controller for test cleanup.

It polls (every POLL_S) rather than watching: simpler, and fast enough for tests.

Controllers only (`kubelet=False`), for a cluster with a real node (scripts/local-k8s.sh with HPCTRAIN_K8S_NODES=1:
a kubelet, kube-scheduler, kube-controller-manager): the stand-in is then just the PyTorchJob controller. It
creates the same pods with the same names, labels and owner reference, but without nodeName (the real scheduler
places them) and with Kubeflow's own addressing: MASTER_ADDR = PET_MASTER_ADDR = `<job>-master-0` and port 23456
(`pytorchjob-port`, added to the container as the operator's defaulting does). Kubeflow resolves that name
through the master's headless Service and the cluster DNS, and holds the workers back with an init container
until it resolves; this cluster has no DNS and no kube-proxy, so the stand-in creates the workers once the master
pod has an address and gives them a hostAliases entry for the name (the master's own name is its pod hostname,
in the /etc/hosts the kubelet writes). The pod's restartPolicy is the replica's (ExitCode becomes Never), so the
real kubelet restarts OnFailure containers in place; the controller then does what training-operator v1 does
(pkg/core PastBackoffLimit, ReconcileJobs, the PyTorchJob UpdateJobStatus): the job fails once the restartCounts
of its running pods reach runPolicy.backoffLimit ("> 0" for a limit of 0), a Failed pod of an ExitCode replica
with a retryable code (>= 128) is deleted and made again (condition Restarting), and a failed job keeps its pods
unless runPolicy.cleanPodPolicy says otherwise (PyTorchJob's default: None). Logs, exec, port-forward, volumes,
/dev/shm and SIGTERM on deletion are the real kubelet's; the garbage collector and the namespace controller are
kube-controller-manager's. Conditions are set from the real pods' phases as above.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import http.server
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"
POLL_S = 0.2
JOB_LABEL = "training.kubeflow.org/job-name"
OPERATOR_LABEL = "training.kubeflow.org/operator-name"
MASTER_PORT_NAME, MASTER_PORT = "pytorchjob-port", 23456  # Kubeflow v1's default port (controllers-only mode)
EVENT_REPEAT_S = 5.0  # how often a repeated Warning event's count is bumped (the operator requeues with a backoff)


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class _Process:
    """One pod's container, run locally."""

    popen: subprocess.Popen
    log: Path
    termination_log: Path  # the container's /dev/termination-log (the kubelet mounts a fresh one per container)
    restarts: int = 0
    started: str = field(default_factory=now)
    term_sent: float | None = None
    done: bool = False


class KubeflowStandIn:
    def __init__(self, api_client: Any, namespace: str, workdir: Path, node_labels: dict[str, str] | None = None,
                 allocatable: dict[str, str] | None = None, kubelet: bool = True) -> None:
        """`kubelet=False`: the controllers only, for a cluster whose real kubelet runs the pods (module docstring);
        there is then no stand-in node (`node` is None) and `workdir` stays unused."""
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.namespace = namespace
        self.workdir = workdir
        self.kubelet = kubelet
        self.node: str | None = f"standin-{uuid.uuid4().hex[:8]}" if kubelet else None
        self.node_labels = node_labels or {}
        self.allocatable = allocatable or {"cpu": "16", "memory": "64Gi", "pods": "110"}
        self.procs: dict[str, _Process] = {}  # pod uid -> process
        self.ports: dict[str, int] = {}  # job uid -> MASTER_PORT
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubeflow-standin", daemon=True)
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._events: dict[tuple[str, str, str], tuple[str, float, int]] = {}  # (job uid, reason, message) -> (event, when, count)

    # ---- life cycle --------------------------------------------------------------------------------------

    def start(self) -> KubeflowStandIn:
        if self.kubelet:
            self._start_node()
        self._thread.start()
        return self

    def _start_node(self) -> None:
        """The fake kubelet's Node, pointing the API server at this stand-in's log and exec server."""
        (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
        port = self._start_log_server()
        self.core.create_node({"metadata": {"name": self.node, "labels": self.node_labels}})
        self.core.patch_node_status(self.node, {"status": {
            "capacity": self.allocatable, "allocatable": self.allocatable,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "stand-in",
                            "lastHeartbeatTime": now(), "lastTransitionTime": now()}],
        }})
        # TaintNodesByCondition tainted the new node not-ready; lift it, as the node lifecycle controller would.
        self.core.patch_node(self.node, {"spec": {"taints": None}})

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for proc in self.procs.values():
            if proc.popen.poll() is None:
                os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self.node is None:
            return
        try:
            self.core.delete_node(self.node)
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass

    def __enter__(self) -> KubeflowStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile()
            except Exception as err:  # noqa: BLE001 - a test reads .errors; the loop keeps going
                self.errors.append(f"{err!r} {getattr(err, 'body', '') or ''}".strip())
            self._stop.wait(POLL_S)

    # ---- one pass ----------------------------------------------------------------------------------------

    def reconcile(self) -> None:
        self._reconcile_jobs((GROUP, VERSION, PLURAL), OPERATOR_LABEL, _owner_uid, lambda job: job["metadata"]["uid"],
                             self._control)

    def _reconcile_jobs(self, resource: tuple[str, str, str], pod_selector: str, pod_key: Callable[[Any], Any],
                        job_key: Callable[[dict[str, Any]], Any], control: Callable[[dict[str, Any], list[Any]], None],
                        ) -> None:
        """One pass for the jobs of one custom resource (group, version, plural): their controller (`control`), the
        garbage collector for deleted jobs and orphaned pods, and the kubelet for their pods (the last two only
        with the fake kubelet: else kube-controller-manager and the real kubelet do them). `pod_key` and `job_key`
        say which job a pod belongs to."""
        from kubernetes.client.rest import ApiException

        jobs = self.custom.list_namespaced_custom_object(*resource[:2], self.namespace, resource[2])["items"]
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=pod_selector).items
        by_job: dict[Any, list[Any]] = {}
        for pod in pods:
            by_job.setdefault(pod_key(pod), []).append(pod)
        live = {job_key(j) for j in jobs}
        for job in jobs:
            mine = by_job.get(job_key(job), [])
            if not job["metadata"].get("deletionTimestamp"):
                control(job, mine)
            elif self.kubelet:
                self._collect(resource, job, mine)
        if not self.kubelet:
            return
        for key, orphans in by_job.items():
            if key not in live:
                for pod in orphans:
                    if not pod.metadata.deletion_timestamp:
                        self._delete_pod(pod.metadata.name, grace=None)
        for pod in pods:
            try:
                self._kubelet(pod)
            except ApiException as err:
                if err.status not in (404, 409):
                    raise

    # ---- garbage collector ---------------------------------------------------------------------------

    def _collect(self, resource: tuple[str, str, str], job: dict[str, Any], pods: list[Any]) -> None:
        for pod in pods:
            if not pod.metadata.deletion_timestamp:
                self._delete_pod(pod.metadata.name, grace=None)
        if not pods and job["metadata"].get("finalizers"):
            group, version, plural = resource
            self.custom.patch_namespaced_custom_object(group, version, self.namespace, plural, job["metadata"]["name"],
                                                       {"metadata": {"finalizers": None}})

    def _delete_pod(self, name: str, grace: int | None) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=grace)
        except ApiException as err:
            if err.status != 404:
                raise

    # ---- controller --------------------------------------------------------------------------------

    def _control(self, job: dict[str, Any], pods: list[Any]) -> None:
        name, uid = job["metadata"]["name"], job["metadata"]["uid"]
        spec = job["spec"]
        conditions = (job.get("status") or {}).get("conditions") or []
        finished = any(c["type"] in ("Succeeded", "Failed") and c["status"] == "True" for c in conditions)
        if finished:
            return
        replicas = spec["pytorchReplicaSpecs"]
        nproc = spec.get("nprocPerNode", "1")
        nnodes = sum(int(r.get("replicas", 1)) for r in replicas.values())
        world = nnodes * (int(nproc) if str(nproc).isdigit() else 1)
        master = f"{name}-master-0"
        if self.kubelet:  # the "pods" are local processes: the master listens on this host, on a free port
            address, port = "127.0.0.1", self.ports.setdefault(uid, free_port())
        else:
            address, port = master, MASTER_PORT
        existing = {p.metadata.name: p for p in pods}
        if not conditions:
            self._set_condition(job, "Created", "PyTorchJobCreated", f"PyTorchJob {name} is created.")
        master_ip = _pod_ip(existing.get(master))
        for rtype in ("Master", "Worker"):
            if rtype not in replicas:
                continue
            for index in range(int(replicas[rtype].get("replicas", 1))):
                pod_name = f"{name}-{rtype.lower()}-{index}"
                if pod_name in existing:
                    continue
                if not self.kubelet and rtype == "Worker" and "Master" in replicas and master_ip is None:
                    continue  # Kubeflow's init container holds workers until the master's name resolves
                rank = index if rtype == "Master" else index + (1 if "Master" in replicas else 0)
                self._create_pod(job, rtype, index, pod_name, {
                    "PYTHONUNBUFFERED": "1", "MASTER_ADDR": address, "MASTER_PORT": str(port),
                    "PET_MASTER_ADDR": address, "PET_MASTER_PORT": str(port), "WORLD_SIZE": str(world),
                    "RANK": str(rank), "PET_NODE_RANK": str(rank), "PET_NNODES": str(nnodes), "PET_NPROC_PER_NODE": str(nproc),
                }, master_ip if rtype == "Worker" else None)
        if not self.kubelet and self._operator_restarts(job, pods):
            return
        phases = {p.metadata.name: (p.status.phase if p.status else None) for p in pods}
        failed = [p for p in pods if p.status and p.status.phase == "Failed"]
        if phases.get(master) == "Succeeded":
            self._set_condition(job, "Succeeded", "PyTorchJobSucceeded", f"PyTorchJob {name} is successfully completed.")
        elif failed:
            code = _exit_code(failed[0])
            self._set_condition(job, "Failed", "PyTorchJobFailed",
                                f"PyTorchJob {name} is failed because 1 {failed[0].metadata.name} replica(s) failed (exit code {code}).")
        elif pods and len(pods) == nnodes and all(ph == "Running" for ph in phases.values()):
            self._set_condition(job, "Running", "PyTorchJobRunning", f"PyTorchJob {name} is running.")

    def _operator_restarts(self, job: dict[str, Any], pods: list[Any]) -> bool:
        """Controllers-only mode: training-operator v1's part of restarts (module docstring); True when it ended the
        pass (the job failed, or a pod is being made again)."""
        name, spec = job["metadata"]["name"], job["spec"]
        replicas, run_policy = spec["pytorchReplicaSpecs"], spec.get("runPolicy") or {}
        if _past_backoff_limit(replicas, run_policy.get("backoffLimit"), pods):
            self._set_condition(job, "Failed", "PyTorchJobFailed",
                                f"Job {name} has failed because it has reached the specified backoff limit")
            self._clean_pods(run_policy.get("cleanPodPolicy") or "None", pods)
            return True
        for pod in pods:
            rtype = pod.metadata.labels["training.kubeflow.org/replica-type"].capitalize()
            code = _exit_code(pod)
            if (pod.status and pod.status.phase == "Failed" and not pod.metadata.deletion_timestamp
                    and replicas[rtype].get("restartPolicy") == "ExitCode" and code is not None and code >= 128):
                self._delete_pod(pod.metadata.name, grace=None)
                self._set_condition(job, "Restarting", "PyTorchJobRestarting",
                                    f"PyTorchJob {name} is restarting because 1 {rtype} replica(s) failed.")
                return True
        return False

    def _clean_pods(self, policy: str, pods: list[Any]) -> None:
        """runPolicy.cleanPodPolicy of a finished job: None keeps its pods, Running deletes the running and pending
        ones, All every one."""
        for pod in pods:
            phase = pod.status.phase if pod.status else "Pending"
            if policy == "All" or (policy == "Running" and phase in ("Running", "Pending")):
                self._delete_pod(pod.metadata.name, grace=None)

    def _create_pod(self, job: dict[str, Any], rtype: str, index: int, pod_name: str, injected: dict[str, str],
                    master_ip: str | None = None) -> None:
        """The pod of one replica. With the fake kubelet it is bound to the stand-in's node; else the scheduler
        places it, its container gets Kubeflow's port and a worker gets the master's name as a host alias
        (`master_ip`; the cluster has no DNS)."""
        from kubernetes.client.rest import ApiException

        replica = job["spec"]["pytorchReplicaSpecs"][rtype]
        template = replica["template"]
        pod_spec = dict(template["spec"])
        containers = []
        for c in pod_spec["containers"]:
            c = dict(c)
            if c["name"] == "pytorch":
                c["env"] = list(c.get("env", [])) + [{"name": k, "value": v} for k, v in injected.items()]
                if not self.kubelet and not any(p.get("name") == MASTER_PORT_NAME for p in c.get("ports") or []):
                    c["ports"] = list(c.get("ports") or []) + [{"name": MASTER_PORT_NAME, "containerPort": MASTER_PORT}]
            containers.append(c)
        policy = replica.get("restartPolicy", "Never")
        pod_spec.update(containers=containers, restartPolicy={"ExitCode": "Never"}.get(policy, policy))
        if self.kubelet:
            pod_spec["nodeName"] = self.node
        elif master_ip is not None:
            pod_spec["hostAliases"] = list(pod_spec.get("hostAliases") or []) + [
                {"ip": master_ip, "hostnames": [f"{job['metadata']['name']}-master-0"]}]
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        labels.update({JOB_LABEL: job["metadata"]["name"], OPERATOR_LABEL: "pytorchjob-controller",
                       "training.kubeflow.org/replica-type": rtype.lower(),
                       "training.kubeflow.org/replica-index": str(index)})
        if rtype == "Master":
            labels["training.kubeflow.org/job-role"] = "master"
        owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "PyTorchJob", "name": job["metadata"]["name"],
                 "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
        try:
            self.core.create_namespaced_pod(self.namespace, {
                "metadata": {"name": pod_name, "labels": labels, "ownerReferences": [owner]}, "spec": pod_spec})
        except ApiException as err:
            if err.status not in (403, 422):  # refused by admission (a quota) or validation: the job's event, below
                raise
            self._warn(job, "FailedCreatePod", f"Error creating: {_api_message(err)}")

    def _warn(self, job: dict[str, Any], reason: str, message: str) -> None:
        """A Warning event on the job, as training-operator v1's pod control records a refused pod create
        (pkg/controller.v1/control/pod_control.go: reason FailedCreatePod, "Error creating: <the API's error>").
        Repeats bump the event's count, as client-go's recorder does, at most every EVENT_REPEAT_S."""
        key = (job["metadata"]["uid"], reason, message)
        seen = self._events.get(key)
        if seen is not None and time.monotonic() - seen[1] < EVENT_REPEAT_S:
            return
        involved = {"apiVersion": f"{GROUP}/{VERSION}", "kind": job.get("kind", "PyTorchJob"),
                    "name": job["metadata"]["name"], "namespace": self.namespace, "uid": job["metadata"]["uid"]}
        if seen is None:
            name = f"{job['metadata']['name']}.{uuid.uuid4().hex[:16]}"
            self.core.create_namespaced_event(self.namespace, {
                "metadata": {"name": name}, "involvedObject": involved, "type": "Warning", "reason": reason,
                "message": message, "count": 1, "firstTimestamp": now(), "lastTimestamp": now(),
                "source": {"component": f"{involved['kind'].lower()}-controller"}})
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
            conditions.append({"type": ctype, "status": "True", "reason": reason, "message": message,
                               "lastUpdateTime": now(), "lastTransitionTime": now()})
        else:
            conditions.remove(current)
            conditions.append(dict(current, status="True", reason=reason, message=message, lastTransitionTime=now()))
        if ctype in ("Succeeded", "Failed"):
            status["completionTime"] = now()
        status.setdefault("startTime", now())
        self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, self.namespace, PLURAL, job["metadata"]["name"],
                                                          {"status": status})

    # ---- kubelet -----------------------------------------------------------------------------------

    def _tracked(self, pod: Any) -> tuple[str, _Process | None] | None:
        """The pod's uid and process (None: not started yet), for a pod of this node that needs the kubelet; None
        for another node's pod, one being deleted (its process is stopped here) or one that ended before."""
        if pod.spec.node_name != self.node:
            return None
        uid = pod.metadata.uid
        proc = self.procs.get(uid)
        if pod.metadata.deletion_timestamp:
            self._terminate(pod, proc)
            return None
        if proc is None and pod.status and pod.status.phase in ("Succeeded", "Failed"):
            return None
        return uid, proc

    def _kubelet(self, pod: Any) -> None:
        tracked = self._tracked(pod)
        if tracked is None:
            return
        uid, proc = tracked
        if proc is None:
            with self._lock:
                self.procs[uid] = self._run(pod, restarts=0)
            self._report_running(pod, self.procs[uid])
            return
        if proc.done or proc.popen.poll() is None:
            return
        code = proc.popen.returncode
        code = 128 - code if code < 0 else code  # killed by a signal: the shell's convention
        if code != 0 and self._may_restart(pod, code):
            self._mark_restarting(pod)
            with self._lock:
                self.procs[uid] = self._run(pod, restarts=proc.restarts + 1)
            self._report_running(pod, self.procs[uid], last=(code, proc.started, _said(proc)))
            return
        proc.done = True
        self._report_terminated(pod, proc, code)

    def _may_restart(self, pod: Any, code: int) -> bool:
        job = self._job_of(pod)
        if job is None:
            return False
        rtype = pod.metadata.labels["training.kubeflow.org/replica-type"].capitalize()
        policy = job["spec"]["pytorchReplicaSpecs"][rtype].get("restartPolicy", "Never")
        retryable = policy in ("OnFailure", "Always") or (policy == "ExitCode" and code >= 128)
        limit = (job["spec"].get("runPolicy") or {}).get("backoffLimit")
        used = sum(self.procs[u].restarts for u in self._job_pod_uids(pod))
        # As training-operator v1 counts: the job fails once its pods' restarts reach the limit, so a restart that
        # would reach it is the last thing that happens (none at all for a limit of 0).
        return retryable and (limit is None or used + 1 < limit)

    def _job_pod_uids(self, pod: Any) -> list[str]:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"{JOB_LABEL}={pod.metadata.labels[JOB_LABEL]}").items
        return [p.metadata.uid for p in pods if p.metadata.uid in self.procs]

    def _job_of(self, pod: Any) -> dict[str, Any] | None:
        from kubernetes.client.rest import ApiException

        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, pod.metadata.labels[JOB_LABEL])
        except ApiException:
            return None

    def _mark_restarting(self, pod: Any) -> None:
        job = self._job_of(pod)
        if job is not None:
            self._set_condition(job, "Restarting", "PyTorchJobRestarting",
                                f"PyTorchJob {job['metadata']['name']} is restarting because {pod.metadata.name} exited.")

    def _container(self, pod: Any) -> Any:
        """The container the stand-in runs (one per pod): Kubeflow v1's `pytorch`."""
        return next(c for c in pod.spec.containers if c.name == "pytorch")

    def log_path(self, pod_name: str) -> Path:
        return self.workdir / "logs" / f"{self.namespace}_{pod_name}.log"

    def _run(self, pod: Any, restarts: int) -> _Process:
        container = self._container(pod)
        env = self._env(pod, container)
        argv = list(container.command or []) + list(container.args or [])
        log = self.log_path(pod.metadata.name)
        cwd = self.workdir / "pods" / pod.metadata.name
        cwd.mkdir(parents=True, exist_ok=True)
        # A process cannot see a bind-mounted /dev/termination-log here: hpctrain's own setting for another
        # terminationMessagePath points it at this container's file instead.
        termination_log = cwd / f"termination-log-{restarts}"
        termination_log.write_bytes(b"")
        env["HPCTRAIN_TERMINATION_LOG"] = str(termination_log)
        with open(log, "ab") as out:
            popen = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        return _Process(popen=popen, log=log, termination_log=termination_log, restarts=restarts)

    def _env(self, pod: Any, container: Any) -> dict[str, str]:
        """The environment of the container's processes: the test's, less what would confuse torch.distributed,
        plus the container's env."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "TORCHELASTIC_", "PET_")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        env.update(_container_env(pod, container))
        return env

    def _container_status(self, pod: Any, proc: _Process, state: dict[str, Any],
                          last: tuple[int, str, str] | None) -> dict[str, Any]:
        container = self._container(pod)
        status = {"name": container.name, "image": container.image, "imageID": "", "restartCount": proc.restarts,
                  "ready": "running" in state, "state": state}
        if last is not None:
            status["lastState"] = {"terminated": {"exitCode": last[0], "reason": "Error", "startedAt": last[1],
                                                  "finishedAt": now(), **({"message": last[2]} if last[2] else {})}}
        return status

    def _report_running(self, pod: Any, proc: _Process, last: tuple[int, str, str] | None = None) -> None:
        self.core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": {
            "phase": "Running", "hostIP": "127.0.0.1", "podIP": "127.0.0.1", "startTime": proc.started,
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [self._container_status(pod, proc, {"running": {"startedAt": proc.started}}, last)],
        }})

    def _report_terminated(self, pod: Any, proc: _Process, code: int) -> None:
        state = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                "startedAt": proc.started, "finishedAt": now(),
                                **({"message": _said(proc)} if _said(proc) else {})}}
        self.core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
            "containerStatuses": [self._container_status(pod, proc, state, None)],
        }})

    def _terminate(self, pod: Any, proc: _Process | None) -> None:
        """A pod being deleted: SIGTERM, SIGKILL after its grace period, then remove it for good."""
        if proc is not None and proc.popen.poll() is None:
            grace = pod.spec.termination_grace_period_seconds or 30
            if proc.term_sent is None:
                proc.term_sent = time.monotonic()
                os.killpg(proc.popen.pid, signal.SIGTERM)
            elif time.monotonic() - proc.term_sent > grace:
                os.killpg(proc.popen.pid, signal.SIGKILL)
            return
        self._delete_pod(pod.metadata.name, grace=0)

    def running(self, pod_name: str) -> bool:
        with self._lock:
            return any(p.log == self.log_path(pod_name) and p.popen.poll() is None for p in self.procs.values())

    # ---- the kubelet's log endpoint, reached through the API server -----------------------------------------

    def _start_log_server(self) -> int:
        certs = self.workdir / "kubelet-tls"
        certs.mkdir(parents=True, exist_ok=True)
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(certs / "key.pem"),
                        "-out", str(certs / "cert.pem"), "-days", "2", "-subj", "/CN=127.0.0.1"],
                       check=True, capture_output=True)
        standin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # /containerLogs/NAMESPACE/POD/CONTAINER?follow=true
                url = urllib.parse.urlsplit(self.path)
                parts = url.path.strip("/").split("/")
                if len(parts) == 4 and parts[0] == "exec":
                    standin._serve_exec(self, parts[1], parts[2], parts[3], urllib.parse.parse_qs(url.query))
                    return
                if len(parts) != 4 or parts[0] != "containerLogs" or not standin.log_path(parts[2]).exists():
                    self.send_error(404, "no such container log")
                    return
                follow = urllib.parse.parse_qs(url.query).get("follow") == ["true"]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                with open(standin.log_path(parts[2]), "rb") as f:
                    while True:
                        chunk = f.read(65536)
                        if chunk:
                            self.wfile.write(chunk)
                            self.wfile.flush()
                            continue
                        if not follow or not standin.running(parts[2]) or standin._stop.is_set():
                            break
                        time.sleep(0.1)

            do_POST = do_GET  # an SPDY exec (kubectl's) is a POST: refused with a reason

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(certs / "cert.pem"), str(certs / "key.pem"))
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, name="standin-kubelet", daemon=True).start()
        self._server = server
        return server.server_address[1]

    # ---- the kubelet's exec endpoint: /exec/NAMESPACE/POD/CONTAINER?command=...&output=1&error=1 -----------------

    def _serve_exec(self, request: http.server.BaseHTTPRequestHandler, namespace: str, pod_name: str, container_name: str,
                    query: dict[str, list[str]]) -> None:
        """Run `command` beside the pod's container and answer as the kubelet does to a WebSocket client.

        The API server passes the client's upgrade request through unchanged (UpgradeAwareHandler), so the handshake
        seen here is the client's own. Remote command protocol v4 over WebSocket: every binary message starts with
        its channel (1 stdout, 2 stderr, 3 the final metav1.Status: Success, or Failure with reason NonZeroExitCode
        and an ExitCode cause), then the server closes. Only what `hpctrain top` and kubectl's non-interactive exec
        need: no stdin, no tty, no SPDY; the command runs to its end before its output is sent."""
        from wsproto.connection import Connection, ConnectionType
        from wsproto.events import BytesMessage, CloseConnection
        from wsproto.utilities import generate_accept_token

        headers = request.headers
        offered = [p.strip() for p in (headers.get("Sec-WebSocket-Protocol") or "").split(",")]
        if (headers.get("Upgrade") or "").lower() != "websocket" or EXEC_PROTOCOL not in offered:
            request.send_error(400, f"the stand-in kubelet answers exec over WebSocket ({EXEC_PROTOCOL}) only")
            return
        pod = self._exec_target(namespace, pod_name)
        container = next((c for c in pod.spec.containers if c.name == container_name), None) if pod else None
        if pod is None or container is None:
            request.send_error(404, f"container {container_name} of pod {namespace}/{pod_name} is not running here")
            return
        argv = query.get("command") or []
        request.protocol_version = "HTTP/1.1"
        request.send_response(101)
        request.send_header("Upgrade", "websocket")
        request.send_header("Connection", "Upgrade")
        request.send_header("Sec-WebSocket-Accept", generate_accept_token(headers["Sec-WebSocket-Key"].encode()).decode())
        request.send_header("Sec-WebSocket-Protocol", EXEC_PROTOCOL)
        request.end_headers()
        request.close_connection = True
        ws = Connection(ConnectionType.SERVER)
        cwd = self.workdir / "pods" / pod_name
        cwd.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run(argv, env=self._env(pod, container), cwd=cwd, capture_output=True,
                                  stdin=subprocess.DEVNULL, timeout=60, check=False)
            streams = [(1, done.stdout if query.get("output") == ["1"] else b""),
                       (2, done.stderr if query.get("error") == ["1"] else b"")]
            status = _exec_status(done.returncode)
        except (OSError, IndexError):  # no such executable (or no command): the runtime's error, as the kubelet wraps it
            streams, status = [], _exec_internal_error(f'exec: "{argv[0] if argv else ""}": executable file not found in $PATH')
        for channel, data in streams + [(3, json.dumps(status).encode())]:
            if data:
                request.wfile.write(ws.send(BytesMessage(data=bytes([channel]) + data)))
        request.wfile.write(ws.send(CloseConnection(code=1000)))
        request.connection.settimeout(10)
        try:  # the client answers the close; wait for it, as a WebSocket server does, before the socket closes
            while (chunk := request.rfile.read1(65536)):
                ws.receive_data(chunk)
                if any(isinstance(event, CloseConnection) for event in ws.events()):
                    break
        except OSError:
            pass

    def _exec_target(self, namespace: str, pod_name: str) -> Any | None:
        """The pod, when it is this stand-in's and its container is running."""
        from kubernetes.client.rest import ApiException

        if namespace != self.namespace:
            return None
        try:
            pod = self.core.read_namespaced_pod(pod_name, namespace)
        except ApiException:
            return None
        with self._lock:
            proc = self.procs.get(pod.metadata.uid)
            alive = proc is not None and proc.popen.poll() is None
        return pod if alive and pod.spec.node_name == self.node else None


EXEC_PROTOCOL = "v4.channel.k8s.io"


def _exec_status(code: int) -> dict[str, Any]:
    """The metav1.Status the kubelet ends an exec with (remote command protocol v4)."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    code = 128 - code if code < 0 else code
    return {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: exit status {code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}


def _exec_internal_error(reason: str) -> dict[str, Any]:
    """The Status the kubelet ends an exec with when the runtime could not start the command (an InternalError)."""
    message = f"error executing command in container: {reason}"
    return {"metadata": {}, "status": "Failure", "code": 500, "reason": "InternalError",
            "message": f"Internal error occurred: {message}", "details": {"causes": [{"message": message}]}}


def _container_env(pod: Any, container: Any) -> dict[str, str]:
    """The container's env as the kubelet sets it: plain values, and the downward API's fields (`metadata.name`,
    `metadata.namespace`, `metadata.labels['K']`, `metadata.annotations['K']`, `spec.nodeName`)."""
    env = {}
    for e in container.env or []:
        ref = e.value_from.field_ref if e.value_from is not None else None
        if ref is None:
            env[e.name] = e.value or ""
            continue
        path = ref.field_path
        if path in ("metadata.name", "metadata.namespace"):
            env[e.name] = getattr(pod.metadata, path.split(".")[1])
        elif path == "spec.nodeName":
            env[e.name] = pod.spec.node_name or ""
        elif path.startswith(("metadata.labels['", "metadata.annotations['")) and path.endswith("']"):
            field, key = path[len("metadata."):-2].split("['", 1)
            env[e.name] = (getattr(pod.metadata, field) or {}).get(key, "")
        else:
            raise ValueError(f"the stand-in kubelet cannot resolve fieldRef {path!r} of {pod.metadata.name}")
    return env


def _said(proc: _Process) -> str:
    """The container's termination message, as the kubelet reads it (at most 4096 bytes)."""
    try:
        return proc.termination_log.read_bytes()[:4096].decode(errors="replace")
    except OSError:
        return ""


def _pod_ip(pod: Any | None) -> str | None:
    return pod.status.pod_ip if pod is not None and pod.status else None


def _past_backoff_limit(replicas: dict[str, Any], limit: int | None, pods: list[Any]) -> bool:
    """training-operator v1's PastBackoffLimit: the restartCounts of the running pods of replicas restarted by the
    kubelet or the operator (OnFailure, Always, ExitCode) reach the limit (exceed it, for a limit of 0)."""
    if limit is None:
        return False
    counted = {rtype.lower() for rtype, spec in replicas.items()
               if spec.get("restartPolicy", "Never") in ("OnFailure", "Always", "ExitCode")}
    restarts = sum(cs.restart_count or 0 for pod in pods
                   if pod.metadata.labels.get("training.kubeflow.org/replica-type") in counted
                   and pod.status and pod.status.phase == "Running"
                   for cs in (pod.status.container_statuses or []) + (pod.status.init_container_statuses or []))
    return restarts > 0 if limit == 0 else restarts >= limit


def _api_message(err: Any) -> str:
    """The API server's own words for a refused request (the Status' message), as client-go's error prints them."""
    try:
        return json.loads(err.body)["message"]
    except (TypeError, ValueError, KeyError):
        return str(err.reason)


def _owner_uid(pod: Any) -> str | None:
    return next((o.uid for o in pod.metadata.owner_references or []), None)


def _exit_code(pod: Any) -> int | None:
    for cs in (pod.status.container_statuses or []) if pod.status else []:
        if cs.state and cs.state.terminated:
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
                    custom.patch_namespaced_custom_object(group, version, name, plural, obj_name, {"metadata": {"finalizers": None}})
                custom.delete_namespaced_custom_object(group, version, name, plural, obj_name)
            except ApiException as err:
                if err.status != 404:
                    raise
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
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
    pytest.fail(f"timed out waiting for {what}")


# ---- plain Pods (hpctrain's dev and TensorBoard pods): scheduler and kubelet only ---------------------------

SERVICE_POD_LABEL = "hpctrain.io/service"


class ServicePodStandIn(KubeflowStandIn):
    """A TEST-ONLY FAKE of kube-scheduler and the kubelet for plain Pods that carry hpctrain's service label (dev
    sessions, TensorBoard on the cluster); no Kubeflow controller is involved. Each pass it binds such pods to its
    Node (the Binding API, as the scheduler does), runs the first container's command + args as a local process
    (the environment of the test, `extra_env`, then the container's env with `value` and `secretKeyRef` resolved
    from the Secret, HOME set to a fresh folder of the pod's own), probes its readinessProbe's httpGet on the pod IP
    (127.0.0.1: the processes share this host's network), and writes phase, podIP, the Ready condition and the
    container status back through the API. Deleting a pod stops its process as for job pods (SIGTERM, then
    SIGKILL after the grace period). It does not enforce resources or activeDeadlineSeconds."""

    def __init__(self, api_client: Any, namespace: str, workdir: Path, extra_env: dict[str, str] | None = None) -> None:
        super().__init__(api_client, namespace, workdir, node_labels={"hpctrain-test/standin": "service-pods"})
        self.extra_env = dict(extra_env or {})
        self.reported: dict[str, tuple[str, bool]] = {}  # pod uid -> (phase, ready) last written

    def reconcile(self) -> None:
        from kubernetes.client.rest import ApiException

        for pod in self.core.list_namespaced_pod(self.namespace, label_selector=SERVICE_POD_LABEL).items:
            try:
                self._serve_pod(pod)
            except ApiException as err:
                if err.status not in (404, 409):
                    raise

    def _serve_pod(self, pod: Any) -> None:
        if not pod.spec.node_name:
            if not pod.metadata.deletion_timestamp:
                self.core.create_namespaced_pod_binding(
                    pod.metadata.name, self.namespace, {"apiVersion": "v1", "kind": "Binding",
                                                        "metadata": {"name": pod.metadata.name},
                                                        "target": {"apiVersion": "v1", "kind": "Node", "name": self.node}},
                    _preload_content=False)
            else:
                self._delete_pod(pod.metadata.name, grace=0)
            return
        tracked = self._tracked(pod)
        if tracked is None:
            return
        uid, proc = tracked
        if proc is None:
            with self._lock:
                proc = self.procs[uid] = self._start_container(pod)
        if proc.done:
            return
        code = proc.popen.poll()
        if code is not None:
            proc.done = True
            self._write_status(pod, proc, "Succeeded" if code == 0 else "Failed", False, exit_code=128 - code if code < 0 else code)
            return
        self._write_status(pod, proc, "Running", self._probe(pod))

    def _start_container(self, pod: Any) -> _Process:
        import base64

        container = pod.spec.containers[0]
        cwd = self.workdir / "pods" / pod.metadata.name
        cwd.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "KUBECONFIG"))}
        env.update(self.extra_env, HOME=str(cwd), HOSTNAME=pod.metadata.name)
        for e in container.env or []:
            if e.value_from is not None and e.value_from.secret_key_ref is not None:
                ref = e.value_from.secret_key_ref
                secret = self.core.read_namespaced_secret(ref.name, self.namespace)
                env[e.name] = base64.b64decode(secret.data[ref.key]).decode()
            else:
                env[e.name] = e.value or ""
        log = self.log_path(pod.metadata.name)
        with open(log, "ab") as out:
            popen = subprocess.Popen(list(container.command or []) + list(container.args or []), env=env, cwd=cwd,
                                     stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        return _Process(popen=popen, log=log, termination_log=cwd / "termination-log")

    def _probe(self, pod: Any) -> bool:
        import urllib.error
        import urllib.request

        container = pod.spec.containers[0]
        probe = container.readiness_probe
        if probe is None or probe.http_get is None:
            return True
        port = probe.http_get.port
        if isinstance(port, str) and not port.isdigit():
            port = next(p.container_port for p in container.ports or [] if p.name == port)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{probe.http_get.path or '/'}", timeout=2) as response:
                return 200 <= response.status < 400
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _write_status(self, pod: Any, proc: _Process, phase: str, ready: bool, exit_code: int | None = None) -> None:
        if self.reported.get(pod.metadata.uid) == (phase, ready):
            return
        container = pod.spec.containers[0]
        if exit_code is None:
            state: dict[str, Any] = {"running": {"startedAt": proc.started}}
        else:
            state = {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                                    "startedAt": proc.started, "finishedAt": now()}}
        ready_text = "True" if ready else "False"
        self.core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": {
            "phase": phase, "hostIP": "127.0.0.1", "podIP": "127.0.0.1", "startTime": proc.started,
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": ready_text},
                           {"type": "ContainersReady", "status": ready_text}],
            "containerStatuses": [{"name": container.name, "image": container.image, "imageID": "", "restartCount": 0,
                                   "ready": ready, "state": state}],
        }})
        self.reported[pod.metadata.uid] = (phase, ready)


# ---- Kubeflow Trainer v2: TrainJobs (a second, separate part of the fake) ----------------------------------------

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
# The trainer's torch plugin: the replicated job and container of the trainer nodes, and torchrun's variables.
NODE = "node"
TRAINER_PORT = 29500
JOB_BACKOFF_LIMIT = 6  # a batch/v1 Job's default; the torch-distributed runtime sets none


class TrainerStandIn(KubeflowStandIn):
    """Also plays Kubeflow Trainer v2 (TrainJob, trainer.kubeflow.org/v1alpha1), JobSet and the Job controller.

    A TEST-ONLY FAKE, like the rest of this module. For a TrainJob the real chain is TrainJob -> JobSet (same name)
    -> one Indexed batch/v1 Job per replicated job (`<job>-node-0`, completions = parallelism = numNodes) -> pods.
    The JobSet CRD is not on the test server and 1.20 has no Indexed Jobs, so this fake skips the middle objects
    and creates what the Job controller would: pods `<job>-node-0-<index>-<suffix>` with hostname
    `<job>-node-0-<index>` and subdomain `<job>`, JobSet's and the Job controller's labels and annotations
    (jobset-name, replicatedjob-name=node, job-index, restart-attempt, batch.kubernetes.io/job-completion-index...),
    owned directly by the TrainJob. The `node` container is the runtime's (torch-distributed) with the TrainJob's
    trainer (image, command, args, env, resourcesPerNode) and the runtimePatches' pod template merged in, and the
    variables the torch plugin injects: PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (from the completion-index
    annotation, as a fieldRef), PET_MASTER_ADDR, PET_MASTER_PORT, plus the Job controller's JOB_COMPLETION_INDEX.
    PET_MASTER_ADDR is 127.0.0.1 and the port a free one (Trainer: `<job>-node-0-0.<job>` and 29500), since
    the pods are local processes. restartPolicy OnFailure (JobSet's webhook default) within the Job's default
    backoffLimit of 6. Status as the controller writes it: conditions Complete (all pods succeeded; reason
    AllJobsCompleted) or Failed (reason FailedJobs; the other pods are then deleted, as the Job controller does)
    copied from the JobSet, and jobsStatus; a TrainJob has no Running condition.
    """

    def start(self) -> TrainerStandIn:
        if not self.kubelet:
            raise ValueError("TrainerStandIn needs its fake kubelet (kubelet=True): with a real node the pods would "
                             "need JobSet's headless Service and a cluster DNS for PET_MASTER_ADDR")
        super().start()
        return self

    def reconcile(self) -> None:
        super().reconcile()
        self._reconcile_jobs((TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS), JOBSET_NAME,
                             lambda pod: pod.metadata.labels[JOBSET_NAME], lambda job: job["metadata"]["name"],
                             self._control_trainjob)

    def _control_trainjob(self, job: dict[str, Any], pods: list[Any]) -> None:
        conditions = (job.get("status") or {}).get("conditions") or []
        if any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conditions):
            for pod in pods:  # the Job controller removes the active pods of a failed Job
                if pod.status and pod.status.phase in ("Pending", "Running") and not pod.metadata.deletion_timestamp:
                    self._delete_pod(pod.metadata.name, grace=None)
            return
        trainer = job["spec"].get("trainer") or {}
        nnodes = int(trainer.get("numNodes", 1))
        indexes = {int(p.metadata.annotations[COMPLETION_INDEX]) for p in pods}
        for index in range(nnodes):
            if index not in indexes:
                self._create_trainjob_pod(job, index, nnodes)
        phases = [p.status.phase if p.status else "Pending" for p in pods]
        failed, succeeded = "Failed" in phases, len(pods) == nnodes and phases.count("Succeeded") == nnodes
        # JobSet's replicatedJobsStatus counts child Jobs (here the one Job), not pods.
        counts = {"active": int(not failed and any(ph in ("Pending", "Running") for ph in phases)),
                  "ready": int(not failed and phases.count("Running") + phases.count("Succeeded") >= nnodes),
                  "succeeded": int(succeeded), "failed": int(failed), "suspended": 0}
        status = {"jobsStatus": [{"name": NODE, **counts}]}
        if failed:
            status["conditions"] = conditions + [_condition("Failed", "FailedJobs", "jobset failed due to one or more job failures")]
        elif succeeded:
            status["conditions"] = conditions + [_condition("Complete", "AllJobsCompleted", "jobset completed successfully")]
        if status != {k: (job.get("status") or {}).get(k) for k in status}:
            self.custom.patch_namespaced_custom_object_status(TRAINER_GROUP, TRAINER_VERSION, self.namespace, TRAINJOBS,
                                                              job["metadata"]["name"], {"status": status})

    def _runtime_pod_template(self, job: dict[str, Any]) -> dict[str, Any]:
        """The `node` replicated job's pod template: the runtime's, with the TrainJob's runtimePatches merged in."""
        ref = job["spec"]["runtimeRef"]
        if ref.get("kind", "ClusterTrainingRuntime") == "ClusterTrainingRuntime":
            runtime = self.custom.get_cluster_custom_object(TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", ref["name"])
        else:
            runtime = self.custom.get_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, self.namespace,
                                                               "trainingruntimes", ref["name"])
        spec = runtime["spec"]
        for patch in job["spec"].get("runtimePatches") or []:
            spec = _merge(spec, patch.get("trainingRuntimeSpec") or {})
        rjob = next(r for r in spec["template"]["spec"]["replicatedJobs"] if r["name"] == NODE)
        return rjob["template"]["spec"]["template"]

    def _create_trainjob_pod(self, job: dict[str, Any], index: int, nnodes: int) -> None:
        name, uid = job["metadata"]["name"], job["metadata"]["uid"]
        trainer = job["spec"].get("trainer") or {}
        template = self._runtime_pod_template(job)
        port = self.ports.setdefault(uid, free_port())
        pod_spec = dict(template.get("spec") or {})
        containers = []
        for c in pod_spec.get("containers") or []:
            c = dict(c)
            if c["name"] == NODE:
                for key in ("image", "command", "args"):
                    if key in trainer:
                        c[key] = trainer[key]
                if "resourcesPerNode" in trainer:
                    c["resources"] = trainer["resourcesPerNode"]
                nproc = trainer.get("numProcPerNode", "auto")
                c["env"] = list(c.get("env") or []) + list(trainer.get("env") or []) + [
                    {"name": "PET_NNODES", "value": str(nnodes)},
                    {"name": "PET_NPROC_PER_NODE", "value": str(nproc)},
                    {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}},
                    {"name": "PET_MASTER_ADDR", "value": "127.0.0.1"},
                    {"name": "PET_MASTER_PORT", "value": str(port)},
                    {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}},
                ]
                c["ports"] = [{"containerPort": TRAINER_PORT}]
            containers.append(c)
        job_name = f"{name}-{NODE}-0"
        pod_spec.update(containers=containers, nodeName=self.node, hostname=f"{job_name}-{index}", subdomain=name,
                        restartPolicy=pod_spec.get("restartPolicy") or "OnFailure")
        jobset = {JOBSET_NAME: name, JOBSET_UID: uid, REPLICATED_JOB: NODE, REPLICATED_JOB_REPLICAS: "1",
                  GLOBAL_REPLICAS: "1", JOB_INDEX: "0", JOB_GLOBAL_INDEX: "0", RESTART_ATTEMPT: "0",
                  JOB_KEY: hashlib.sha1(f"{self.namespace}/{job_name}".encode()).hexdigest()}
        batch = {"batch.kubernetes.io/job-name": job_name, "job-name": job_name, COMPLETION_INDEX: str(index)}
        labels = {**((template.get("metadata") or {}).get("labels") or {}), **jobset, **batch}
        owner = {"apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}", "kind": "TrainJob", "name": name, "uid": uid,
                 "controller": True, "blockOwnerDeletion": True}
        self.core.create_namespaced_pod(self.namespace, {
            "metadata": {"name": f"{job_name}-{index}-{uuid.uuid4().hex[:5]}", "labels": labels,
                         "annotations": {**jobset, COMPLETION_INDEX: str(index)}, "ownerReferences": [owner]},
            "spec": pod_spec})

    # ---- the kubelet part, for the `node` container ------------------------------------------------------

    def _container(self, pod: Any) -> Any:
        if JOBSET_NAME not in (pod.metadata.labels or {}):
            return super()._container(pod)
        return next(c for c in pod.spec.containers if c.name == NODE)

    def _may_restart(self, pod: Any, code: int) -> bool:
        labels = pod.metadata.labels or {}
        if JOBSET_NAME not in labels:
            return super()._may_restart(pod, code)
        if pod.spec.restart_policy != "OnFailure":
            return False
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"{JOBSET_NAME}={labels[JOBSET_NAME]}").items
        return sum(self.procs[p.metadata.uid].restarts for p in pods if p.metadata.uid in self.procs) < JOB_BACKOFF_LIMIT

    def _mark_restarting(self, pod: Any) -> None:
        if JOBSET_NAME not in (pod.metadata.labels or {}):
            super()._mark_restarting(pod)
        # A TrainJob has no Restarting condition: the restart shows in the pod's restartCount only.


def _condition(ctype: str, reason: str, message: str) -> dict[str, str]:
    return {"type": ctype, "status": "True", "reason": reason, "message": message, "lastTransitionTime": now()}


def _merge(base: Any, patch: Any) -> Any:
    """A strategic merge, as far as runtime patches need it: maps merge key by key, lists of named items merge by
    name, anything else is replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        return {**base, **{k: _merge(base[k], v) if k in base else v for k, v in patch.items()}}
    if (isinstance(base, list) and isinstance(patch, list) and all(isinstance(x, dict) and "name" in x for x in base + patch)):
        merged = {x["name"]: x for x in base}
        for x in patch:
            merged[x["name"]] = _merge(merged[x["name"]], x) if x["name"] in merged else x
        return list(merged.values())
    return patch
