"""Kubernetes commands against kubeconfigs and API servers that mean harm or are broken: a server URL with a
password (never printed), an exec credential plugin that never returns (bounded, named, stopped), a kubeconfig
path that is a directory, and servers on 127.0.0.1 that answer HTML, empty bodies, deeply nested JSON, bytes that
are not UTF-8 or objects of the wrong shape. Every command ends with one line naming the server and what it
answered, exit 2, no traceback, in bounded time (the bound comes from HPCTRAIN_K8S_TIMEOUT; no test asserts on a
duration).

The servers are test-only stand-ins (tests/test_k8s_bad_servers.py has their pattern): a real API server cannot be
made to answer like this.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from test_k8s_bad_servers import COMMANDS, _closed_port, _kubeconfig, assert_one_line, run_cli

pytest.importorskip("kubernetes")
pytestmark = [pytest.mark.slow]


def test_a_password_in_the_servers_url_is_never_printed(tmp_path: Path) -> None:
    port = _closed_port()
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", f"http://alice:s3cr3t-pw@127.0.0.1:{port}")
    for command in ("status", "cluster", "check"):
        proc = run_cli(kubeconfig, *COMMANDS[command], cwd=tmp_path)
        assert_one_line(proc, f"http://alice:***@127.0.0.1:{port}", "cannot be reached")
        assert "s3cr3t" not in proc.stdout + proc.stderr


def test_an_exec_plugin_that_never_returns_is_named_and_stopped(tmp_path: Path) -> None:
    pid_file = tmp_path / "plugin.pid"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{_closed_port()}"}}],
                "users": [
                    {
                        "name": "u",
                        "user": {
                            "exec": {
                                "apiVersion": "client.authentication.k8s.io/v1beta1",
                                "command": "sh",
                                "args": ["-c", f"echo $$ > {pid_file}; exec sleep 600"],
                            }
                        },
                    }
                ],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    proc = run_cli(kubeconfig, *COMMANDS["status"], cwd=tmp_path)
    assert_one_line(
        proc, "did not load within 4 s", "exec credential plugin (sh) never returned", "HPCTRAIN_K8S_TIMEOUT"
    )
    plugin = int(pid_file.read_text())
    deadline = time.monotonic() + 60  # init reaps it once hpctrain has gone
    while _alive(plugin) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(plugin), f"the plugin {plugin} still runs"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_kubeconfig_that_is_a_directory(tmp_path: Path) -> None:
    folder = tmp_path / "kube"
    folder.mkdir()
    proc = run_cli(folder, *COMMANDS["status"], cwd=tmp_path)
    assert_one_line(proc, f"the kubeconfig {folder} is a directory")


# ---- a server that answers every request with the same bad answer ---------------------------------------------------


def _nested(depth: int) -> bytes:
    return b'{"items": ' + b"[" * depth + b"]" * depth + b"}"


BAD_ANSWERS: dict[str, tuple[str | None, bytes]] = {  # name -> (Content-Type, body), all with status 200
    "html": ("text/html; charset=utf-8", b"<!doctype html><html><body>Sign in to continue</body></html>"),
    "html called json": ("application/json", b"<html><body>502 Bad Gateway</body></html>"),
    "empty json": ("application/json", b""),
    "empty, no type": (None, b""),
    "deeply nested list": ("application/json", _nested(200_000)),
    "deeply nested object": ("application/json", b'{"a": ' * 100_000 + b"1" + b"}" * 100_000),
    "not utf-8": ("application/json", b'\xff\xfe{"items": []}'),
    "unknown charset": ("application/json; charset=klingon", b'{"items": []}'),
    "unknown type": ("application/x-unknown", b'{"items": []}'),
    "a number": ("application/json", b"42"),
    "a string": ("application/json", b'"ok"'),
    "null": ("application/json", b"null"),
    "a list": ("application/json", b"[]"),
    "items a string": ("application/json", b'{"items": "x", "metadata": {}}'),
    "items of numbers": ("application/json", b'{"items": [1, 2], "metadata": {}}'),
    "items empty objects": ("application/json", b'{"kind": "List", "items": [{}], "metadata": {}}'),
    "metadata a string": ("application/json", b'{"metadata": "x", "items": [{"metadata": "x", "status": "x"}]}'),
    "name a number": (
        "application/json",
        b'{"metadata": {"name": 7}, "spec": [], "status": [], "items": '
        b'[{"metadata": {"name": 7}, "spec": 5, "status": {"phase": 9}}]}',
    ),
    "status a list": (
        "application/json",
        b'{"metadata": {"name": "job-1", "namespace": "default"}, "spec": {}, '
        b'"status": [1], "items": [{"metadata": {"name": "n"}, "status": [1]}]}',
    ),
}


def _random_shape(rng, depth: int = 0):
    """A JSON value with Kubernetes' words in the wrong places: the fuzz part of the answers."""
    keys = (
        "items",
        "metadata",
        "name",
        "status",
        "spec",
        "phase",
        "conditions",
        "containerStatuses",
        "nodeName",
        "allocatable",
        "replicaStatuses",
        "type",
        "reason",
        "message",
        "kind",
    )
    choice = rng.randrange(7 if depth < 4 else 4)
    if choice == 0:
        return rng.choice([None, True, -1, 2**70, 1.5e308, "", "x" * rng.randrange(1, 50)])
    if choice == 1:
        return rng.choice(["job-1", "Running", "1Gi", "nan", "[/bold]"])
    if choice == 2:
        return rng.randrange(-5, 5)
    if choice == 3:
        return []
    if choice == 4:
        return [_random_shape(rng, depth + 1) for _ in range(rng.randrange(1, 4))]
    return {rng.choice(keys): _random_shape(rng, depth + 1) for _ in range(rng.randrange(1, 6))}


