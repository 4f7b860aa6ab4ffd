"""A test's namespace on the local cluster's REAL node (scripts/local-k8s.sh with HPCTRAIN_K8S_NODES=1: a kubelet with
containerd, kube-scheduler, kube-controller-manager), with the controllers-only Kubeflow stand-in running in it.

The node has the machine's few CPUs (2 on CI) and is shared by the pytest-xdist workers (and by anyone else's tests
through the same lock files), so a test says how much of it its pods take:

* `real` -- the whole node: pods that together ask for more than one CPU (a 2-pod hpctrain job asks for 2), tests
  of Pending or preemption. An exclusive lock: no other real-node test runs meanwhile (two 2-pod jobs whose masters
  took the CPUs would wait on their workers forever: no gang scheduling).
* `real_cpu` -- one CPU: pods that together ask for at most 1 CPU (a 1-pod job). The node lock shared, plus one of
  NODE_CPUS slot locks, so such tests run side by side up to the node's CPUs.
* `real_free` -- pods that ask for no CPU at all (no requests): no lock. They take no room from any other test's
  pods, so they run beside everything, Pending and preemption tests included (the scheduler counts requests).

The cluster is chosen as in tests/test_k8s_real_pods.py: HPCTRAIN_K8S_NODE_DIR and HPCTRAIN_K8S_NODE_CONTEXT name
the one with the node (scripts/test.sh starts it; then a missing node fails each test); without them each test
skips, with the reason, unless `scripts/local-k8s.sh status` reports a Ready node and a training image.
The pods run the image's python (the host's venv mounted read-only) with hpctrain from the checkout that started the
cluster; a test's own files reach them through hostPath volumes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from around_helpers import cli_env, hpctrain
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
from hpctrain.schedulers.kubernetes.scheduler import KubernetesScheduler
from kubeflow_standin import KubeflowStandIn, create_namespace, delete_namespace, wait_for
from slurm_fixtures import is_training
from test_k8s_real_pods import CONTEXT, node_status

DEADLINE_S = (
    420  # a bound on waiting on a loaded 2-core machine (other jobs may hold the node's CPUs); never asserted on
)
NODE_CPUS = 2  # the slots of `real_cpu`: the CI node's allocatable CPUs
WHOLE = None


@dataclass
class Real:
    """One test's namespace on the real node, with the controllers-only stand-in running."""

    api: Any
    namespace: str
    image: str
    nodes: set[str]
    standin: KubeflowStandIn
    env: dict[str, str]

    @property
    def where(self) -> list[str]:
        """The CLI's flags that reach this namespace."""
        return ["--scheduler", "kubernetes", "--context", CONTEXT, "--namespace", self.namespace]

    def scheduler(
        self, *volumes: str, shm: str | None = None, priority_class: str | None = None
    ) -> KubernetesScheduler:
        options = KubernetesOptions(
            namespace=self.namespace, image=self.image, volumes=volumes, shm=shm, priority_class=priority_class
        )
        return KubernetesScheduler(options, context=CONTEXT)

    def cli(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return hpctrain(*args, env=self.env, cwd=cwd)

    def start_cli(self, *args: str) -> subprocess.Popen[str]:
        """`hpctrain *args` started, not waited for (its output: communicate())."""
        return subprocess.Popen(
            [sys.executable, "-m", "hpctrain", *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def wait(self, what: str, predicate: Any) -> Any:
        return wait_for(what, predicate, self.standin, timeout=DEADLINE_S, poll=1.0)

    def training_pids(self, run_dir: Path, count: int) -> list[int]:
        """The pids of the `hpctrain train` processes that the pods run for `run_dir` (the node is this machine, so
        the containers' processes are in its /proc), each pod's top one: a data loader worker, a fork of it, is
        left out. Waits until there are `count`."""
        return self.wait(f"{count} training process(es) for {run_dir}", lambda: _training_pids(run_dir, count))


def _training_pids(run_dir: Path, count: int) -> list[int] | None:
    found: dict[int, int] = {}  # pid: parent pid
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        if str(run_dir) in argv and is_training(argv):
            found[int(entry.name)] = parent
    top = sorted(pid for pid, parent in found.items() if parent not in found)
    return top if len(top) == count else None


def _lock(name: str) -> Path:
    return Path(tempfile.gettempdir()) / f"hpctrain-real-node-{CONTEXT}{name}.lock"


@contextlib.contextmanager
def node_share(cpus: int | None) -> Iterator[None]:
    """Hold the part of the node that `cpus` names (WHOLE, 1 or 0), across processes (module docstring)."""
    if cpus == 0:
        yield
        return
    with open(_lock(""), "w") as node, contextlib.ExitStack() as stack:
        fcntl.flock(node, fcntl.LOCK_EX if cpus is WHOLE else fcntl.LOCK_SH)
        if cpus:
            slots = [stack.enter_context(open(_lock(f"-cpu{i}"), "w")) for i in range(NODE_CPUS)]
            if not any(_try_lock(slot) for slot in slots):  # every slot taken: wait on the first
                fcntl.flock(slots[0], fcntl.LOCK_EX)
        stack.enter_context(_at_normal_priority())
        yield


@contextlib.contextmanager
def _at_normal_priority() -> Iterator[None]:
    """scripts/test.sh runs pytest niced (10), so that what runs outside it (pods, Slurm's job steps) goes first and
    the suite's longest chain, the real node's tests one after another, is not slowed by the CPU-bound local tests.
    A real-node test's own commands (the CLI it runs, its stand-in) run at normal priority again (root may lower
    niceness); the worker's niceness is restored after it."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, min(before, 0))
    except PermissionError:
        pass
    try:
        yield
    finally:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, before)
        except PermissionError:
            pass


def _try_lock(f: Any) -> bool:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextlib.contextmanager
def real_namespace(
    tmp_path: Path, cpus: int | None, controllers: type[KubeflowStandIn] = KubeflowStandIn
) -> Iterator[Real]:
    """A namespace on the node with the stand-in `controllers` (a subclass plays more of them) running in it."""
    nodes, image = node_status()
    from kubernetes import config

    with node_share(cpus):
        api = config.new_client_from_config(context=CONTEXT)
        namespace = create_namespace(api, prefix="hpct-real")
        standin = controllers(api, namespace).start()
        try:
            yield Real(api, namespace, image, nodes, standin, cli_env(tmp_path / "home"))
        finally:
            standin.stop()
            delete_namespace(api, namespace)


@pytest.fixture
def real(tmp_path: Path) -> Iterator[Real]:
    with real_namespace(tmp_path, WHOLE) as r:
        yield r


@pytest.fixture
def real_cpu(tmp_path: Path) -> Iterator[Real]:
    with real_namespace(tmp_path, 1) as r:
        yield r


@pytest.fixture
def real_free(tmp_path: Path) -> Iterator[Real]:
    with real_namespace(tmp_path, 0) as r:
        yield r
