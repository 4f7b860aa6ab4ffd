"""What `hpctrain cluster`, `status`, `top`, `check` and `submit` cost on a big Kubernetes cluster, and how it grows.

The local API server (scripts/local-k8s.sh, context hpctrain-local; no kubelet needed) is filled with N Node objects
(8 GPUs, 96 CPUs each; tainted, so that only a pod that tolerates the harness's taint is placed there, and no other
test's check counts them) and 8 N Pods of 1 GPU bound to them by spec.nodeName, half of them ended (Succeeded), in a
namespace and with a node label of the harness's own; everything is deleted afterwards. `check` without the
toleration finds no node it may use (it reads no pod); with it, a pod of 8 GPUs finds every node half full (it
probes a few nodes, then sums every running pod: the slowest check) and a pod of 4 GPUs finds room on the first.
`status JOB` and `top JOB` ask about a PyTorchJob of the harness's own (no controller makes its pods here: `top`
ends saying it has no running pod), `submit` creates a 1,000 x 8-GPU PyTorchJob after its checks (the API server
stores it; no controller acts on it).
Each command then runs as a fresh `hpctrain` process; the figures are its CPU time (user +
system) and wall time (tests/test_scale_k8s.py counts the requests and their page sizes). --compare SRC runs
each command a second time with PYTHONPATH=SRC (another checkout's src/, e.g. the code before a change).

A 2-core machine creates about a few hundred objects a second, so the default sizes stop at 1,000 nodes and 8,000
pods; 10,000 nodes and 80,000 pods are extrapolated from the fitted growth (benchmarks/scale_views.py's fit).

    python benchmarks/scale_k8s_views.py                      # 250 / 500 / 1,000 nodes
    python benchmarks/scale_k8s_views.py --sizes 100,200 --context hpctrain-local
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from scale_views import fit, run_once

LABEL = "hpctrain-scale-bench"
IMAGE = "example.invalid/pytorch:latest"
PODS_PER_NODE = 8
JOB = {  # what `status JOB` and `top JOB` ask about
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "bench-job"},
    "spec": {
        "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": {"spec": {"containers": [{"name": "pytorch", "image": IMAGE}]}}}
        }
    },
}


def send(core: Any, method: str, where: str, body: dict[str, Any], content_type: str = "application/json") -> None:
    """One write to the API server, its answer read as bytes and dropped: building the client's models of every
    answer cost the harness more CPU than the server's own work (90,000 objects at 10,000 nodes)."""
    api = core.api_client
    request = api.param_serialize(
        method,
        where,
        body=body,
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*request)
    data = response.read()
    if not 200 <= response.status <= 299:
        raise RuntimeError(f"{method} {where}: HTTP {response.status}: {data[:300]!r}")


