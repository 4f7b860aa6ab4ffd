"""A TEST-ONLY FAKE of Kubeflow Trainer v2 (TrainJob, trainer.kubeflow.org/v1alpha1), JobSet, the Job controller and
the kubelet, on the API-server-only local cluster (scripts/local-k8s.sh without a node), for tests/test_k8s_trainjob.py.

This is what is left of the fake kubelet that once ran every Kubernetes test's pods (the PyTorchJob tests now run on
the cluster's real node, with only the controller faked: tests/kubeflow_standin.py). The TrainJob tests stay here
because a real node cannot run a TrainJob's pods faithfully on the test machines: the real chain is TrainJob ->
JobSet -> Indexed batch/v1 Jobs -> pods, and the 1.20 API server has neither Indexed Jobs nor the JobSet CRD, the
pods find node 0 by JobSet's headless-Service DNS name (`<job>-node-0-0.<job>`), and there is no cluster DNS; and the
failure test's 6 restarts (the Job's default backoffLimit) would take the real kubelet's CrashLoopBackOff about five
minutes.

The fake kubelet: TrainJob pods bound to its Node run their `node` container's command as a local process (in the
environment of the test, plus the container's env); their phase, restart count and exit code are patched into the
pod's status; a pod being deleted gets SIGTERM, SIGKILL after its terminationGracePeriodSeconds, and is then removed.
Its Node object points the API server at a small HTTPS server here, so `kubectl logs` / read_namespaced_pod_log and
the Python client's exec (connect_get_namespaced_pod_exec, what `hpctrain top` uses) really go through the API
server (which proxies to "the kubelet", as it does in a cluster). exec runs the command as one more local process with
the container's environment and answers over WebSocket with the `v4.channel.k8s.io` subprotocol; no SPDY, stdin or
tty. It also plays the garbage collector: a TrainJob being deleted in the foreground loses its pods first, then its
finalizer; pods whose job is gone are deleted.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import signal
import ssl
import subprocess
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubeflow_standin import KubeflowStandIn, free_port, now


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

    def __init__(self, api_client: Any, namespace: str, workdir: Path, node_labels: dict[str, str] | None = None,
                 allocatable: dict[str, str] | None = None) -> None:
        super().__init__(api_client, namespace, workdir)
        self.workdir: Path = workdir
        self.node = f"standin-{uuid.uuid4().hex[:8]}"
        self.node_labels = node_labels or {}
        self.allocatable = allocatable or {"cpu": "16", "memory": "64Gi", "pods": "110"}
        self.procs: dict[str, _Process] = {}  # pod uid -> process
        self.ports: dict[str, int] = {}  # job uid -> PET_MASTER_PORT
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> TrainerStandIn:
        self._start_node()
        super().start()
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
        super().stop()
        for proc in self.procs.values():
            if proc.popen.poll() is None:
                os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        try:
            self.core.delete_node(self.node)
        except Exception:  # noqa: BLE001 - best effort at teardown
            pass

    def reconcile(self) -> None:
        """One pass: the TrainJobs' controllers, the garbage collector for deleted jobs and orphaned pods, and the
        kubelet for their pods."""
        from kubernetes.client.rest import ApiException

        jobs = self.custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, self.namespace, TRAINJOBS)["items"]
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=JOBSET_NAME).items
        by_job: dict[str, list[Any]] = {}
        for pod in pods:
            by_job.setdefault(pod.metadata.labels[JOBSET_NAME], []).append(pod)
        for job in jobs:
            mine = by_job.get(job["metadata"]["name"], [])
            if not job["metadata"].get("deletionTimestamp"):
                self._control_trainjob(job, mine)
            else:
                self._collect(job, mine)
        live = {j["metadata"]["name"] for j in jobs}
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

    def _collect(self, job: dict[str, Any], pods: list[Any]) -> None:
        for pod in pods:
            if not pod.metadata.deletion_timestamp:
                self._delete_pod(pod.metadata.name, grace=None)
        if not pods and job["metadata"].get("finalizers"):
            self.custom.patch_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, self.namespace, TRAINJOBS,
                                                       job["metadata"]["name"], {"metadata": {"finalizers": None}})

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
        if pod.spec.restart_policy != "OnFailure":
            return False
        labels = pod.metadata.labels or {}
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=f"{JOBSET_NAME}={labels[JOBSET_NAME]}").items
        return sum(self.procs[p.metadata.uid].restarts for p in pods if p.metadata.uid in self.procs) < JOB_BACKOFF_LIMIT

    def _mark_restarting(self, pod: Any) -> None:
        """A TrainJob has no Restarting condition: the restart shows in the pod's restartCount only."""

    def _container(self, pod: Any) -> Any:
        """The container the stand-in runs (one per pod): the runtime's `node`."""
        return next(c for c in pod.spec.containers if c.name == NODE)

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
