"""Single pods through the API server: create, find and delete a service pod (a dev session, a cluster
TensorBoard) with its Secret, read its state; and run a probe in a job's pods through the exec stream (what
`kubectl exec` does) for `top` and `debug stacks`. The Kubernetes client is imported on first use only."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from hpctrain.errors import UserError
from hpctrain import program_text
from hpctrain.health.stacks import ANSWER_PREFIX, REQUEST_FILE, STACKS_DIR
from hpctrain.servers.top import PROBE, PROGRESS_PROBE, NodeSample, parse_probe

SERVICE_LABEL = "hpctrain.io/service"
"""Label on every service pod: its kind (dev, tensorboard)."""
PROBE_TIMEOUT_S = 60
"""How long the probe may take in one pod."""
EXEC_PARALLEL = 16
"""Pods probed at a time (`top` of a 1,000-pod job: one exec after another took 1,000 round trips)."""


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
            raise UserError(
                f"creating secret {name} in namespace {namespace}: the API server answered {err.status} {err.reason}"
            ) from None
    try:
        core.create_namespaced_pod(namespace, pod)
    except ApiException as err:
        if secret is not None:
            _delete_quietly(core.delete_namespaced_secret, name, namespace)
        if err.status == 409:
            raise in_use from None
        raise UserError(
            f"creating pod {name} in namespace {namespace}: the API server answered {err.status} {err.reason}"
        ) from None


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
        raise UserError(
            f"reading pod {name} in namespace {namespace}: the API server answered {err.status} {err.reason}"
        ) from None
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
        raise UserError(
            f"deleting {name} in namespace {namespace}: the API server answered {err.status} {err.reason}"
        ) from None


# ---- top and debug stacks: a probe in each pod, through the exec stream -------------------------------------------


def sample_pods(raw: Any, pods: Iterable[dict[str, Any]], container: str | None = None) -> list[NodeSample]:
    """The probe in each running pod (its JSON) through the API server's exec stream (what `kubectl exec` does), in
    `container` (None: the training container hpctrain renders, or the pod's only one), through `raw` (rest.RawApi).
    Up to EXEC_PARALLEL pods at a time, each exec a websocket of its own; the samples come back in the pods' order,
    and the first pod's failure is the one reported."""
    from concurrent.futures import ThreadPoolExecutor

    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    if not running:
        return []

    def probe_one(first: bool, pod: dict[str, Any]) -> list[NodeSample]:
        name, namespace = pod["metadata"]["name"], pod["metadata"].get("namespace")
        probe = f"{PROBE}; {PROGRESS_PROBE}" if first else PROBE  # the first pod also reads the ranks' records
        stdout, status = exec_probe(raw, namespace, name, container or training_container(pod), probe)
        samples = parse_probe(stdout, labelled=False)
        if not samples:
            raise UserError(
                f"the probe failed in pod {name}: {exec_failure(status) or 'it printed nothing'}. "
                "`hpctrain top` runs `sh -c` with getconf, cat and nvidia-smi in the pod's training "
                f"container: its image needs a POSIX shell (try `kubectl exec -n {namespace} {name} -- sh -c true`)"
            )
        for sample in samples:
            sample.node = f"{(pod.get('spec') or {}).get('nodeName') or '?'} ({name})"
        return samples

    with ThreadPoolExecutor(max_workers=min(EXEC_PARALLEL, len(running))) as pool:
        per_pod = list(pool.map(probe_one, [i == 0 for i in range(len(running))], running))
    return [sample for samples in per_pod for sample in samples]


def stacks_request(world_size: int, wait_s: float) -> str:
    """Shell run in a pod: ask every rank for its stacks (a fresh token in RUN/stacks/request, written and renamed
    as `request_stacks` does; a linked stacks/ is refused), wait until `world_size` answers name the token or
    `wait_s` passed, then print each answer after a line `@stacks rank-N.txt`. No file times are compared. The
    program is programs/stacks_request.sh (linted as one), less its comments."""
    return program_text.without_comments(
        program_text.fill(
            __package__,
            "stacks_request.sh",
            WORLD_SIZE=world_size,
            WAIT_S=max(1, int(wait_s)),
            ANSWER_PREFIX=ANSWER_PREFIX,
            STACKS_DIR=STACKS_DIR,
            REQUEST_FILE=REQUEST_FILE,
        )
    )


def parse_stacks(text: str) -> dict[int, str]:
    """`@stacks rank-N.txt` lines, each followed by that rank's answer -> {N: answer}."""
    answers: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = re.fullmatch(r"@stacks rank-(\d+)\.txt", line)
        if match:
            current = answers.setdefault(int(match.group(1)), [])
        elif current is not None:
            current.append(line)
    return {rank: "\n".join(lines).rstrip("\n") + "\n" for rank, lines in answers.items()}


def training_container(pod: dict[str, Any]) -> str | None:
    """The container hpctrain's jobs train in (Kubeflow v1's `pytorch`, Trainer v2's `node`), so that sidecars
    (a service mesh's proxy, a log shipper) do not make exec ask which one; None leaves the choice to the API server."""
    from hpctrain.schedulers.kubernetes.manifests.render import CONTAINER_PYTORCHJOB, CONTAINER_TRAINJOB

    names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    return next((n for n in (CONTAINER_PYTORCHJOB, CONTAINER_TRAINJOB) if n in names), None)


def exec_probe(raw: Any, namespace: str, pod: str, container: str | None, probe: str) -> tuple[str, str]:
    """Run `probe` in the pod through `raw` (rest.RawApi); its stdout and the final Status JSON of the exec stream
    (channel 3)."""
    from kubernetes.stream.ws_client import ERROR_CHANNEL

    query = [("command", ["sh", "-c", probe]), ("stderr", "true"), ("stdin", "false"), ("stdout", "true")]
    query += [("tty", "false"), *([("container", container)] if container else [])]
    try:
        ws = raw.exec_stream(namespace, pod, query)
        try:
            ws.run_forever(timeout=PROBE_TIMEOUT_S)
            if ws.is_open():
                raise UserError(
                    f"the probe in pod {pod} did not finish within {PROBE_TIMEOUT_S} s (nvidia-smi can "
                    f"hang on a failing GPU): try `kubectl exec -n {namespace} {pod} -- nvidia-smi`"
                )
            return ws.read_stdout(), ws.read_channel(ERROR_CHANNEL)
        finally:
            ws.close()
    except UserError:
        raise
    except Exception as err:  # the client raises ApiException or websocket/socket errors here
        raise UserError(exec_failed_message(namespace, pod, err)) from None


def exec_failure(status: str) -> str | None:
    """The reason in the Status that ends an exec stream (remote command protocol v4: `{"status": "Success"}`, or
    Failure with a message and, for a non-zero exit, an ExitCode cause); None on success or when absent."""
    try:
        parsed = json.loads(status) if status.strip() else {}
    except ValueError:
        return " ".join(status.split())[:300] or None
    if not isinstance(parsed, dict) or parsed.get("status", "Success") == "Success":
        return None
    return " ".join(str(parsed.get("message") or parsed.get("reason") or "exec failed").split())[:300]


def exec_failed_message(namespace: str, pod: str, err: BaseException) -> str:
    """What to tell the user when exec into a pod fails (no kubelet answering, no pods/exec permission, ...)."""
    status = getattr(err, "status", None)
    detail = " ".join(
        str(getattr(err, "reason", None) or getattr(err, "body", None) or err or type(err).__name__).split()
    )
    # A failed websocket handshake carries the API server's Status object: its message says why.
    found = re.search(r'\{"kind":\s*"Status".*\}', detail)
    if found:
        try:
            detail = str(json.loads(found.group(0)).get("message") or detail)
        except ValueError:
            pass
    if status == 403:
        detail = f"forbidden: your account may not use pods/exec in namespace {namespace} ({detail})"
    return (
        f"cannot run the probe in pod {pod} through the API server's exec (what `kubectl exec` does): "
        f"{detail[:300] or type(err).__name__}. `hpctrain top` needs exec on Kubernetes: check that "
        f"`kubectl exec -n {namespace} {pod} -- true` works (the node's kubelet must answer, and you need the "
        "pods/exec permission)"
    )
