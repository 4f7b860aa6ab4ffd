"""Shared fixtures: the Debian Fashion-MNIST files, local HTTP mirrors, and a ready data dir."""

from __future__ import annotations

import functools
import http.server
import json
import os
import signal
import threading
from collections import deque
from pathlib import Path

import pytest
from slurm_fixtures import SLURM_FIXTURES

# The `slurm_cluster` and `k8s_cluster` fixtures (they start scripts/local-slurm.sh or local-k8s.sh when down);
# cpu_report: HPCTRAIN_TEST_CPU_REPORT=FILE records each test's CPU (where the suite's time goes).
pytest_plugins = ["slurm_fixtures", "k8s_fixtures", "cpu_report"]

# Every Python the tests start, and their Slurm jobs', imports tests/slurm_steps/sitecustomize.py at start-up: in a job
# step of a test that asked for it (slurm_fixtures.warm_job_steps), `python -m hpctrain` runs as a fork of a warm
# process; anywhere else it does nothing. Set here, before any warm process starts, so that all share the variable.
SLURM_STEPS_HOOK = str(Path(__file__).parent / "slurm_steps")
if SLURM_STEPS_HOOK not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [SLURM_STEPS_HOOK, os.environ.get("PYTHONPATH")]))

# Signals whose action hpctrain's code changes in-process: the training loop's StopRequest and the local launcher
# leave them ignored once a run is settled ("until the process exits"). In a pytest worker that would last for
# every later test, and the processes those tests start inherit an ignored SIGINT (Python then raises no
# KeyboardInterrupt) or SIGTERM: each test starts and ends with the worker's own actions.
_RESTORED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)


