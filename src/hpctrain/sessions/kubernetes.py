"""A dev session as a pod (JupyterLab): render the Pod (pure; its token comes from the Secret of the same name),
create both and wait until JupyterLab is ready, show the pod's state and age, delete both."""

from __future__ import annotations

import datetime as dt
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.schedulers.kubernetes.kubeconfig import kubectl
from hpctrain.schedulers.kubernetes.options import KubernetesOptions
from hpctrain.services import kubernetes as k8s
from hpctrain.services.common import write_private
from hpctrain.sessions import jupyter
from hpctrain.sessions.config import CONNECTION_FILE, TOKEN_FILE, DevConfig, SessionView, forget, make_session_dir, now


def service_pod(cfg: DevConfig) -> k8s.ServicePod:
    if cfg.service != "jupyter":
        raise UserError(f"--service {cfg.service} runs on Slurm only: on Kubernetes use --service jupyter, or "
                        "`kubectl exec -it POD -- bash` in a pod of yours")
    if cfg.environment.kind != "none":
        raise UserError("--conda-env/--venv/--module apply to Slurm: on Kubernetes the --image is the environment")
    port = cfg.port or jupyter.POD_PORT
    # The command of Slurm sessions: --allow-root where the image runs as root (many PyTorch images do).
    # /api answers without the token: the kubelet's readiness probe needs none.
    return k8s.ServicePod(name=cfg.job_name, kind="dev", command=jupyter.COMMAND, port=port, resources=cfg.resources,
                          time=cfg.time, secret_env=(("JUPYTER_TOKEN", "token"),), env=(("HPCTRAIN_PORT", str(port)),),
                          ready_path="/api")


def render_dev_pod(cfg: DevConfig, options: KubernetesOptions) -> dict[str, Any]:
    """The session's Pod manifest (its token comes from the Secret of the same name). Pure."""
    return k8s.render_pod(service_pod(cfg), options)


def start(cfg: DevConfig, options: KubernetesOptions, core: Any, root: Path | None, wait_s: float,
          local_port: int | None, say: Callable[[str], None] = print, context: str | None = None,
          stop: str | None = None) -> dict[str, Any]:
    """Create the session's Secret and Pod, wait until JupyterLab is ready (up to wait_s; 0: do not wait), record
    and return its connection details: with the kubeconfig `context` it was created through and `stop`, the
    `hpctrain dev stop` command with every flag that found the cluster (the caller's)."""
    stop = stop or f"hpctrain dev stop {cfg.name} --scheduler kubernetes --namespace {options.namespace}"
    state_dir = make_session_dir(cfg.name, root)
    spec = service_pod(cfg)
    pod = k8s.render_pod(spec, options)
    token = secrets.token_urlsafe(32)
    k8s.create(core, pod, k8s.render_secret(spec, options, {"token": token}))
    write_private(state_dir / TOKEN_FILE, token + "\n")
    local = local_port or spec.port
    conn: dict[str, Any] = {
        "name": cfg.name, "scheduler": "kubernetes", "service": cfg.service, "namespace": options.namespace,
        "pod": spec.name, "created": now(), "local_port": local, "context": context, "stop": stop,
        "port_forward": k8s.port_forward_command(options.namespace, spec.name, local, spec.port, context),
        "url": jupyter.url(local, token),
    }
    write_private(state_dir / CONNECTION_FILE, conn)
    say(f"dev session {cfg.name}: pod {spec.name} created in namespace {options.namespace}; waiting until JupyterLab "
        f"is ready (up to {wait_s:g} s)")
    deadline = time.monotonic() + wait_s
    while wait_s > 0:
        live = core.read_namespaced_pod(spec.name, options.namespace)
        state = k8s.pod_state(live)
        if state == "Running" and k8s.pod_ready(live):
            conn["pod_ip"] = live.status.pod_ip
            write_private(state_dir / CONNECTION_FILE, conn)
            break
        if state in ("Succeeded", "Failed", "Terminating"):
            logs = kubectl(context, "logs", "-n", options.namespace, spec.name)
            raise UserError(f"pod {spec.name} is {state} before JupyterLab was ready: see `{logs}`; forget it with "
                            f"`{stop}`")
        if time.monotonic() >= deadline:
            describe = kubectl(context, "describe", "pod", "-n", options.namespace, spec.name)
            raise UserError(f"pod {spec.name} is {state} and not ready after {wait_s:g} s; it is left in place: wait "
                            f"longer with --wait, see `{describe}`, or stop "
                            f"it with `{stop}`")
        time.sleep(1.0)
    return conn


def instructions(cfg: DevConfig, conn: dict[str, Any]) -> list[str]:
    """How to reach the session, as `dev start` prints it."""
    return ["\nOn your machine, forward the port (keep it running):", f"  {conn['port_forward']}",
            f"then open:\n  {conn['url']}", f"Stop it when done: {conn['stop']}"]


def view(state_dir: Path, conn: dict[str, Any], core: Any) -> SessionView:
    """The session's row in `dev list`: the pod's state and age."""
    from kubernetes.client.rest import ApiException

    try:
        pod = core.read_namespaced_pod(conn["pod"], conn["namespace"])
        state = k8s.pod_state(pod).upper()
        created = pod.metadata.creation_timestamp
        age = int((dt.datetime.now(dt.timezone.utc) - created).total_seconds()) if created else None
    except ApiException as err:
        state, age = ("GONE" if err.status == 404 else f"UNKNOWN ({err.status})"), None
    where = f"{conn.get('namespace')}/{conn.get('pod')}"
    return SessionView(str(conn.get("name", state_dir.name)), "kubernetes", where, state, age, None, None, conn,
                       ended=state in ("GONE", "SUCCEEDED", "FAILED"))  # a pod's phases, upper-cased


def stop(state_dir: Path, conn: dict[str, Any], core: Any) -> str:
    """Delete the pod and its secret and forget the session's token; returns what happened."""
    found = k8s.delete(core, conn["namespace"], conn["pod"])
    forget(state_dir)
    return f"pod {conn['namespace']}/{conn['pod']} deleted" if found else f"pod {conn['pod']} was already gone"
