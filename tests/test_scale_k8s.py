"""Growth of `hpctrain cluster`, `check` and `status` on a big Kubernetes cluster, pinned by counting the requests
they make to the real local API server (scripts/local-k8s.sh) and the page size of each, not by timing.

Every list goes out `limit` objects at a time (PAGE_SIZE, made 2 here so that a few objects make several pages)
and the pod list asks the server for only the pods bound to a node and not ended. A 10,000-node cluster then costs
N / PAGE_SIZE requests of bounded size instead of one answer that outgrows the client's cap
(benchmarks/scale_k8s_views.py measures the time).

What stays constant is pinned too: a fresh `cluster`, `status`, `top` or `check` process reads the API server's JSON
through the client's ApiClient and never imports a generated API class or model (CoreV1Api's module alone cost each
command about 0.6 CPU s; rest.py).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
from hpctrain.schedulers.kubernetes.scheduler import KubernetesScheduler
from k8s_fixtures import LocalK8s
from kubeflow_standin import create_namespace, delete_namespace
from hpctrain.schedulers.kubernetes.api import client as k8s_client

pytestmark = pytest.mark.k8s
LABEL = "hpctrain-test-node"
IMAGE = "example.invalid/pytorch:latest"


class Recording:
    """The ApiClient's pool manager, keeping (path, query) of every GET it sends."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self.gets: list[tuple[str, dict[str, list[str]]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method == "GET":
            parts = urlsplit(url)
            self.gets.append((parts.path, parse_qs(parts.query, keep_blank_values=True)))
        return self._pool.request(method, url, *args, **kwargs)

    def lists_of(self, path: str) -> list[dict[str, list[str]]]:
        return [query for p, query in self.gets if p == path]


