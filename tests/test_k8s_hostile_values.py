"""Kubernetes commands against an API server whose answers are well-formed JSON but hostile in their values (issue
39, item 6): a list whose `continue` token never changes, or that offers pages for ever; a number like `1e999`
(JSON for infinity, an OverflowError when int()'d); a field of the wrong type where hpctrain reads it (a string
where a count or an object belongs, a list where an object does, a lone surrogate); and 429 Too Many Requests with
a Retry-After. Each command ends with one line naming the server, the object and the field, or honours Retry-After
within its deadline and says so when the deadline comes first.

The server is a test-only stand-in on 127.0.0.1 (the pattern of tests/test_k8s_hostile_servers.py): a real API
server cannot be made to answer like this. It serves a small namespace (a PyTorchJob job-1 with one pod, a node)
from plain dicts that each test spoils in one place.
"""

from __future__ import annotations

import copy
import http.server
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from test_k8s_bad_servers import _kubeconfig

pytest.importorskip("kubernetes")

WHERE = ("--scheduler", "kubernetes", "--namespace", "default")
COMMANDS = {
    "status": ("status", *WHERE),
    "status JOB": ("status", "job-1", *WHERE),
    "cluster": ("cluster", *WHERE),
    "check": ("check", *WHERE, "--image", "example.invalid/x:1", "--job-name", "ok", "--", "python", "-c", "pass"),
}
JOB = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "job-1", "namespace": "default", "uid": "u1", "creationTimestamp": "2026-01-01T00:00:00Z"},
    "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}}},
    "status": {"conditions": [{"type": "Running", "status": "True", "message": "running"}]},
}
POD = {
    "metadata": {
        "name": "job-1-master-0",
        "namespace": "default",
        "labels": {"training.kubeflow.org/replica-type": "master", "training.kubeflow.org/replica-index": "0"},
    },
    "spec": {"nodeName": "node-a", "containers": [{"name": "pytorch", "resources": {"requests": {"cpu": "1"}}}]},
    "status": {"phase": "Running", "containerStatuses": [{"name": "pytorch", "restartCount": 0, "state": {}}]},
}
NODE = {
    "metadata": {"name": "node-a", "labels": {}},
    "spec": {},
    "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}},
}
CRD = {
    "metadata": {"name": "pytorchjobs.kubeflow.org"},
    "spec": {"versions": [{"name": "v1", "served": True}]},
    "status": {"conditions": [{"type": "Established", "status": "True"}]},
}


def objects() -> dict[str, Any]:
    """What the stand-in serves, by the path's last segment (a list) or kind/name (an object)."""
    return copy.deepcopy(
        {
            "pytorchjobs": [JOB],
            "pytorchjobs/job-1": JOB,
            "pods": [POD],
            "nodes": [NODE],
            "events": [],
            "resourcequotas": [],
            "namespaces/default": {"metadata": {"name": "default"}},
            "customresourcedefinitions/pytorchjobs.kubeflow.org": CRD,
        }
    )


class _Api(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        segments = parts.path.rstrip("/").split("/")
        server: Any = self.server
        server.requests.append(self.path)
        status, headers, body = server.answer(segments, query, server.objects)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        for key, value in {"Content-Type": "application/json", **headers}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def serve(segments: list[str], query: dict[str, list[str]], served: dict[str, Any]) -> tuple[int, dict, Any]:
    """The namespace as `served` holds it; 404 for anything else."""
    for key in ("/".join(segments[-2:]), segments[-1]):
        if key in served:
            value = served[key]
            if isinstance(value, list):
                return 200, {}, {"kind": "List", "metadata": {}, "items": value}
            return 200, {}, value
    return 404, {}, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gives up (the deadline) resets its connection: socketserver would print that traceback to
        stderr, which the tests read as the command's."""


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    server: Any = _QuietServer(("127.0.0.1", 0), _Api)
    server.daemon_threads = True
    server.requests, server.objects, server.answer = [], objects(), serve
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.address = f"127.0.0.1:{server.server_address[1]}"
    kubeconfig = str(_kubeconfig(tmp_path / "kubeconfig", f"http://{server.address}"))
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", kubeconfig)
    monkeypatch.setenv("HPCTRAIN_K8S_TIMEOUT", "1")
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.chdir(tmp_path)
    yield server
    server.shutdown()
    server.server_close()


def run(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str], limit_s: float = 60) -> tuple[int, str, str]:
    """main(argv) on a thread of its own: a command that never ends fails the test instead of hanging it (no
    assertion on the time it took)."""
    from hpctrain.cli import main

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["code"] = main(list(argv))
        except BaseException as err:  # reported below, with its traceback
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"{' '.join(argv)} still runs after {limit_s} s"
    captured = capsys.readouterr()
    if "error" in box:
        raise AssertionError(f"{' '.join(argv)} raised") from box["error"]
    return int(box["code"]), captured.out, captured.err