def _fuzzed_answers(count: int, seed: int = 29) -> dict[str, tuple[str | None, bytes]]:
    import random

    rng = random.Random(seed)
    answers = {}
    for i in range(count):
        value = {
            "items": [_random_shape(rng) for _ in range(2)],
            "metadata": _random_shape(rng),
            "status": _random_shape(rng),
            "spec": _random_shape(rng),
        }
        answers[f"fuzz {i}"] = ("application/json", json.dumps(value).encode())
    return answers


ANSWERS = {**BAD_ANSWERS, **_fuzzed_answers(8)}


class _Answer(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        content_type, body = self.server.answer
        self.send_response(200)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def answering() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    server.daemon_threads = True
    server.answer = BAD_ANSWERS["html"]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


K8S_WHERE = ("--scheduler", "kubernetes", "--namespace", "default")
ANSWER_COMMANDS = {
    "status": ("status", *K8S_WHERE),
    "status JOB": ("status", "job-1", *K8S_WHERE),
    "cluster": ("cluster", *K8S_WHERE),
    "check": ("check", *K8S_WHERE, "--image", "example.invalid/x:1", "--job-name", "bad", "--", "python", "-c", "pass"),
    "cancel": ("cancel", "job-1", *K8S_WHERE),
    "logs": ("logs", "job-1", *K8S_WHERE),
    "top": ("top", "job-1", *K8S_WHERE),
    "debug stacks": ("debug", "stacks", "job-1", *K8S_WHERE, "--wait", "1"),
    "tensorboard --on-cluster": ("tensorboard", "runs/x", "--on-cluster", *K8S_WHERE, "--image", "example.invalid/x:1"),
}


def _in_process(argv: tuple[str, ...], capsys) -> tuple[int, str, str]:
    """main(argv) on a thread of its own: a command that never ends fails the test instead of hanging it."""
    from hpctrain.cli import main

    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["code"] = main(list(argv))
        except BaseException as err:  # reported by the test below, with its traceback
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), f"{' '.join(argv)} still runs after 120 s"
    captured = capsys.readouterr()
    if "error" in box:
        raise AssertionError(f"{' '.join(argv)} raised") from box["error"]
    return int(box["code"]), captured.out, captured.err


@pytest.mark.parametrize("answer", list(ANSWERS))
def test_every_command_ends_in_one_line_naming_the_server_whatever_it_answers(
    answering, answer: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    answering.answer = ANSWERS[answer]
    server = f"127.0.0.1:{answering.server_address[1]}"
    kubeconfig = str(_kubeconfig(tmp_path / "kubeconfig", f"http://{server}"))
    monkeypatch.setenv("KUBECONFIG", kubeconfig)
    # The client reads KUBECONFIG once, when imported: in a fresh `hpctrain` process that is this one.
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", kubeconfig)
    monkeypatch.setenv("HPCTRAIN_K8S_TIMEOUT", "5")
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "x").mkdir(parents=True)
    for command, argv in ANSWER_COMMANDS.items():
        code, out, err = _in_process(argv, capsys)
        lines = err.strip().splitlines()
        assert code != 0, f"{command} with {answer}: exit 0\n{out}{err}"
        assert len(lines) == 1 and lines[0].startswith("hpctrain "), f"{command} with {answer}:\n{err}"
        assert server in lines[0], f"{command} with {answer}: the line does not name the server:\n{err}"
