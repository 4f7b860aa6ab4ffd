"""The `k8s_cluster` fixture: the local Kubernetes API server of scripts/local-k8s.sh, started once per session.

Register in conftest.py with `pytest_plugins = ["k8s_fixtures"]`. The fixture runs `scripts/local-k8s.sh up` when
`status` says the server is not up (as root; the first run on a machine builds kube-apiserver, 5-20 minutes) and
fails with the script's output when it cannot come up. It never stops the server. With HPCTRAIN_K8S_OPTIONAL=1 a
server that is not up skips the tests instead (for machines that cannot build it); CI leaves that unset, so there
the tests run or fail.

The server is real (etcd + kube-apiserver 1.20 with the Kubeflow CRDs) but has no kubelet and no controllers: no
pod ever runs and no job is turned into pods unless a test does it.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from training_helpers import run_hpctrain

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "local-k8s.sh"
CONTEXT = "hpctrain-local"
CRD_NAMES = (
    "pytorchjobs.kubeflow.org",
    "trainjobs.trainer.kubeflow.org",
    "trainingruntimes.trainer.kubeflow.org",
    "clustertrainingruntimes.trainer.kubeflow.org",
)
# A cold `up` builds kube-apiserver from source.
UP_TIMEOUT_S = 1800


@dataclass(frozen=True)
class LocalK8s:
    """The running local API server, reached through the `hpctrain-local` context of the default kubeconfig
    (named explicitly, so that tests never touch another cluster that happens to be current)."""

    script: Path
    context: str = CONTEXT

    def api_client(self) -> Any:
        """A kubernetes.client.ApiClient for the local server."""
        from kubernetes import config

        return config.new_client_from_config(context=self.context)


@pytest.fixture(scope="session")
def k8s_cluster() -> LocalK8s:
    """Start (or reuse) the local API server; fail with the reason when that is impossible."""
    if not SCRIPT.is_file():
        pytest.fail(f"{SCRIPT} is missing")
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        pytest.fail("the kubernetes client is not installed: pip install -e '.[k8s]'")
    status = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True, check=False)
    if status.returncode != 0:
        if os.environ.get("HPCTRAIN_K8S_OPTIONAL") == "1":
            pytest.skip(f"the local Kubernetes API server is not up (HPCTRAIN_K8S_OPTIONAL=1): {status.stdout.strip()}")
        if os.geteuid() != 0:
            pytest.fail(
                "the local Kubernetes API server is not up and starting it needs root: "
                "run `sudo scripts/local-k8s.sh up`"
            )
        up = subprocess.run(
            ["bash", str(SCRIPT), "up"], capture_output=True, text=True, check=False, timeout=UP_TIMEOUT_S
        )
        if up.returncode != 0:
            pytest.fail(f"`scripts/local-k8s.sh up` failed (exit {up.returncode}):\n{up.stdout}\n{up.stderr}")
    return LocalK8s(script=SCRIPT)


CRDLESS_CONTEXT = "hpctrain-crdless"


@dataclass(frozen=True)
class CrdlessK8s:
    """A second, throw-away API server without any Kubeflow CRD, reached only through its own kubeconfig file
    (`KUBECONFIG=kubeconfig`), so the shared server and the default kubeconfig are never touched."""

    kubeconfig: Path
    context: str = CRDLESS_CONTEXT

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}


@pytest.fixture(scope="module")
def k8s_crdless(k8s_cluster: LocalK8s, tmp_path_factory: pytest.TempPathFactory):
    """Start a second etcd + kube-apiserver (the cached binary of the shared one, other ports, its own state dir)
    with HPCTRAIN_K8S_NO_CRDS=1; stop it and remove its state after the module's tests. Needs the shared server's
    build, hence `k8s_cluster` first. Its tests are one xdist group: once a session it ran on every worker that
    got one of them and idled there to the end (3 servers, 45 CPU s each)."""
    if os.geteuid() != 0:
        pytest.fail("starting a second local Kubernetes API server needs root (as scripts/local-k8s.sh up does)")
    base = tmp_path_factory.mktemp("k8s-crdless")
    env = {
        **os.environ,
        "HPCTRAIN_K8S_DIR": str(base / "state"),
        "HPCTRAIN_K8S_NO_CRDS": "1",
        "HPCTRAIN_K8S_CONTEXT": CRDLESS_CONTEXT,
        "KUBECONFIG": str(base / "kubeconfig"),
    }
    up = subprocess.run(
        ["bash", str(SCRIPT), "up"], env=env, capture_output=True, text=True, check=False, timeout=UP_TIMEOUT_S
    )
    try:
        if up.returncode != 0:
            pytest.fail(
                f"a CRD-less `scripts/local-k8s.sh up` failed (exit {up.returncode}):\n{up.stdout}\n{up.stderr}"
            )
        yield CrdlessK8s(kubeconfig=base / "kubeconfig")
    finally:
        subprocess.run(["bash", str(SCRIPT), "down"], env=env, capture_output=True, text=True, check=False, timeout=120)


DEADLINE_S = 300  # a bound on waiting for the CLI or the stand-in on a loaded 2-core machine, never asserted on


def hpctrain(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`hpctrain ARGS` as a user runs it, in `cwd`."""
    return run_hpctrain(*args, cwd=cwd, timeout=DEADLINE_S)
