"""A real pod on the local cluster's real node (scripts/local-k8s.sh with HPCTRAIN_K8S_NODES=1): the scheduler
places it, the kubelet starts it in containerd from the local training image (the host's Python, torch and
hpctrain mounted read-only), its log comes back through the API server, exec reaches it, and
`kubectl port-forward` reaches a port it serves.

The cluster is the one of HPCTRAIN_K8S_NODE_DIR and HPCTRAIN_K8S_NODE_CONTEXT when set (scripts/test.sh starts it:
a second cluster with the node, beside the one the stand-in tests use); then a node that is not Ready fails the
test. Without them (a developer's plain `up`, which has no node) the tests skip, with the reason, unless
`scripts/local-k8s.sh status` of HPCTRAIN_K8S_DIR reports a Ready node and names the training image.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import urllib.request
import uuid
from typing import Any, Iterator

import pytest

from k8s_fixtures import SCRIPT

NODE_DIR = os.environ.get("HPCTRAIN_K8S_NODE_DIR")  # the state dir of the cluster with the node, if not the default one
CONTEXT = os.environ.get("HPCTRAIN_K8S_NODE_CONTEXT") or os.environ.get("HPCTRAIN_K8S_CONTEXT", "hpctrain-local")
NAMESPACE = "default"
PORT = 8000
DEADLINE_S = 180  # a bound on waiting on a loaded 2-core machine, never asserted on


def node_status() -> tuple[set[str], str]:
    """(Ready node names, training image) from `local-k8s.sh status`; skips the test without a Ready node."""
    env = dict(os.environ, HPCTRAIN_K8S_DIR=NODE_DIR) if NODE_DIR else None
    status = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True, check=False, env=env)
    out = status.stdout + status.stderr
    nodes = set(re.findall(r"^local-k8s: node (\S+): Ready$", out, re.M))
    image = re.search(r"^local-k8s: training image: (\S+)$", out, re.M)
    if status.returncode != 0 or not nodes or not image:
        said = [line for line in out.splitlines() if "node" in line or "training image" in line]
        said = said or out.strip().splitlines()[:1] or ["no node parts: the cluster was started without them"]
        if NODE_DIR:  # the cluster was started to have the node (scripts/test.sh): its absence is a failure
            pytest.fail(
                f"the cluster of HPCTRAIN_K8S_NODE_DIR={NODE_DIR} has no Ready node (status said: {' / '.join(said)})"
            )
        pytest.skip(
            "no Ready real node: start one with `HPCTRAIN_K8S_NODES=1 scripts/local-k8s.sh up` "
            f"(status said: {' / '.join(said)})"
        )
    return nodes, image.group(1)


@pytest.fixture(scope="module")
def core() -> Any:
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(context=CONTEXT))


def wait_until(what: str, check: Any) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(1)
    pytest.fail(f"{what} not within {DEADLINE_S} s")


@pytest.fixture
def smoke_pod(core: Any) -> Iterator[str]:
    """A running pod of the training image that printed torch's version and serves HTTP on PORT (it says
    `serving` once it listens); deleted afterwards."""
    nodes, image = node_status()
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    script = (
        "import torch, hpctrain, http.server as h; print('imported torch', torch.__version__, flush=True); "
        f"s = h.HTTPServer(('', {PORT}), h.SimpleHTTPRequestHandler); print('serving', flush=True); "
        "s.serve_forever()"
    )
    core.create_namespaced_pod(
        NAMESPACE,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {"name": "main", "image": image, "imagePullPolicy": "Never", "command": ["python", "-c", script]}
                ],
            },
        },
    )
    try:
        pod = wait_until(f"pod {name} running", lambda: running(core, name))
        assert pod.spec.node_name in nodes
        yield name
    finally:
        core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)


def running(core: Any, name: str) -> Any:
    pod = core.read_namespaced_pod(name, NAMESPACE)
    if pod.status.phase in ("Failed", "Succeeded"):
        pytest.fail(f"pod {name} ended: {pod.status}")
    return pod if pod.status.phase == "Running" else None


@pytest.mark.k8s
def test_pod_runs_logs_and_exec(core: Any, smoke_pod: str) -> None:
    from kubernetes.stream import stream

    name = smoke_pod
    log = wait_until(
        "the pod's log", lambda: "imported torch" in (text := core.read_namespaced_pod_log(name, NAMESPACE)) and text
    )
    assert re.search(r"imported torch \d+\.\d+", log)
    out = stream(
        core.connect_get_namespaced_pod_exec,
        name,
        NAMESPACE,
        command=["python", "-c", "print(6 * 7)"],
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
    )
    assert out.strip() == "42"


@pytest.mark.k8s
def test_port_forward_reaches_the_pod(core: Any, smoke_pod: str) -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    name = smoke_pod
    # kubectl port-forward gives up on its first refused connection: forward only once the pod listens.
    wait_until("the pod's server", lambda: "serving" in core.read_namespaced_pod_log(name, NAMESPACE))
    forward = subprocess.Popen(
        ["kubectl", "--context", CONTEXT, "port-forward", f"pod/{name}", f":{PORT}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()
        local = re.search(r"Forwarding from 127\.0\.0\.1:(\d+)", line)
        assert local, f"kubectl port-forward said {line!r}"
        with urllib.request.urlopen(f"http://127.0.0.1:{local.group(1)}/", timeout=30) as response:
            assert response.status == 200
    finally:
        forward.terminate()
        forward.wait(timeout=30)


def test_the_kubelet_never_collects_the_local_images() -> None:
    """The local images cannot be pulled again: a kubelet with image garbage collection on (at 85% of a disk other
    files fill) once removed the pause and training images between two CI runs. The live configuration, from the
    kubelet itself (its /configz through the API server's node proxy)."""
    import json

    nodes, _ = node_status()
    for node in nodes:
        raw = subprocess.run(
            ["kubectl", "--context", CONTEXT, "get", "--raw", f"/api/v1/nodes/{node}/proxy/configz"],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
        config = json.loads(raw)["kubeletconfig"]
        assert config["imageGCHighThresholdPercent"] == 100, config