# A CI script that runs the suite in the background (`cmd &` in a shell without job control) starts it with SIGINT
# ignored, and every process a test starts inherits that: Python then installs no KeyboardInterrupt handler, and
# the tests of Ctrl-C would test nothing. The workers take Python's own action, which a child does not inherit.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# The tests whose pods run on the local cluster's real node hold it, or a CPU of it, under a file lock (real_node.py).
# Spread over the xdist workers, each waited there for the others' (a failing one held the node for 7 minutes while
# three workers idled: 12% of a CI run's CPU unused). scripts/test.sh runs with --dist loadgroup: these go to one
# worker, one after another, the largest group first, and the other workers never wait on the node.
REAL_NODE_FIXTURES = {"real", "real_cpu"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if REAL_NODE_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("real_node"):
            item.add_marker(pytest.mark.real_node)
            item.add_marker(pytest.mark.xdist_group("real-node"))
    items[:] = dispatch_order(items)


# What a test takes on a CI worker, roughly: a slow test 8 s, a quick one under a second, and each slow Slurm test
# its own figure, most of it waiting on the cluster (dispatch_weights.json: wall seconds in a CI run, ci19; SLURM_S
# for one not listed). They only order the tests; nothing is judged by them.
SLOW_S, QUICK_S, SLURM_S = 8.0, 0.8, 60.0
SLURM_WEIGHTS: dict[str, float] = json.loads((Path(__file__).parent / "dispatch_weights.json").read_text())
# The slow Slurm tests are spread over this share of the others' time; the last of them are the shortest.
SLURM_SPREAD = 0.95


def dispatch_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """The order xdist hands the tests out in (after the groups, largest first). The slow tests first and the many
    quick ones last, so that the run does not end on a few long tests that mostly wait (a run that ended on
    test_worker_failures.py's left the CPUs 7.6% idle); and the slow Slurm tests, longest first, spread over the
    first 95% of the others' time in proportion to their own: handed out with the other slow tests, they
    held every worker at once, most of them waiting for the cluster's two nodes, and left the CPUs up to 90% idle for
    minutes (ci18, ci19). Spread, about half the workers wait on Slurm while the others keep the CPUs busy."""

    def is_slow(item: pytest.Item) -> bool:
        return item.get_closest_marker("slow") is not None

    def other_s(item: pytest.Item) -> float:
        return SLOW_S if is_slow(item) else QUICK_S

    def slurm_s(item: pytest.Item) -> float:
        return SLURM_WEIGHTS.get(item.nodeid, SLURM_S)

    on_slurm = [item for item in items if is_slow(item) and SLURM_FIXTURES & set(getattr(item, "fixturenames", ()))]
    on_slurm.sort(key=slurm_s, reverse=True)  # a stable sort: equal ones keep the files' order
    chosen = {id(item) for item in on_slurm}
    others = deque(
        [item for item in items if is_slow(item) and id(item) not in chosen]
        + [item for item in items if not is_slow(item)]
    )
    # Others' seconds to hand out per second of Slurm tests handed out.
    rate = SLURM_SPREAD * sum(map(other_s, others)) / max(sum(map(slurm_s, on_slurm)), 1.0)
    ordered: list[pytest.Item] = []
    handed_others = handed_slurm = 0.0
    for test in on_slurm:
        while others and handed_others < rate * handed_slurm:
            item = others.popleft()
            ordered.append(item)
            handed_others += other_s(item)
        ordered.append(test)
        handed_slurm += slurm_s(test)
    return ordered + list(others)


@pytest.fixture(autouse=True)
def _signal_actions_restored():
    before = {signum: signal.getsignal(signum) for signum in _RESTORED_SIGNALS}
    yield
    for signum, action in before.items():
        if signal.getsignal(signum) is not action and action is not None:
            signal.signal(signum, action)


@pytest.fixture(autouse=True)
def _environment_restored():
    """An in-process test that prepares a run leaves what hpctrain sets for its ranks (TORCH_NCCL_* defaults, the
    launcher's variables) in this worker's environment: the next test's children would inherit it, and each change
    of a start-up variable costs the worker a new warm process (tests/warm_start.py). Each test gets the environment
    it started with back; fixtures of a wider scope set theirs up before this one looks."""
    before = dict(os.environ)
    yield
    if os.environ != before:
        os.environ.clear()
        os.environ.update(before)


# Debian's package; a machine without it (the GPU machine of benchmarks/gpu_check.sh) names a copy.
FASHION_MNIST_SOURCE = Path(os.environ.get("HPCTRAIN_TEST_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))
FASHION_MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)


@pytest.fixture(scope="session")
def fashion_mnist_source() -> Path:
    """Directory with the four Fashion-MNIST .gz files (recompressed by Debian: same content)."""
    missing = [name for name in FASHION_MNIST_FILES if not (FASHION_MNIST_SOURCE / name).is_file()]
    if missing:
        pytest.fail(f"{FASHION_MNIST_SOURCE} lacks {', '.join(missing)}: run `apt-get install dataset-fashion-mnist`")
    return FASHION_MNIST_SOURCE


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    log: list[str]  # set per server; every requested URL path, in order

    def do_GET(self) -> None:
        self.log.append(self.path)
        super().do_GET()

    def do_HEAD(self) -> None:
        self.log.append(self.path)
        super().do_HEAD()

    def log_message(self, format: str, *args) -> None:  # keep test output clean
        pass


class HttpMirrors:
    """Callable: `http_mirror(directory)` serves `directory` on 127.0.0.1 and returns its base URL
    (ending in '/'). `http_mirror.requests(url)` lists the paths requested from that server."""

    def __init__(self) -> None:
        self._servers: dict[str, tuple[http.server.ThreadingHTTPServer, threading.Thread, list[str]]] = {}

    def __call__(self, directory: Path | str) -> str:
        log: list[str] = []
        handler = functools.partial(type("Handler", (_QuietHandler,), {"log": log}), directory=str(directory))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, name="http-mirror", daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        self._servers[url] = (server, thread, log)
        return url

    def requests(self, url: str) -> list[str]:
        return list(self._servers[url][2])

    def close(self) -> None:
        for server, thread, _ in self._servers.values():
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
        self._servers.clear()


@pytest.fixture
def http_mirror():
    """Factory starting real HTTP servers for a test; all are shut down afterwards."""
    mirrors = HttpMirrors()
    yield mirrors
    mirrors.close()


@pytest.fixture(scope="session")
def fashion_data_dir(tmp_path_factory, fashion_mnist_source) -> Path:
    """A data dir laid out as `hpctrain download fashion-mnist` leaves it (DATA_DIR/fashion-mnist/*.gz),
    made by the real download() from a file:// mirror. Shared by the session: do not modify it."""
    from hpctrain.data import download, get_dataset_spec

    data_dir = tmp_path_factory.mktemp("data")
    download(get_dataset_spec("fashion-mnist"), data_dir, [fashion_mnist_source.as_uri()])
    return data_dir
