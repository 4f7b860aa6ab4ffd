"""A service in a Kubernetes pod: render the Pod (and the Secret holding its token) as plain dicts (pure), create,
find and delete them through the official client, and the `kubectl port-forward` command that reaches it.

Volumes and /dev/shm come from KubernetesOptions exactly as for training jobs (hpctrain.schedulers.kubernetes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpctrain.errors import UserError
from hpctrain.jobs.spec import Resources
from hpctrain.jobs.values import parse_time_limit
from hpctrain.schedulers.kubernetes.kubeconfig import kubectl
from hpctrain.schedulers.kubernetes.options import KubernetesOptions
from hpctrain.schedulers.kubernetes.render import pod_placement, pod_volumes, quantity_mb

MANAGED_BY = {"app.kubernetes.io/managed-by": "hpctrain"}
SERVICE_LABEL = "hpctrain.io/service"
"""Label on every service pod: its kind (dev, tensorboard)."""
NAME_LABEL = "hpctrain.io/name"


@dataclass(frozen=True)
class ServicePod:
    name: str
    kind: str
    """dev or tensorboard: the value of SERVICE_LABEL."""
    command: tuple[str, ...]
    port: int
    resources: Resources = field(default_factory=Resources)
    time: str | None = None
    """Slurm-form time limit, rendered as activeDeadlineSeconds: the pod is stopped after it."""
    secret_env: tuple[tuple[str, str], ...] = ()
    """(variable, key) pairs read from the pod's Secret `name` (e.g. the Jupyter token)."""
    env: tuple[tuple[str, str], ...] = ()
    ready_path: str | None = None
    """An HTTP path that answers 200 once the server is up: the container's readinessProbe."""


def resources_of(r: Resources) -> dict[str, str]:
    out = {"cpu": str(r.cpus_per_task)}
    if r.mem_mb:
        out["memory"] = quantity_mb(r.mem_mb)
    if r.gpus_per_node:
        out["nvidia.com/gpu"] = str(r.gpus_per_node)
    if r.shards_per_node:
        raise UserError("--gres shard:N is a Slurm resource: on Kubernetes ask for whole GPUs (--gpus-per-node N)")
    return out


def render_pod(pod: ServicePod, options: KubernetesOptions) -> dict[str, Any]:
    """The Pod manifest. Pure."""
    if not options.image:
        raise UserError(f"a {pod.kind} pod needs a container image: add --image (e.g. --image quay.io/jupyter/pytorch-notebook)")
    volumes, mounts = pod_volumes(options)
    env = [{"name": k, "value": v} for k, v in pod.env]
    env += [{"name": var, "valueFrom": {"secretKeyRef": {"name": pod.name, "key": key}}} for var, key in pod.secret_env]
    requests = resources_of(pod.resources)
    container: dict[str, Any] = {
        "name": pod.kind,
        "image": options.image,
        "command": list(pod.command),
        "ports": [{"name": "http", "containerPort": pod.port}],
        "resources": {"requests": requests, "limits": requests},
    }
    if pod.ready_path is not None:
        container["readinessProbe"] = {"httpGet": {"path": pod.ready_path, "port": "http"}, "periodSeconds": 2}
    if env:
        container["env"] = env
    if mounts:
        container["volumeMounts"] = mounts
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if volumes:
        spec["volumes"] = volumes
    if pod.time is not None:
        spec["activeDeadlineSeconds"] = parse_time_limit(pod.time)
    spec.update(pod_placement(options))
    labels = {**MANAGED_BY, **options.label_map, SERVICE_LABEL: pod.kind, NAME_LABEL: pod.name}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod.name, "namespace": options.namespace, "labels": labels}, "spec": spec}


def render_secret(pod: ServicePod, options: KubernetesOptions, data: dict[str, str]) -> dict[str, Any]:
    labels = {**MANAGED_BY, SERVICE_LABEL: pod.kind, NAME_LABEL: pod.name}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": pod.name, "namespace": options.namespace, "labels": labels}, "stringData": data}


def port_forward_command(namespace: str, pod_name: str, local_port: int, port: int, context: str | None = None) -> str:
    """The `kubectl port-forward` that reaches the pod, with the kubeconfig context it was created through."""
    return kubectl(context, "port-forward", "-n", namespace, f"pod/{pod_name}", f"{local_port}:{port}")


def create(core: Any, pod: dict[str, Any], secret: dict[str, Any] | None = None) -> None:
    """Create the Secret (if any), then the Pod. A name in use is a clear error and changes nothing; a Secret whose
    Pod could not be created is removed again."""
    from kubernetes.client.rest import ApiException

    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    in_use = UserError(f"{name} already exists in namespace {namespace}: stop it first, or choose another name")
    if secret is not None:
        try:
            core.create_namespaced_secret(namespace, secret)
        except ApiException as err:
            if err.status == 409:
                raise in_use from None
            raise UserError(f"creating secret {name} in namespace {namespace}: the API server answered {err.status} {err.reason}") from None
    try:
        core.create_namespaced_pod(namespace, pod)
    except ApiException as err:
        if secret is not None:
            _delete_quietly(core.delete_namespaced_secret, name, namespace)
        if err.status == 409:
            raise in_use from None
        raise UserError(f"creating pod {name} in namespace {namespace}: the API server answered {err.status} {err.reason}") from None


def delete(core: Any, namespace: str, name: str) -> bool:
    """Delete the pod and its secret; False when neither existed."""
    found = _delete_quietly(core.delete_namespaced_pod, name, namespace)
    return _delete_quietly(core.delete_namespaced_secret, name, namespace) or found


def find(core: Any, namespace: str, name: str) -> Any | None:
    """The service pod (dev, tensorboard) of that name, or None when there is none (or the pod is not hpctrain's)."""
    from kubernetes.client.rest import ApiException

    try:
        pod = core.read_namespaced_pod(name, namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise UserError(f"reading pod {name} in namespace {namespace}: the API server answered {err.status} {err.reason}") from None
    return pod if SERVICE_LABEL in (pod.metadata.labels or {}) else None


def pod_state(pod: Any) -> str:
    """Pending, Running, Succeeded, Failed; a pod being deleted is Terminating."""
    if pod.metadata.deletion_timestamp is not None:
        return "Terminating"
    return (pod.status.phase if pod.status else None) or "Pending"


def pod_ready(pod: Any) -> bool:
    """The pod's Ready condition (its readiness probe passed)."""
    conditions = (pod.status.conditions if pod.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def _delete_quietly(delete_fn: Any, name: str, namespace: str) -> bool:
    from kubernetes.client.rest import ApiException

    try:
        delete_fn(name, namespace)
        return True
    except ApiException as err:
        if err.status == 404:
            return False
        raise UserError(f"deleting {name} in namespace {namespace}: the API server answered {err.status} {err.reason}") from None