def fill(core: Any, namespace: str, tag: str, start: int, stop: int) -> list[str]:
    """Nodes start..stop-1 and their pods (half Running-bound, half Succeeded)."""
    names = [f"{tag}-{i:05d}" for i in range(start, stop)]
    alloc = {"cpu": "96", "memory": "2000Gi", "pods": "110", "nvidia.com/gpu": "8"}
    pods = f"/api/v1/namespaces/{namespace}/pods"

    def one(name: str) -> None:
        node = {
            "metadata": {"name": name, "labels": {LABEL: tag}},
            "spec": {"taints": [{"key": LABEL, "effect": "NoSchedule"}]},
            "status": {"capacity": alloc, "allocatable": alloc},
        }
        send(core, "POST", "/api/v1/nodes", node)
        for p in range(PODS_PER_NODE):
            req = {"cpu": "12", "memory": "100Gi", "nvidia.com/gpu": "1"}
            pod = f"{name}-p{p}"
            spec = {
                "nodeName": name,
                "containers": [{"name": "c", "image": IMAGE, "resources": {"requests": req, "limits": req}}],
            }
            send(core, "POST", pods, {"metadata": {"name": pod, "labels": {LABEL: tag}}, "spec": spec})
            if p % 2:
                body = {"status": {"phase": "Succeeded"}}
                send(core, "PATCH", f"{pods}/{pod}/status", body, "application/merge-patch+json")

    with ThreadPoolExecutor(8) as pool:  # the client's connection pool holds 5 a CPU
        list(pool.map(one, names))
    return names


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="250,500,1000")
    parser.add_argument("--context", default="hpctrain-local")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--compare", metavar="SRC", help="also run each command with PYTHONPATH=SRC")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    from kubernetes import client, config

    api = config.new_client_from_config(context=args.context)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    submitted = itertools.count()
    tag = f"scale-{uuid.uuid4().hex[:6]}"
    namespace = tag
    core.create_namespace({"metadata": {"name": namespace}})
    nodes: list[str] = []
    results: dict[str, list[float]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            (work / "train.py").write_text("print('hello')\n")
            base = ["--scheduler", "kubernetes", "--context", args.context, "--namespace", namespace]
            job = [
                "--nodes",
                "1000",
                "--nproc-per-node",
                "8",
                "--gpus-per-node",
                "8",
                "--image",
                IMAGE,
                "--node-selector",
                f"{LABEL}={tag}",
                "--",
                "python",
                "train.py",
            ]
            # The harness's taint, and the one the API server's admission (TaintNodesByCondition) puts on a new node.
            tolerate = [
                "--toleration",
                f"{LABEL}:NoSchedule",
                "--toleration",
                "node.kubernetes.io/not-ready:NoSchedule",
            ]
            custom.create_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", JOB)
            commands = {
                "cluster": ["cluster", *base],
                "cluster --json": ["cluster", "--json", *base],
                "status": ["status", *base],
                "status JOB": ["status", JOB["metadata"]["name"], *base],
                "top JOB": ["top", JOB["metadata"]["name"], *base],
                "check 1000x8 GPUs": ["check", *base, *job],
                "check 1000x8 GPUs, no room": ["check", *base, *tolerate, *job],
                "check 1000x4 GPUs, room": ["check", *base, *tolerate, *[("4" if a == "8" else a) for a in job]],
                "submit 1000x8 GPUs": ["submit", *base, "--job-name", "{name}", *job],
            }
            envs = {"": {**os.environ}}
            if args.compare:
                envs[" (compare)"] = {**os.environ, "PYTHONPATH": args.compare}
            for n in sizes:
                nodes += fill(core, namespace, tag, len(nodes), n)
                for label, argv in commands.items():
                    for suffix, env in envs.items():
                        runs = []
                        for _ in range(args.repeat):  # each submit a job of its own name
                            name = f"bench-{next(submitted)}"
                            runs.append(run_once([a.replace("{name}", name) for a in argv], env, work))
                        cpu, wall = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
                        results.setdefault(label + suffix, []).append(cpu)
                        print(
                            f"N={n:6} pods={PODS_PER_NODE * n:6} {label + suffix:28} CPU {cpu:6.2f} s  wall "
                            f"{wall:6.2f} s  {runs[-1][2]:5.0f} MB  exit {runs[-1][3]}",
                            flush=True,
                        )
    finally:
        # This API server has no namespace controller: empty the namespace by hand, then let it go.
        custom.delete_collection_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs")
        # Each pod by its name, 8 at a time: one delete of 20,000 pods outlasted the API server's 34 s (HTTP 504),
        # and left them there.
        pods = f"/api/v1/namespaces/{namespace}/pods"
        with ThreadPoolExecutor(8) as pool:
            names = [f"{node}-p{p}" for node in nodes for p in range(PODS_PER_NODE)]
            list(pool.map(lambda pod: send(core, "DELETE", f"{pods}/{pod}", {"gracePeriodSeconds": 0}), names))
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        core.delete_collection_namespaced_event(namespace)
        core.delete_collection_node(label_selector=f"{LABEL}={tag}")
        core.delete_namespace(namespace)
        core.replace_namespace_finalize(namespace, {"metadata": {"name": namespace}, "spec": {"finalizers": []}})
    print("\nCPU seconds at each size, and the growth fitted to them (N nodes, 8 N pods):")
    for label, times in results.items():
        print(f"{label:28} " + " / ".join(f"{t:.2f}" for t in times) + f" s  -> {fit(sizes, times)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
