"""The parts of a pod spec that a job's pods (render.py: PyTorchJob, TrainJob) and the service pods (services.py:
dev sessions, TensorBoard) share: what a pod asks for, its volumes (and /dev/shm), where and as whom it runs, and
the grace period it has after SIGTERM. Pure, as render.py.
"""

from __future__ import annotations

from typing import Any

from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions, Volume, memory_quantity

SHM_VOLUME = "dshm"
DEFAULT_GRACE_S = 30  # Kubernetes' own default, when --signal-grace is 0


def resources_per_pod(job: JobSpec) -> dict[str, str]:
    """What one pod asks for (requests = limits)."""
    r = job.resources
    out = {"cpu": str(r.cpus_per_task * r.nproc_per_node)}
    if r.mem_bytes:
        out["memory"] = memory_quantity(r.mem_bytes)
    if r.gpus_per_node:
        out["nvidia.com/gpu"] = str(r.gpus_per_node)
    return out


def _volume(index: int, v: Volume) -> dict[str, Any]:
    name = f"vol-{index}"
    if v.kind == "pvc":
        return {
            "name": name,
            "persistentVolumeClaim": {"claimName": v.source, **({"readOnly": True} if v.read_only else {})},
        }
    if v.kind == "nfs":
        return {
            "name": name,
            "nfs": {"server": v.server, "path": v.source, **({"readOnly": True} if v.read_only else {})},
        }
    return {"name": name, "hostPath": {"path": v.source, "type": "Directory"}}


def pod_volumes(options: KubernetesOptions) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container volumeMounts)"""
    volumes, mounts = [], []
    if options.shm is not None:
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": options.shm}})
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    for i, v in enumerate(options.parsed_volumes):
        volumes.append(_volume(i, v))
        mounts.append({"name": f"vol-{i}", "mountPath": v.mount, **({"readOnly": True} if v.read_only else {})})
    return volumes, mounts


def pod_extras(job: JobSpec, options: KubernetesOptions) -> dict[str, Any]:
    """Pod spec fields shared by both APIs (apart from containers and volumes)."""
    out = pod_placement(options)
    if job.exclude_nodes:  # --exclude-nodes: the scheduler must not place any pod there
        # By the Node object's own name (matchFields metadata.name), not the kubernetes.io/hostname label, which
        # may differ from it and, as a label value, cannot hold names over 63 characters. One requirement per node
        # (a term's requirements are ANDed): the API server takes exactly one value for an In/NotIn on a node field
        # (validateNodeFieldSelectorRequirement, pkg/apis/core/validation/validation.go).
        not_on = [{"key": "metadata.name", "operator": "NotIn", "values": [node]} for node in job.exclude_nodes]
        out["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": not_on},
                    ]
                }
            }
        }
    out["terminationGracePeriodSeconds"] = job.signal_grace or DEFAULT_GRACE_S
    return out


def pod_placement(options: KubernetesOptions) -> dict[str, Any]:
    """Where and as whom a pod runs: node selector, tolerations, service account, image pull secrets."""
    out: dict[str, Any] = {}
    if options.node_selector:
        out["nodeSelector"] = options.node_selector_map
    if options.tolerations:
        out["tolerations"] = options.toleration_list
    if options.service_account:
        out["serviceAccountName"] = options.service_account
    if options.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": s} for s in options.image_pull_secrets]
    return out
