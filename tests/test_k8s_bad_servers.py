"""Kubernetes commands against servers that misbehave on purpose, on 127.0.0.1: one that accepts and never answers,
one that drips a byte at a time, one that streams an endless body, a closed port, a server that does not speak
HTTP, HTTP 500 and 403, and a kubeconfig that is not YAML. Each command must end with one clear line and exit 2,
in bounded time (the bound comes from HPCTRAIN_K8S_TIMEOUT; the test never asserts on a duration).

These servers are test-only stand-ins for broken or hostile API servers; the real API server cannot be made to
misbehave like this.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from training_helpers import run_hpctrain

pytest.importorskip("kubernetes")
pytestmark = [pytest.mark.slow]  # each case runs the CLI against a server that makes it wait for its timeout

IMAGE = "example.invalid/hpctrain:test"
STATUS_403 = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "reason": "Forbidden",
    "code": 403,
    "message": 'pytorchjobs.kubeflow.org is forbidden: User "bob" cannot list resource "pytorchjobs"',
}
STATUS_500 = {
    "kind": "Status",
    "apiVersion": "v1",
    "status": "Failure",
    "reason": "InternalError",
    "code": 500,
    "message": "etcdserver: request timed out",
}


def _http(status: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + data


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        mode, stop = self.server.mode, self.server.stop
        sock = self.request
        sock.settimeout(0.5)
        try:
            sock.recv(65536)  # the request (its headers fit)
        except OSError:
            pass
        try:
            if mode == "silent":
                stop.wait()
            elif mode == "drip":
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
                while not stop.wait(0.2):
                    sock.sendall(b" ")
            elif mode == "endless":
                sock.sendall(
                    b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{"items": ['
                )
                chunk = b'{"metadata": {"name": "x"}},' * 2000
                while not stop.is_set():
                    sock.sendall(chunk)
            elif mode == "garbage":
                sock.sendall(b"SSH-2.0-OpenSSH_9.2\r\nthis is not HTTP\r\n")
            elif mode == "403":
                sock.sendall(_http("403 Forbidden", STATUS_403))
            elif mode == "500":
                sock.sendall(_http("500 Internal Server Error", STATUS_500))
        except OSError:
            pass  # the client gave up: what the test wants


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def _kubeconfig(path: Path, server: str, namespace: str | None = None) -> Path:
    context = {"cluster": "bad", "user": "bad", **({"namespace": namespace} if namespace else {})}
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "bad",
                "clusters": [{"name": "bad", "cluster": {"server": server}}],
                "users": [{"name": "bad", "user": {"token": "t"}}],
                "contexts": [{"name": "bad", "context": context}],
            }
        )
    )
    return path


@pytest.fixture
def bad_server(tmp_path: Path) -> Iterator:
    servers: list[_Server] = []

    def start(mode: str) -> Path:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.mode, server.stop = mode, threading.Event()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return _kubeconfig(tmp_path / f"kubeconfig-{mode}", f"http://127.0.0.1:{server.server_address[1]}")

    yield start
    for server in servers:
        server.stop.set()
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(kubeconfig: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "HPCTRAIN_K8S_TIMEOUT": "1",
        "HPCTRAIN_K8S_MAX_RESPONSE_MB": "1",
    }
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return run_hpctrain(*args, cwd=cwd, env=env)


K8S = ("--scheduler", "kubernetes")
SUBMIT = ("--image", IMAGE, "--job-name", "bad", "--", "python", "-c", "pass")
COMMANDS = {
    "status": ("status", *K8S),
    "status JOB": ("status", "job-1", *K8S),
    "check": ("check", *K8S, *SUBMIT),
    "submit --no-check": ("submit", "--no-check", *K8S, *SUBMIT),
    "cancel": ("cancel", "job-1", *K8S),
    "logs": ("logs", "job-1", *K8S),
    "cluster": ("cluster", *K8S),
}


def assert_one_line(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpctrain "), proc.stderr
    for word in words:
        assert word in lines[0], proc.stderr


@pytest.mark.parametrize("command", ["status", "status JOB", "check", "submit --no-check", "cancel", "logs"])
def test_a_server_that_never_answers_ends_each_command_with_one_line(bad_server, tmp_path: Path, command: str) -> None:
    proc = run_cli(bad_server("silent"), *COMMANDS[command], cwd=tmp_path)
    assert_one_line(proc, "did not answer within", "HPCTRAIN_K8S_TIMEOUT")
    assert not (tmp_path / "runs").exists()


def test_a_server_that_drips_hits_the_deadline(bad_server, tmp_path: Path) -> None:
    proc = run_cli(bad_server("drip"), *COMMANDS["status"], cwd=tmp_path)
    assert_one_line(proc, "did not answer within 4 s")


def test_an_endless_answer_is_cut_at_the_size_cap(bad_server, tmp_path: Path) -> None:
    proc = run_cli(bad_server("endless"), *COMMANDS["status"], cwd=tmp_path)
    assert_one_line(proc, "larger than 1 MiB", "HPCTRAIN_K8S_MAX_RESPONSE_MB")


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_closed_port_is_one_line_naming_the_server(tmp_path: Path, command: str) -> None:
    port = _closed_port()
    proc = run_cli(_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}"), *COMMANDS[command], cwd=tmp_path)
    assert_one_line(proc, f"127.0.0.1:{port}", "cannot be reached", "Connection refused", "kubectl config view")


def test_a_server_that_does_not_speak_http(bad_server, tmp_path: Path) -> None:
    proc = run_cli(bad_server("garbage"), *COMMANDS["status"], cwd=tmp_path)
    assert_one_line(proc, "did not answer in HTTP")


@pytest.mark.parametrize("mode", ["403", "500"])
@pytest.mark.parametrize("command", ["status", "status JOB", "cluster"])
def test_http_errors_are_one_line_with_the_servers_reason(bad_server, tmp_path: Path, mode: str, command: str) -> None:
    proc = run_cli(bad_server(mode), *COMMANDS[command], cwd=tmp_path)
    said = STATUS_403["message"] if mode == "403" else STATUS_500["message"]
    fix = "ask your cluster admin for the permission" if mode == "403" else "try again later"
    assert_one_line(proc, mode, said, fix)


def test_a_kubeconfig_that_is_not_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [\n  - {name: x\n: : :\n")
    proc = run_cli(bad, *COMMANDS["status"], cwd=tmp_path)
    assert_one_line(proc, "not valid YAML", str(bad))
