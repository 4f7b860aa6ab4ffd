"""docs/kubernetes.md's way to try a PyTorchJob on the local cluster with a node: the TEST-ONLY controller stand-ins
started with its one line (`python tests/run_standins.py --context CONTEXT --namespace NS`), then the documented
`hpctrain submit`; and the runner refuses a context that is not a local test cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from real_node import DEADLINE_S, Real, real_cpu  # noqa: F401 - fixture: one CPU of the node
from test_k8s_real_pods import CONTEXT

RUNNER = Path(__file__).resolve().parent / "run_standins.py"


def test_the_runner_refuses_a_cluster_that_is_not_local(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "prod",
                "clusters": [{"name": "prod", "cluster": {"server": "https://192.0.2.10:6443"}}],
                "users": [{"name": "me", "user": {"token": "t"}}],
                "contexts": [{"name": "prod", "context": {"cluster": "prod", "user": "me"}}],
            }
        )
    )
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--context", "prod"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
    )
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr == (
        "run_standins: context 'prod' points at 192.0.2.10, not at a local test cluster: the "
        "stand-ins are for scripts/local-k8s.sh's clusters only\n"
    )


@pytest.mark.k8s
@pytest.mark.slow
def test_the_documented_stand_in_line_gives_a_submitted_pytorchjob_its_pod(real_cpu: Real, tmp_path: Path) -> None:
    real = real_cpu
    real.standin.stop()  # the fixture's own; the documented command plays its part here
    runner = subprocess.Popen(
        [sys.executable, str(RUNNER), "--context", CONTEXT, "--namespace", real.namespace],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert runner.stdout is not None
        assert runner.stdout.readline() == (
            f"run_standins: TEST-ONLY stand-ins of the Kubeflow PyTorchJob and TrainJob controllers running in "
            f"namespace {real.namespace} of context {CONTEXT}; Ctrl-C stops them\n"
        )
        submitted = real.cli(
            "submit",
            "--scheduler",
            "kubernetes",
            "--context",
            CONTEXT,
            "--namespace",
            real.namespace,
            "--image",
            real.image,
            "--job-name",
            "try-1",
            "--mem",
            "512M",
            "--wait",
            "--",
            "python",
            "-c",
            "print('hello')",
            cwd=tmp_path,
        )
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        logs = real.cli("logs", "try-1", *real.where, cwd=tmp_path)
        assert "hello" in logs.stdout.splitlines(), logs.stdout + logs.stderr
    finally:
        runner.send_signal(signal.SIGINT)
        out, err = runner.communicate(timeout=DEADLINE_S)
    assert runner.returncode == 0 and out == "run_standins: stopped\n" and "Traceback" not in err, (out, err)
