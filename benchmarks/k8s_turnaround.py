"""Kubernetes turnaround on the local API server, and what the Kubernetes client costs the CLI's start-up.

Figures (seconds, medians over --runs):
  submit -> exists        KubernetesScheduler.submit() until a GET of the object succeeds (warm client)
  cold submit -> exists   the same in a fresh interpreter, including importing the client and loading the
                          kubeconfig (what one `hpctrain submit` pays)
  cancel -> pods gone     cancel() until the job object and all its pods are gone: the garbage collector
                          deletes the pods, the real kubelet sends SIGTERM, the containers exit at once; the
                          pods come from the PyTorchJob controller's stand-in (tests/kubeflow_standin.py)
  import hpctrain.cli     `python -c "import hpctrain.cli"`: the CLI's start-up
  ... + kubernetes        the same plus `import kubernetes`: what start-up would cost if the client were not lazy
  hpctrain --help         the console entry point, end to end
A check that the lazy import holds: after `import hpctrain.cli, hpctrain.schedulers` and rendering a job for
Kubernetes no `kubernetes` module is loaded.

Needs the local cluster with a node (HPCTRAIN_K8S_DIR=/var/lib/hpctrain-k8s-node HPCTRAIN_K8S_CONTEXT=hpctrain-node
HPCTRAIN_K8S_NODES=1 scripts/local-k8s.sh up, as scripts/test.sh starts it; HPCTRAIN_K8S_NODE_DIR and
HPCTRAIN_K8S_NODE_CONTEXT name another) with nothing else running on it (a 2-pod job takes its 2 CPUs), and the k8s
extra (pip install -e '.[k8s]').

    python benchmarks/k8s_turnaround.py --runs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

CONTEXT = os.environ.get("HPCTRAIN_K8S_NODE_CONTEXT", "hpctrain-node")
NODE_DIR = os.environ.get("HPCTRAIN_K8S_NODE_DIR", "/var/lib/hpctrain-k8s-node")
SLEEPER = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\ntime.sleep(600)\n"


def median(values: list[float]) -> str:
    return f"{statistics.median(values):.3f}"


def python_time(code: str, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def training_image() -> str:
    """The node's training image, as `scripts/local-k8s.sh status` names it."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "local-k8s.sh"), "status"],
        capture_output=True,
        text=True,
        env=dict(os.environ, HPCTRAIN_K8S_DIR=NODE_DIR),
    ).stdout
    images = [line.rsplit(": ", 1)[1] for line in out.splitlines() if line.startswith("local-k8s: training image: ")]
    if not images:
        sys.exit(
            f"k8s_turnaround: no training image in {NODE_DIR}: start the cluster with a node first "
            f"(HPCTRAIN_K8S_DIR={NODE_DIR} HPCTRAIN_K8S_CONTEXT={CONTEXT} HPCTRAIN_K8S_NODES=1 "
            f"scripts/local-k8s.sh up)\n{out}"
        )
    return images[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    from hpctrain.jobs.spec import JobSpec, Resources
    from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
    from hpctrain.schedulers.kubernetes.scheduler import KubernetesScheduler
    from kubeflow_standin import KubeflowStandIn, create_namespace, delete_namespace

    image = training_image()
    api = config.new_client_from_config(context=CONTEXT)
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    namespace = create_namespace(api, prefix="hpct-bench")
    figures: dict[str, list[float]] = {"submit -> exists": [], "cold submit -> exists": [], "cancel -> pods gone": []}
    try:
        standin = KubeflowStandIn(api, namespace).start()
        try:
            sched = KubernetesScheduler(KubernetesOptions(namespace=namespace, image=image), api_client=api)
            for i in range(args.runs):
                job = JobSpec(
                    command=("python", "-c", SLEEPER),
                    name=f"bench-{i}",
                    signal_grace=30,
                    resources=Resources(nodes=2, mem_bytes=100 << 20),
                )
                rendered = sched.render(job)
                start = time.perf_counter()
                sched.submit(job, rendered)
                custom.get_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", job.name)
                figures["submit -> exists"].append(time.perf_counter() - start)
                while [r.phase for r in sched.status(job.name).replicas] != ["Running", "Running"]:
                    time.sleep(0.05)
                start = time.perf_counter()
                sched.cancel(job.name)
                while True:
                    pods = core.list_namespaced_pod(
                        namespace, label_selector=f"training.kubeflow.org/job-name={job.name}"
                    ).items
                    try:
                        custom.get_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", job.name)
                        gone = False
                    except ApiException as err:
                        gone = err.status == 404
                    if gone and not pods:
                        break
                    time.sleep(0.02)
                figures["cancel -> pods gone"].append(time.perf_counter() - start)
            cold = (
                "import sys, time; start = time.perf_counter()\n"
                "from hpctrain.schedulers import get_scheduler\n"
                "from hpctrain.jobs.spec import JobSpec\n"
                f"s = get_scheduler('kubernetes', context={CONTEXT!r}, namespace={namespace!r}, image={image!r})\n"
                "job = JobSpec(command=('true',), name=sys.argv[1])\n"
                "s.submit(job, s.render(job)); s.custom.get_namespaced_custom_object('kubeflow.org', 'v1', "
                f"{namespace!r}, 'pytorchjobs', sys.argv[1])\n"
                "print(time.perf_counter() - start)\n"
            )
            for i in range(args.runs):
                out = subprocess.run(
                    [sys.executable, "-c", cold, f"cold-{i}"], check=True, capture_output=True, text=True
                )
                figures["cold submit -> exists"].append(float(out.stdout.strip()))
        finally:
            standin.stop()
    finally:
        delete_namespace(api, namespace)

    figures["import hpctrain.cli"] = python_time("import hpctrain.cli", args.runs)
    figures["... + kubernetes"] = python_time("import hpctrain.cli, kubernetes.client", args.runs)
    hpctrain = Path(sys.executable).with_name("hpctrain")
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        subprocess.run([str(hpctrain), "--help"], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    figures["hpctrain --help"] = times
    lazy = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, hpctrain.cli\nfrom hpctrain.schedulers import get_scheduler\n"
            "from hpctrain.jobs.spec import JobSpec\n"
            "get_scheduler('kubernetes', image='x:1').render(JobSpec(command=('hpctrain',)))\n"
            "print(any(m == 'kubernetes' or m.startswith('kubernetes.') for m in sys.modules))",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()

    print(
        f"{'figure':<24} {'median s':>9}  (runs: {args.runs}, python {sys.version.split()[0]}, {os.cpu_count()} CPUs)"
    )
    for name, values in figures.items():
        print(f"{name:<24} {median(values):>9}")
    print(f"kubernetes imported by the CLI and a Kubernetes render: {lazy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