@pytest.fixture
def small_cluster(k8s_cluster: LocalK8s):
    """Five nodes of the test's own label (unschedulable and tainted: nothing else lands there), a pod bound to
    each, and one pod bound to none, in a namespace of its own; all removed afterwards."""
    from kubernetes import client

    api = k8s_cluster.api_client()
    namespace = create_namespace(api)
    core = client.CoreV1Api(api)
    nodes = [f"{namespace}-page-{i}" for i in range(5)]
    try:
        for name in nodes:
            core.create_node(
                {
                    "metadata": {"name": name, "labels": {LABEL: namespace}},
                    "spec": {"unschedulable": True, "taints": [{"key": "hpctrain-test", "effect": "NoSchedule"}]},
                }
            )
            alloc = {"cpu": "8", "memory": "32Gi", "pods": "110"}
            core.patch_node_status(name, {"status": {"capacity": alloc, "allocatable": alloc}})
        for i, node in enumerate([*nodes, None]):
            spec: dict[str, Any] = {
                "containers": [{"name": "c", "image": IMAGE, "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]
            }
            if node:
                spec["nodeName"] = node
            core.create_namespaced_pod(namespace, {"metadata": {"name": f"filler-{i}"}, "spec": spec})
        yield api, namespace, nodes
    finally:
        delete_namespace(api, namespace)
        for name in nodes:
            try:
                core.delete_node(name)
            except client.ApiException:
                pass


def test_cluster_and_check_list_a_page_at_a_time(small_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    api, namespace, nodes = small_cluster
    monkeypatch.setattr(k8s_client, "PAGE_SIZE", 2)
    recording = Recording(api.rest_client.pool_manager)
    monkeypatch.setattr(api.rest_client, "pool_manager", recording)
    sched = KubernetesScheduler(
        KubernetesOptions(namespace=namespace, image=IMAGE, node_selector=(f"{LABEL}={namespace}",)), api_client=api
    )

    view = sched.cluster()
    node_lists, pod_lists = recording.lists_of("/api/v1/nodes"), recording.lists_of("/api/v1/pods")
    assert len(node_lists) == math.ceil(len(view.nodes) / 2) >= 3  # the pages of one consistent list
    assert all(q["limit"] == ["2"] for q in node_lists + pod_lists)
    assert [("continue" in q) for q in node_lists] == [False] + [True] * (len(node_lists) - 1)
    assert len(pod_lists) >= 3  # the 5 bound pods at least, 2 a page
    assert all(
        q["fieldSelector"] == ["spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"] for q in pod_lists
    )
    mine = [n for n in view.nodes if n.name in nodes]
    assert [(n.cpu_requested, n.cpu_allocatable) for n in mine] == [(1.0, 8.0)] * 5

    recording.gets.clear()
    job = JobSpec(
        command=("hpctrain", "train", "mnist"),
        name="mnist",
        resources=Resources(nodes=1, cpus_per_task=2, mem_bytes=2 << 30),
    )
    problems = sched.check(job)
    assert any("no schedulable node" in p for p in problems)  # its nodes are cordoned
    node_lists = recording.lists_of("/api/v1/nodes")
    assert len(node_lists) >= 3 and all(q["limit"] == ["2"] for q in node_lists)
    assert recording.lists_of("/api/v1/pods") == []  # no node could take the pod: its running pods are not read

    recording.gets.clear()
    assert sched.list_jobs() == []  # `hpctrain status`: the namespace's PyTorchJobs, a page at a time too
    job_lists = [q for p, q in recording.gets if p.endswith("/pytorchjobs")]
    assert job_lists and all(q["limit"] == ["2"] for q in job_lists)

    job_id = sched.submit(job, sched.render(job))  # the object only: no controller makes its pods here
    recording.gets.clear()
    assert sched.status(job_id).state == "PENDING"  # `hpctrain status JOB`: its pods and the warnings, paged
    pod_lists = recording.lists_of(f"/api/v1/namespaces/{namespace}/pods")
    event_lists = recording.lists_of(f"/api/v1/namespaces/{namespace}/events")
    assert pod_lists and all(q["limit"] == ["2"] and "labelSelector" in q for q in pod_lists)
    assert event_lists and all(q["limit"] == ["2"] and q["fieldSelector"] == ["type=Warning"] for q in event_lists)


class Pages:
    """Every page RawApi.pages yields, held weakly: how many pages of a list are alive at once tells whether its
    reader keeps them (a list of every pod) or sums each and lets it go (counted, not timed)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import weakref

        from hpctrain.schedulers.kubernetes.api.rest import RawApi

        class Page(list):  # a list that can be referred to weakly
            pass

        self.alive = 0
        self.most_alive = 0
        original = RawApi.pages

        def gone() -> None:
            self.alive -= 1

        def pages(raw: RawApi, where: str, what: str, **query: Any) -> Any:
            for items in original(raw, where, what, **query):
                page = Page(items)
                del items
                weakref.finalize(page, gone)
                self.alive += 1
                self.most_alive = max(self.most_alive, self.alive)
                yield page
                del page

        monkeypatch.setattr(RawApi, "pages", pages)


FULL = "hpctrain-test-full"


@pytest.fixture
def full_cluster(k8s_cluster: LocalK8s):
    """PROBED_NODES + 2 schedulable nodes that only a pod tolerating the taint FULL may use (so that nothing else
    here considers them), each full: a pod bound to it requests all its CPU."""
    from kubernetes import client

    from hpctrain.schedulers.kubernetes.checks.live import PROBED_NODES

    api = k8s_cluster.api_client()
    namespace = create_namespace(api)
    core = client.CoreV1Api(api)
    nodes = [f"{namespace}-full-{i}" for i in range(PROBED_NODES + 2)]
    try:
        for i, name in enumerate(nodes):
            core.create_node(
                {
                    "metadata": {"name": name, "labels": {LABEL: namespace}},
                    "spec": {"taints": [{"key": FULL, "effect": "NoSchedule"}]},
                }
            )
            alloc = {"cpu": str(8 + i), "memory": "32Gi", "pods": "110"}
            core.patch_node_status(name, {"status": {"capacity": alloc, "allocatable": alloc}})
            requests = {"cpu": str(8 + i), "memory": "1Gi"}
            spec = {
                "nodeName": name,
                "containers": [{"name": "c", "image": IMAGE, "resources": {"requests": requests}}],
            }
            core.create_namespaced_pod(namespace, {"metadata": {"name": f"filler-{i}"}, "spec": spec})
        yield api, namespace, nodes
    finally:
        delete_namespace(api, namespace)
        for name in nodes:
            try:
                core.delete_node(name)
            except client.ApiException:
                pass


def test_check_of_a_full_cluster_probes_a_few_nodes_then_sums_every_pod_a_page_at_a_time(
    full_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No node has room: the check asks PROBED_NODES nodes for their pods (from the server's cache), then reads
    every running pod to be exact, a page at a time, keeping none (issue 39: 480 MB and 51 s at 10,000 nodes, each
    node's pod list an etcd scan of every pod and every running pod kept); `cluster` keeps none either."""
    from hpctrain.schedulers.kubernetes.checks.live import PROBED_NODES

    api, namespace, nodes = full_cluster
    monkeypatch.setattr(k8s_client, "PAGE_SIZE", 2)
    recording = Recording(api.rest_client.pool_manager)
    monkeypatch.setattr(api.rest_client, "pool_manager", recording)
    pages = Pages(monkeypatch)
    sched = KubernetesScheduler(
        KubernetesOptions(
            namespace=namespace,
            image=IMAGE,
            node_selector=(f"{LABEL}={namespace}",),
            # The API server's admission (TaintNodesByCondition) taints a new node not-ready: no kubelet here.
            tolerations=(f"{FULL}:NoSchedule", "node.kubernetes.io/not-ready:NoSchedule"),
        ),
        api_client=api,
    )
    job = JobSpec(command=("python", "train.py"), name="full", resources=Resources(nodes=1, cpus_per_task=1))
    problems = sched._node_problems(job)
    assert len(problems) == 1 and "no node has room for one worker pod (cpu 1) now" in problems[0], problems
    assert "has cpu 0, " in problems[0], problems
    pod_lists = recording.lists_of("/api/v1/pods")
    one_node = [q for q in pod_lists if q["fieldSelector"][0].startswith("spec.nodeName=")]
    every = [q for q in pod_lists if q["fieldSelector"][0].startswith("spec.nodeName!=")]
    largest = sorted(nodes, key=lambda n: int(n.rsplit("-", 1)[1]), reverse=True)[:PROBED_NODES]
    assert [q["fieldSelector"][0].split(",")[0] for q in one_node] == [f"spec.nodeName={n}" for n in largest]
    assert all(q["resourceVersion"] == ["0"] for q in one_node)  # the server's cache: no etcd scan per node
    assert len(every) >= math.ceil(len(nodes) / 2) and all("resourceVersion" not in q for q in every)
    assert pages.most_alive <= 2, pages.most_alive  # a page summed and let go before the next (before: all of them)

    pages.most_alive = 0
    recording.gets.clear()
    view = sched.cluster()
    assert [n.cpu_requested for n in view.nodes if n.name in nodes] == [8.0 + i for i in range(len(nodes))]
    assert len(recording.lists_of("/api/v1/pods")) >= math.ceil(len(nodes) / 2)
    assert pages.most_alive <= 2, pages.most_alive


# A fresh process runs the CLI, then names the client's generated API and model modules it imported.
IMPORTS_PROBE = """
import json, runpy, sys
sys.argv = ["hpctrain", *sys.argv[1:]]
try:
    runpy.run_module("hpctrain", run_name="__main__")
except SystemExit:
    pass
generated = ("kubernetes.client.api.", "kubernetes.client.models.", "kubernetes.client.apis.")
print("@imported " + json.dumps(sorted(m for m in sys.modules if m.startswith(generated))))
"""


def test_the_views_and_checks_never_import_the_clients_generated_apis_or_models(small_cluster, tmp_path: Path) -> None:
    api, namespace, nodes = small_cluster
    if not hasattr(api, "param_serialize"):
        pytest.skip("the legacy client (kubernetes < 35) imports every API and model with its package")
    sched = KubernetesScheduler(KubernetesOptions(namespace=namespace, image=IMAGE), api_client=api)
    job = JobSpec(command=("python", "train.py"), name="probe", resources=Resources(nodes=2, cpus_per_task=1))
    job_id = sched.submit(job, sched.render(job))
    where = ("--scheduler", "kubernetes", "--context", LocalK8s.context, "--namespace", namespace)
    check = ("--nodes", "1000", "--gpus-per-node", "8", "--image", IMAGE, "--node-selector", f"{LABEL}={namespace}")
    commands = {
        "cluster": ("cluster", *where),
        "cluster --json": ("cluster", "--json", *where),
        "status": ("status", *where),
        "status JOB": ("status", job_id, *where),
        "top JOB": ("top", job_id, *where),
        "check": ("check", *where, *check, "--", "python", "train.py"),
    }
    (tmp_path / "train.py").write_text("pass\n")
    for name, argv in commands.items():
        proc = subprocess.run(
            [sys.executable, "-c", IMPORTS_PROBE, *argv], capture_output=True, text=True, cwd=tmp_path, env=os.environ
        )
        said = proc.stdout + proc.stderr
        assert "Traceback" not in said, said
        marker = next(line for line in proc.stdout.splitlines() if line.startswith("@imported "))
        assert json.loads(marker.removeprefix("@imported ")) == [], f"{name}: {said}"
        if name == "cluster":
            assert all(node in proc.stdout for node in nodes), said  # it did read the cluster
        if name == "status JOB":
            assert proc.stdout.startswith(f"{job_id}: PENDING"), said
