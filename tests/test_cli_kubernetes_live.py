"""`hpctrain submit/check/status/logs/cancel/cluster --scheduler kubernetes` through the CLI, against the real local
API server (scripts/local-k8s.sh), named by its kubeconfig context so no other cluster is ever touched.

The pods are run by tests/kubeflow_standin.py, a test-only fake of the Kubeflow controller and the kubelet (none
can run here): each pod's command runs as a local process, so the "shared volume" is a directory of this machine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from k8s_fixtures import CONTEXT, DEADLINE_S, LocalK8s, hpctrain
from kubeflow_standin import KubeflowStandIn, create_namespace, delete_namespace, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.slow]
IMAGE = "example.invalid/hpctrain:test"
SLEEPER = "import os, time; print('hello from rank', os.environ['RANK'], flush=True); time.sleep(300)"





@pytest.fixture
def cluster(k8s_cluster: LocalK8s, tmp_path: Path):
    api = k8s_cluster.api_client()
    namespace = create_namespace(api, prefix="hpct-cli")
    standin = KubeflowStandIn(api, namespace, tmp_path / "standin", node_labels={"hpctrain-test-node": namespace}).start()
    yield namespace, standin
    standin.stop()
    delete_namespace(api, namespace)


def test_submit_status_logs_cancel_through_the_cli(cluster, tmp_path: Path) -> None:
    namespace, standin = cluster
    shared = tmp_path / "shared"
    shared.mkdir()
    where = ["--scheduler", "kubernetes", "--context", CONTEXT, "--namespace", namespace]
    job = [*where, "--image", IMAGE, "--node-selector", f"hpctrain-test-node={namespace}",
           "--volume", f"host:{shared}:{shared}", "--run-dir", f"{shared}/runs/%j", "--nodes", "2", "--mem", "1G",
           "--signal-grace", "5", "--job-name", "cli-live", "--", sys.executable, "-c", SLEEPER]

    checked = hpctrain("check", *job, cwd=tmp_path)
    assert checked.returncode == 0 and checked.stdout.startswith("ok: cli-live: PyTorchJob, 2 pod(s)"), checked

    submitted = hpctrain("submit", *job, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout == "cli-live\n"
    # The submission is recorded in the run dir, as the pods see it; job.yaml resubmits the same manifest.
    record = shared / "runs" / "cli-live"
    dry = hpctrain("submit", "--dry-run", "--job-file", str(record / "job.yaml"), cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout == (record / "pytorchjob.yaml").read_text()

    def status() -> dict:
        proc = hpctrain("status", "cli-live", "--json", *where, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    running = wait_for("both pods running", lambda: (s := status())["state"] == "RUNNING"
                       and [r["phase"] for r in s["replicas"]] == ["Running", "Running"] and s, standin)
    assert [r["name"] for r in running["replicas"]] == ["master-0", "worker-0"]
    table = hpctrain("status", "cli-live", *where, cwd=tmp_path)
    assert table.stdout.startswith("cli-live: RUNNING") and "worker-0" in table.stdout, table
    listing = hpctrain("status", *where, cwd=tmp_path)
    assert listing.stdout.splitlines()[1].split()[:3] == ["cli-live", "RUNNING", "2"], listing

    def log_of(*replica: str) -> str:
        return hpctrain("logs", "cli-live", *replica, *where, cwd=tmp_path).stdout

    assert wait_for("rank 0's log", lambda: "hello from rank 0" in log_of(), standin)
    assert wait_for("rank 1's log", lambda: "hello from rank 1" in log_of("--replica", "worker-0"), standin)
    bad = hpctrain("logs", "cli-live", "--replica", "worker-7", *where, cwd=tmp_path)
    assert bad.returncode == 2 and "use one of master-0, worker-0" in bad.stderr

    nodes = hpctrain("cluster", "--json", *where, cwd=tmp_path)
    assert standin.node in [n["name"] for n in json.loads(nodes.stdout)["nodes"]], nodes

    cancelled = hpctrain("cancel", "cli-live", "--wait", str(DEADLINE_S), *where, cwd=tmp_path)
    assert cancelled.returncode == 0 and "RUNNING -> deleted" in cancelled.stdout, cancelled
    gone = hpctrain("status", "cli-live", *where, cwd=tmp_path)
    assert gone.returncode == 2 and "no PyTorchJob named 'cli-live'" in gone.stderr


def test_submit_wait_exits_with_the_jobs_status(cluster, tmp_path: Path) -> None:
    namespace, standin = cluster
    proc = hpctrain("submit", "--scheduler", "kubernetes", "--context", CONTEXT, "--namespace", namespace,
                    "--image", IMAGE, "--node-selector", f"hpctrain-test-node={namespace}", "--job-name", "exit-3",
                    "--wait", "--", sys.executable, "-c", "import sys; sys.exit(3)", cwd=tmp_path)
    assert not standin.errors, standin.errors
    assert proc.returncode == 3, proc.stderr
    assert "job exit-3 ended FAILED with exit status 3" in proc.stderr
    assert (tmp_path / "runs" / "exit-3" / "pytorchjob.yaml").is_file()  # the default run dir, relative: recorded here