def one_line(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str], *words: str) -> str:
    code, out, err = run(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 2, f"{' '.join(argv)}: exit {code}\n{out}{err}"
    assert len(lines) == 1 and lines[0].startswith("hpctrain "), err
    for word in words:
        assert word in lines[0], err
    return lines[0]


def test_the_stand_in_serves_a_namespace_every_command_reads(api: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The baseline the other tests spoil: each command reads it without a complaint about the answers."""
    for name, argv in COMMANDS.items():
        code, out, err = run(argv, capsys)
        assert "answered what is not" not in err and "Traceback" not in err, f"{name}: {out}{err}"
    assert run(COMMANDS["status JOB"], capsys)[1].startswith("job-1: RUNNING")


# ---- pagination ----------------------------------------------------------------------------------------------------


def test_a_continue_token_that_never_changes_is_refused_at_its_first_repeat(
    api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    def same_token(segments: list[str], query: dict[str, list[str]], served: dict[str, Any]) -> tuple[int, dict, Any]:
        status, headers, body = serve(segments, query, served)
        if "items" in body:
            body["metadata"]["continue"] = "always-the-same"
        return status, headers, body

    api.answer = same_token
    for name in ("status", "cluster"):
        api.requests.clear()
        one_line(COMMANDS[name], capsys, api.address, "continue token an earlier page gave", "never end")
        assert len(api.requests) <= 4, api.requests  # the first page, the repeat; status may read a namespace


def test_a_list_that_offers_pages_for_ever_ends_at_its_deadline(
    api: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HPCTRAIN_K8S_TIMEOUT", "0.2")  # a list gets 16 times that: 3.2 s
    pages = iter(range(10**9))

    def new_tokens(segments: list[str], query: dict[str, list[str]], served: dict[str, Any]) -> tuple[int, dict, Any]:
        status, headers, body = serve(segments, query, served)
        if "items" in body:
            body["metadata"]["continue"] = f"page-{next(pages)}"
        return status, headers, body

    api.answer = new_tokens
    one_line(COMMANDS["status"], capsys, api.address, "did not finish listing the PyTorchJobs within 3.2 s", "pages")


# ---- values of the wrong type or range -----------------------------------------------------------------------------


def spoil(served: dict[str, Any], key: str, where: str, value: Any) -> None:
    """Set the field at `where` (dotted, [N] for a list item) of the object(s) served at `key`."""
    for obj in served[key] if isinstance(served[key], list) else [served[key]]:
        *path, last = where.replace("[", ".[").split(".")
        node = obj
        for part in path:
            node = node[int(part[1:-1])] if part.startswith("[") else node.setdefault(part, {})
        if last.startswith("["):
            node[int(last[1:-1])] = value
        else:
            node[last] = value


SPOILED = [  # (command, served key, field, value, what the line names)
    ("status JOB", "pods", "status.containerStatuses[0].restartCount", 1e999, "out of range"),
    ("status JOB", "pods", "status.containerStatuses[0].restartCount", "3", "restartCount is a string ('3')"),
    ("status JOB", "pods", "status.containerStatuses[0].restartCount", 2**40, "restartCount is 1099511627776"),
    ("status JOB", "pods", "status.containerStatuses[0].state", {"terminated": {"exitCode": "1"}}, "exitCode"),
    ("status JOB", "pods", "status.phase", 5, "pod 'job-1-master-0': status.phase is a number (5)"),
    ("status JOB", "pods", "status.phase", ["Running"], "status.phase is a list"),
    ("status JOB", "pods", "status.phase", "Run\ud800", "status.phase is not text"),
    ("status JOB", "pods", "status.containerStatuses", {"x": 1}, "status.containerStatuses is an object, not a list"),
    ("status JOB", "pods", "metadata.labels", ["a"], "metadata.labels is a list"),
    ("status JOB", "pods", "spec.nodeName", {"n": 1}, "spec.nodeName is an object"),
    ("status JOB", "pytorchjobs/job-1", "status.conditions", "Running", "pytorchjob 'job-1': status.conditions"),
    ("status JOB", "pytorchjobs/job-1", "status.conditions[0].message", 7, "status.conditions[0].message"),
    ("status", "pytorchjobs", "spec.pytorchReplicaSpecs", {"Master": {"replicas": "1"}}, "replicas is a string"),
    ("status", "pytorchjobs", "metadata.creationTimestamp", 5, "metadata.creationTimestamp is a number"),
    ("cluster", "nodes", "status.allocatable", {"cpu": 1e999}, "out of range"),
    ("cluster", "nodes", "status.allocatable", {"cpu": ["8"]}, "node 'node-a': status.allocatable['cpu'] is a list"),
    ("cluster", "nodes", "spec.unschedulable", "false", "spec.unschedulable is a string"),
    ("cluster", "pods", "spec.containers[0].resources", {"requests": "cpu"}, "resources.requests is a string"),
    ("check", "nodes", "spec.taints", [{"key": 1, "effect": "NoSchedule"}], "spec.taints[0].key is a number"),
]


@pytest.mark.parametrize(("command", "key", "where", "value", "named"), SPOILED)
def test_a_field_of_the_wrong_type_or_range_is_one_line_naming_the_object_and_field(
    api: Any, capsys: pytest.CaptureFixture[str], command: str, key: str, where: str, value: Any, named: str
) -> None:
    spoil(api.objects, key, where, value)
    if "Infinity" in json.dumps(api.objects[key]):  # served as the text 1e999 (json writes the float as Infinity)

        def as_1e999(segments: list[str], query: dict[str, list[str]], served: dict[str, Any]) -> tuple:
            status, headers, answer = serve(segments, query, served)
            return status, headers, json.dumps(answer).replace("Infinity", "1e999").encode()

        api.answer = as_1e999
    one_line(COMMANDS[command], capsys, api.address, named)


# ---- 429 Too Many Requests -----------------------------------------------------------------------------------------


def too_many(times: int, retry_after: str) -> Callable[..., tuple[int, dict, Any]]:
    """The first `times` requests of each path are answered 429 with that Retry-After, the rest as usual."""
    asked: dict[str, int] = {}

    def answer(segments: list[str], query: dict[str, list[str]], served: dict[str, Any]) -> tuple[int, dict, Any]:
        key = "/".join(segments)
        asked[key] = asked.get(key, 0) + 1
        if asked[key] <= times:
            status = {"kind": "Status", "status": "Failure", "reason": "TooManyRequests", "code": 429}
            return (
                429,
                {"Retry-After": retry_after},
                {**status, "message": "Too many requests, please try again later."},
            )
        return serve(segments, query, served)

    return answer


def test_a_429_with_retry_after_is_honoured_within_the_deadline(api: Any, capsys: pytest.CaptureFixture[str]) -> None:
    api.answer = too_many(1, "1")
    code, out, err = run(COMMANDS["status JOB"], capsys)
    assert code == 0 and out.startswith("job-1: RUNNING"), out + err
    asked = [urlsplit(r).path for r in api.requests]
    assert all(asked.count(p) == 2 for p in asked), asked  # each path: the 429, then the answer


def test_a_429_whose_retry_after_outlasts_the_deadline_says_so(api: Any, capsys: pytest.CaptureFixture[str]) -> None:
    api.answer = too_many(10**9, "30")  # the deadline of one answer: 4 x HPCTRAIN_K8S_TIMEOUT = 4 s
    for name in ("status", "status JOB", "cluster"):
        api.requests.clear()
        line = one_line(COMMANDS[name], capsys, api.address, "asked to retry later (429 Too Many Requests")
        assert "did not answer" not in line and "Retry-After 30 s" in line, line
        assert len(api.requests) == 1, api.requests  # not sent again: the server's wait is past the deadline
