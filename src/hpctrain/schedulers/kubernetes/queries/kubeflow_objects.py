"""Reading the Kubeflow objects and their pods: a PyTorchJob's or TrainJob's state from its conditions, each pod's
replica name, phase, restarts, exit status and last words, and what a pod takes from its node. Pure: functions of
the API objects the scheduler (scheduler.py) has fetched.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Container, Iterable
from dataclasses import replace
from decimal import Decimal
from typing import Any

from hpctrain.schedulers import base
from hpctrain.schedulers.base import NodeView, ReplicaStatus
from hpctrain.schedulers.kubernetes.manifests.options import parse_quantity
from hpctrain.schedulers.kubernetes.manifests.render import CONTAINER_TRAINJOB

GPU = "nvidia.com/gpu"

# Pod labels set by the controllers, used to find a job's pods.
PYTORCHJOB_SELECTOR = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
TRAINJOB_SELECTOR = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"

EXITED_WITH_CODE = "ExitedWithCode"  # training-operator v1's event reason for a terminated training container
_EXIT_CODE = re.compile(r"exited with code (-?[0-9]+)$")

_PYTORCHJOB_STATES = {
    "Created": base.PENDING,
    "Running": base.RUNNING,
    "Restarting": base.RESTARTING,
    "Succeeded": base.SUCCEEDED,
    "Failed": base.FAILED,
    "Suspended": base.SUSPENDED,
}
_TRAINJOB_STATES = {
    "Created": base.PENDING,
    "Complete": base.SUCCEEDED,
    "Failed": base.FAILED,
    "Suspended": base.SUSPENDED,
}


def quantity_or_zero(value: Any) -> Decimal:
    """A resource quantity (CPU, memory, GPUs) as a number; an absent one is 0."""
    return parse_quantity(value) if value is not None else Decimal(0)


@functools.lru_cache(maxsize=4096)
def _quantity(text: str | int | float) -> Decimal:
    """parse_quantity, once per distinct text: a cluster's pods repeat a few dozen quantities (`cluster` sums every
    running pod's requests)."""
    return parse_quantity(text)


def pod_requests(pod: dict[str, Any]) -> dict[str, Decimal]:
    """What a pod (its JSON, as the API server sends it) takes from its node: the sum over containers (requests,
    else limits), at least the largest init container, as the scheduler counts it."""

    def one(container: dict[str, Any]) -> dict[str, Decimal]:
        res = container.get("resources") or {}
        req = dict(res.get("limits") or {})
        req.update(res.get("requests") or {})
        return {k: _quantity(v) for k, v in req.items()}

    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    for c in spec.get("containers") or []:
        for k, v in one(c).items():
            total[k] = total.get(k, Decimal(0)) + v
    for c in spec.get("initContainers") or []:
        for k, v in one(c).items():
            total[k] = max(total.get(k, Decimal(0)), v)
    return total


def object_state(obj: dict[str, Any], api: str) -> tuple[str, str | None]:
    """(state, message) of a PyTorchJob or TrainJob object from its status. The controllers append conditions: the
    last true one is the current one. A TrainJob has no Running condition: it runs when its JobSet's child Jobs
    are ready (status.jobsStatus, counted in Jobs: all of a Job's pods running or done)."""
    status = obj.get("status") or {}
    states = _PYTORCHJOB_STATES if api == "pytorchjob" else _TRAINJOB_STATES
    state, message = base.PENDING, None
    for c in status.get("conditions") or []:
        if c.get("status") == "True" and c.get("type") in states:
            state, message = states[c["type"]], c.get("message")
    if api == "trainjob" and state == base.PENDING and any(j.get("ready") for j in status.get("jobsStatus") or []):
        state = base.RUNNING
    if obj["metadata"].get("deletionTimestamp"):
        state, message = base.CANCELLED, "being deleted (hpctrain cancel): pods stop and checkpoint"
    return state, message


