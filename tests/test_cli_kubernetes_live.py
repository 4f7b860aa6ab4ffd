"""`hpctrain submit/check/status/logs/cancel/cluster --scheduler kubernetes` through the CLI, against the local
cluster's real node (tests/real_node.py: kube-scheduler, a kubelet with containerd, kube-controller-manager), named by
its kubeconfig context so no other cluster is ever touched. The "shared volume" is a hostPath volume of this machine.

Still a stand-in: the Kubeflow PyTorchJob controller (tests/kubeflow_standin.py, controllers only).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from real_node import DEADLINE_S, Real, real, real_cpu  # noqa: F401 - fixtures: the whole node, one CPU of it

pytestmark = [pytest.mark.k8s, pytest.mark.slow]
SLEEPER = "import os, time; print('hello from rank', os.environ['RANK'], flush=True); time.sleep(300)"


def test_submit_status_logs_cancel_through_the_cli(real: Real, tmp_path: Path) -> None:
    """A 2-pod job of 1 CPU each: the whole node."""
    shared = tmp_path / "shared"
    shared.mkdir()
    where, node = real.where, sorted(real.nodes)[0]
    job = [
        *where,
        "--image",
        real.image,
        "--node-selector",
        f"kubernetes.io/hostname={node}",
        "--volume",
        f"host:{shared}:{shared}",
        "--run-dir",
        f"{shared}/runs/%j",
        "--nodes",
        "2",
        "--mem",
        "1G",
        "--signal-grace",
        "5",
        "--job-name",
        "cli-live",
        "--",
        "python",
        "-c",
        SLEEPER,
    ]

    checked = real.cli("check", *job, cwd=tmp_path)
    assert checked.returncode == 0 and checked.stdout.startswith("ok: cli-live: PyTorchJob, 2 pod(s)"), checked

    submitted = real.cli("submit", *job, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout == "cli-live\n"
    # The submission is recorded in the run dir, as the pods see it; job.yaml resubmits the same manifest.
    record = shared / "runs" / "cli-live"
    dry = real.cli("submit", "--dry-run", "--job-file", str(record / "job.yaml"), cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout == (record / "pytorchjob.yaml").read_text()

    def status() -> dict:
        proc = real.cli("status", "cli-live", "--json", *where, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    running = real.wait(
        "both pods running",
        lambda: (
            (s := status())["state"] == "RUNNING"
            and [r["phase"] for r in s["replicas"]] == ["Running", "Running"]
            and s
        ),
    )
    assert [r["name"] for r in running["replicas"]] == ["master-0", "worker-0"]
    table = real.cli("status", "cli-live", *where, cwd=tmp_path)
    assert table.stdout.startswith("cli-live: RUNNING") and "worker-0" in table.stdout, table
    listing = real.cli("status", *where, cwd=tmp_path)
    assert listing.stdout.splitlines()[1].split()[:3] == ["cli-live", "RUNNING", "2"], listing

    def log_of(*replica: str) -> str:
        return real.cli("logs", "cli-live", *replica, *where, cwd=tmp_path).stdout

    assert real.wait("rank 0's log", lambda: "hello from rank 0" in log_of())
    assert real.wait("rank 1's log", lambda: "hello from rank 1" in log_of("--replica", "worker-0"))
    bad = real.cli("logs", "cli-live", "--replica", "worker-7", *where, cwd=tmp_path)
    assert bad.returncode == 2 and "use one of master-0, worker-0" in bad.stderr

    web_console_job_page(real)

    nodes = real.cli("cluster", "--json", *where, cwd=tmp_path)
    assert real.nodes <= {n["name"] for n in json.loads(nodes.stdout)["nodes"]}, nodes

    cancelled = real.cli("cancel", "cli-live", "--wait", str(DEADLINE_S), *where, cwd=tmp_path)
    assert cancelled.returncode == 0 and "RUNNING -> deleted" in cancelled.stdout, cancelled
    gone = real.cli("status", "cli-live", *where, cwd=tmp_path)
    assert gone.returncode == 2 and "no PyTorchJob named 'cli-live'" in gone.stderr


def web_console_job_page(real: Real) -> None:
    """The web console's page of the running job (hpctrain.web over the same backend): the shell command beside it
    is the backend's `kubectl exec` into rank 0's pod in this context and namespace, each pod's log is offered, and a
    replica's log is streamed from its pod."""
    pytest.importorskip("starlette", reason="the web extra is not installed")
    from starlette.testclient import TestClient

    from hpctrain.web.app import create_app
    from hpctrain.web.guard import Secrets

    from real_node import CONTEXT

    app = create_app({"kubernetes": real.scheduler()}, Secrets(token="t"), interval_s=1.0)
    client = TestClient(app, base_url="http://localhost", follow_redirects=False)
    assert client.get("/?token=t").status_code == 303
    page = client.get("/job/kubernetes/cli-live")
    assert page.status_code == 200, page.text
    shell = f"kubectl --context {CONTEXT} exec -it -n {real.namespace} cli-live-master-0 -- bash"
    assert f'<code id="shell">{shell}</code>' in page.text
    assert "?stream=stdout&amp;replica=worker-0" in page.text and "?stream=stdout&amp;replica=master-0" in page.text
    with client.stream("GET", "/api/log/kubernetes/cli-live?replica=worker-0") as answer:
        assert any("hello from rank 1" in text for text in answer.iter_lines())


def test_submit_wait_exits_with_the_jobs_status(real_cpu: Real, tmp_path: Path) -> None:
    """A 1-pod job of 1 CPU: one CPU of the node."""
    real, node = real_cpu, sorted(real_cpu.nodes)[0]
    proc = real.cli(
        "submit",
        *real.where,
        "--image",
        real.image,
        "--node-selector",
        f"kubernetes.io/hostname={node}",
        "--job-name",
        "exit-3",
        "--wait",
        "--",
        "python",
        "-c",
        "import sys; sys.exit(3)",
        cwd=tmp_path,
    )
    assert not real.standin.errors, real.standin.errors
    # The controller fails the job at the container's first restart and, with cleanPodPolicy Running, deletes the
    # restarted pod: the exit status is the one --wait saw on the pod, or the operator recorded (an ExitedWithCode
    # event, when its pass fell between the exit and the kubelet's restart); with neither, --wait says so and exits 1.
    assert proc.returncode in (3, 1), proc.stderr
    assert (
        "job exit-3 ended FAILED with exit status 3"
        if proc.returncode == 3
        else "job exit-3 ended FAILED; hpctrain could not learn its exit status"
    ) in proc.stderr, proc.stderr
    assert (tmp_path / "runs" / "exit-3" / "pytorchjob.yaml").is_file()  # the default run dir, relative: recorded here
