"""A cluster without Kubeflow: `hpctrain check` and `submit` against a real API server that has no Kubeflow CRD
name the CRD and how to install it, and create nothing.

The server is a second, throw-away etcd + kube-apiserver started by scripts/local-k8s.sh with
HPCTRAIN_K8S_NO_CRDS=1 (fixture `k8s_crdless`, once for this module: its tests run on one xdist worker), reached
through its own kubeconfig file, so the shared server's CRDs, which other tests need, stay installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from k8s_fixtures import CrdlessK8s
from training_helpers import run_hpctrain

pytestmark = [pytest.mark.k8s, pytest.mark.slow, pytest.mark.xdist_group("k8s-crdless")]
IMAGE = "example.invalid/hpctrain:test"


def hpctrain(server: CrdlessK8s, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_hpctrain(*args, cwd=cwd, env=server.env(), timeout=120)


def job(server: CrdlessK8s, api: str, name: str) -> list[str]:
    return [
        "--scheduler",
        "kubernetes",
        "--k8s-api",
        api,
        "--context",
        server.context,
        "--namespace",
        "default",
        "--image",
        IMAGE,
        "--job-name",
        name,
        "--run-dir",
        "runs/%j",
        "--",
        sys.executable,
        "-c",
        "pass",
    ]


@pytest.mark.parametrize(
    "api,line",
    [
        (
            "pytorchjob",
            "the Kubeflow PyTorchJob CRD (pytorchjobs.kubeflow.org) is not installed: install Kubeflow's "
            "training-operator v1, or use --k8s-api trainjob",
        ),
        (
            "trainjob",
            "the Kubeflow TrainJob CRD (trainjobs.trainer.kubeflow.org) is not installed: install Kubeflow's "
            "Trainer v2, or use --k8s-api pytorchjob",
        ),
    ],
)
def test_check_and_submit_name_the_missing_crd(k8s_crdless: CrdlessK8s, tmp_path: Path, api: str, line: str) -> None:
    checked = hpctrain(k8s_crdless, "check", *job(k8s_crdless, api, "no-crd"), cwd=tmp_path)
    assert checked.returncode == 2 and line in checked.stderr, checked
    assert "Traceback" not in checked.stderr
    if api == "trainjob":
        return  # submit takes the same paths for both kinds: once is enough

    submitted = hpctrain(k8s_crdless, "submit", *job(k8s_crdless, api, "no-crd"), cwd=tmp_path)
    assert submitted.returncode == 2 and line in submitted.stderr, submitted
    assert "nothing was submitted" in submitted.stderr and submitted.stdout == ""
    assert not (tmp_path / "runs").exists()

    # Past the checks, the API server's 404 is traced back to the same missing CRD.
    forced = hpctrain(k8s_crdless, "submit", "--no-check", *job(k8s_crdless, api, "no-crd"), cwd=tmp_path)
    assert forced.returncode == 2 and line in forced.stderr and "Traceback" not in forced.stderr, forced
    assert not (tmp_path / "runs").exists()


def test_cluster_without_nodes_says_so(k8s_crdless: CrdlessK8s, tmp_path: Path) -> None:
    """This server has no kubelet and no test registers a node on it: `cluster` says there is none and what that
    means, rather than printing a bare header."""
    proc = hpctrain(k8s_crdless, "cluster", "--scheduler", "kubernetes", "--context", k8s_crdless.context, cwd=tmp_path)
    assert proc.returncode == 0, proc
    assert proc.stdout.startswith("no nodes: the cluster has no node registered, so no pod can run"), proc.stdout
    assert "NODE" not in proc.stdout