def elastic_range(obj: dict[str, Any]) -> str | None:
    """An elastic PyTorchJob's node range, its elasticPolicy's minReplicas:maxReplicas ("1:2"); None for a job
    without an elasticPolicy or with counts that are no whole numbers. As training-operator v1.9's setElasticPolicy
    defaults them (pkg/controller.v1/pytorch/elastic.go): either one alone stands for both, neither gives the Worker
    replicas."""
    spec = obj.get("spec") or {}
    policy = spec.get("elasticPolicy")
    if not isinstance(policy, dict):
        return None
    low, high = policy.get("minReplicas"), policy.get("maxReplicas")
    if low is None and high is None:
        worker = (spec.get("pytorchReplicaSpecs") or {}).get("Worker") or {}
        low = high = worker.get("replicas", 1)
    low, high = (low if low is not None else high), (high if high is not None else low)
    counts = (low, high)
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 31 for n in counts):
        return None
    return f"{low}:{high}"


def running_pod(pod: dict[str, Any]) -> bool:
    """A pod that runs and is not on its way out (a deleted pod stays Running while it stops)."""
    return (pod.get("status") or {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")


def replica_name(pod: dict[str, Any]) -> str:
    """`master-0`, `worker-N` (PyTorchJob), `node-N` (TrainJob: JobSet's replicated job and the pod's completion
    index, a label only since Kubernetes 1.28 and an annotation before), else the pod's name."""
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    if REPLICA_TYPE_LABEL in labels:
        return f"{labels[REPLICA_TYPE_LABEL].lower()}-{labels.get(REPLICA_INDEX_LABEL, '0')}"
    index = labels.get(COMPLETION_INDEX_LABEL, (meta.get("annotations") or {}).get(COMPLETION_INDEX_LABEL))
    if index is not None:
        return f"{labels.get(REPLICATED_JOB_LABEL, CONTAINER_TRAINJOB)}-{index}"
    return meta["name"]


def jobset_restarts(pods: list[dict[str, Any]]) -> int:
    """How often a TrainJob's JobSet recreated its pods (failurePolicy.maxRestarts): the restart-attempt label of
    its newest pods. Those pods are new, so their restartCounts (the in-place restarts) do not count it."""
    return max((int((p["metadata"].get("labels") or {}).get(RESTART_ATTEMPT_LABEL, "0")) for p in pods), default=0)


def replica_key(name: str) -> tuple[int, int, str]:
    kind, _, index = name.rpartition("-")
    order = {"master": 0, "node": 1, "worker": 2}.get(kind, 3)
    return order, int(index) if index.isdigit() else 0, name


def replica_status(pod: dict[str, Any]) -> ReplicaStatus:
    """A pod (its JSON) as a replica: phase, node, restarts, exit code, why it waits or ended, its last words."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    restarts, exit_code, reason, message = 0, None, status.get("reason"), None
    for cs in status.get("containerStatuses") or []:
        restarts += int(cs.get("restartCount") or 0)
        state = cs.get("state") or {}
        last = (cs.get("lastState") or {}).get("terminated")
        if state.get("terminated"):
            ended = state["terminated"]
            exit_code, reason = ended.get("exitCode"), ended.get("reason") or reason
            message = ended.get("message")
        elif state.get("waiting"):
            reason = state["waiting"].get("reason") or reason
        if last and exit_code is None:  # running again, or waiting to (CrashLoopBackOff): the last attempt's code
            exit_code = last.get("exitCode")
        if message is None and last is not None:  # restarted in place (or waiting to): the last attempt's words
            message = last.get("message")
    if phase == "Pending" and reason is None:
        for c in status.get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                reason = c.get("reason")
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    return ReplicaStatus(
        name=replica_name(pod),
        phase=phase,
        node=(pod.get("spec") or {}).get("nodeName"),
        restarts=restarts,
        exit_code=exit_code,
        reason=reason,
        message=(message or "").strip() or None,
    )


def recorded_exit_code(events: list[dict[str, Any]]) -> int | None:
    """The newest non-zero exit code among training-operator v1's ExitedWithCode events on a job: on each reconcile
    that finds a pod's `pytorch` container terminated it records "Pod: NS.POD exited with code N" (a Normal event;
    pkg/controller.v1/common/pod.go ReconcilePods, v1.7-v1.9.4). None without one (events expire, an hour by
    default)."""
    codes = []
    for e in events:
        match = _EXIT_CODE.search(e.get("message") or "")
        if match and int(match.group(1)):
            when = e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp")
            codes.append((str(when or ""), int(match.group(1))))
    return max(codes)[1] if codes else None


def requests_by_node(
    pods: Iterable[dict[str, Any]], nodes: Container[str] | None = None
) -> dict[str, dict[str, Decimal]]:
    """What the pods request, summed by the node they are bound to (only the `nodes` named, if given). The pods
    may come a page at a time (rest.RawApi.pages): none is kept, only the sums, one per node."""
    used: dict[str, dict[str, Decimal]] = {}
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name or (nodes is not None and node_name not in nodes):
            continue
        node_use = used.setdefault(node_name, {})
        for k, v in pod_requests(pod).items():
            node_use[k] = node_use.get(k, Decimal(0)) + v
    return used


def node_views(node_objects: Iterable[dict[str, Any]], used: dict[str, dict[str, Decimal]]) -> list[NodeView]:
    """Each node's capacity against what `used` says its pods requested (nothing for a node it does not name)."""
    nodes = []
    for n in node_objects:
        alloc = (n.get("status") or {}).get("allocatable") or {}
        empty = NodeView(
            name=n["metadata"]["name"],
            cpu_allocatable=float(quantity_or_zero(alloc.get("cpu"))),
            cpu_requested=0.0,
            memory_allocatable=int(quantity_or_zero(alloc.get("memory"))),
            memory_requested=0,
            gpus_allocatable=int(quantity_or_zero(alloc.get(GPU))),
            gpus_requested=0,
            schedulable=not (n.get("spec") or {}).get("unschedulable"),
        )
        nodes.append(with_use(empty, used.get(empty.name, {})))
    return nodes


def with_use(node: NodeView, use: dict[str, Decimal]) -> NodeView:
    """`node` with what its pods request (requests_by_node's sums for it) as its requested resources."""
    if not use:
        return node
    return replace(
        node,
        cpu_requested=float(use.get("cpu", 0)),
        memory_requested=int(use.get("memory", 0)),
        gpus_requested=int(use.get(GPU, 0)),
    )


def _whole(value: Any) -> int | None:
    """A count from an object written by anyone: an int or its digits (nprocPerNode is a string), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _gpus(resources: Any) -> int:
    limits = resources.get("limits") if isinstance(resources, dict) else None
    return (_whole(limits.get(GPU)) or 0) if isinstance(limits, dict) else 0


def job_summary(obj: dict[str, Any], api: str, pods: list[dict[str, Any]]) -> base.JobSummary:
    """A PyTorchJob or TrainJob (its JSON) and its pods as the neutral summary: its pods (one a node), processes a
    pod (nprocPerNode, numProcPerNode; "auto" and the like say no number), the GPUs its pods ask for, and the
    restarts of its pods (in place, and a TrainJob's JobSet recreating them)."""
    state, _ = object_state(obj, api)
    spec = obj.get("spec") or {}
    if api == "pytorchjob":
        specs = [s for s in (spec.get("pytorchReplicaSpecs") or {}).values() if isinstance(s, dict)]
        counts = [_whole(s.get("replicas", 1)) or 0 for s in specs]
        containers = [((s.get("template") or {}).get("spec") or {}).get("containers") or [{}] for s in specs]
        per_pod = [_gpus(c[0].get("resources")) if isinstance(c[0], dict) else 0 for c in containers]
        nodes, gpus, processes = sum(counts), sum(map(int.__mul__, counts, per_pod)), spec.get("nprocPerNode")
    else:
        trainer = spec.get("trainer") or {}
        nodes = _whole(trainer.get("numNodes", 1)) or 0
        gpus, processes = nodes * _gpus(trainer.get("resourcesPerNode")), trainer.get("numProcPerNode")
    restarts = sum(replica_status(p).restarts for p in pods) + jobset_restarts(pods)
    meta = obj["metadata"]
    return base.JobSummary(
        job_id=meta["name"],
        state=state,
        created=meta.get("creationTimestamp"),
        replicas=nodes,
        name=meta["name"],
        processes_per_node=_whole(processes),
        gpus=gpus,
        restarts=restarts,
    )
