"""Dev sessions on the local cluster's REAL node (tests/real_node.py: a kubelet with containerd runs the pods; the
training image is the host's Python with JupyterLab): `hpctrain dev save` reading what the session installed, and
the console in Chromium (the fixtures of test_web_browser.py) listing a PyTorchJob and starting, opening (through the
real `kubectl port-forward` the page shows) and stopping a dev session from the page.

What cannot run here: the image's venv is mounted read-only into the pod, so nothing can be pip-installed in the
session; the test removes one package from the session's record of its image (the file the pod wrote at start), as
if the session had installed it. The BuildKit Job is created by the real API server and its pod by the real
controller manager, but its image cannot be pulled here (no registry): what it would push is not tested.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import socket
import subprocess
import sys

import pytest
import yaml

from real_node import DEADLINE_S, Real, real_cpu  # noqa: F401 (fixture)
from test_k8s_real_pods import CONTEXT
from test_web_browser import WAIT_S, browser, screenshot  # noqa: F401 (fixtures)

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

pytestmark = pytest.mark.k8s


def session_up(driver, name: str) -> bool:
    """The dev page shows how to open session `name`, and no start is under way (or a start failed)."""
    if "could not start" in driver.page_source:
        return True
    opened = driver.find_elements(By.CSS_SELECTOR, f"#open-{name} code.url")
    return bool(opened) and not driver.find_elements(By.CSS_SELECTOR, "[data-starting]")


def exec_in(real: Real, pod: str, script: str) -> str:
    from kubernetes import client
    from kubernetes.stream import stream

    core = client.CoreV1Api(real.api)
    return stream(
        core.connect_get_namespaced_pod_exec, pod, real.namespace, command=["sh", "-c", script], stderr=True,
        stdin=False, stdout=True, tty=False,
    )  # fmt: skip


def start_session(real: Real, name: str) -> None:
    started = real.cli(
        "dev", "start", name, *real.where, "--image", real.image, "--cpus", "1", "--mem", "2G", "--wait",
        str(DEADLINE_S),
    )  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr


def test_dev_save_builds_the_image_of_the_packages_installed_in_the_session(real_cpu: Real) -> None:
    real = real_cpu
    start_session(real, "ksave")
    try:
        nothing = real.cli("dev", "save", "ksave", "reg.example.org/me/ksave:1", *real.where)
        assert nothing.returncode == 0 and "nothing was installed with pip in session ksave" in nothing.stdout
        record = "/tmp/hpctrain-base-packages.txt"
        base = exec_in(real, "dev-ksave", f"cat {record}").splitlines()
        installed = next(line for line in base if line.lower().startswith("jinja2=="))
        exec_in(real, "dev-ksave", f"grep -iv '^jinja2==' {record} > {record}.new && mv {record}.new {record}")
        bad = real.cli("dev", "save", "ksave", "Reg/Me:1", *real.where)
        assert bad.returncode == 2 and "use REGISTRY/NAME:TAG with a lower-case name" in bad.stderr, bad.stderr
        dry = real.cli("dev", "save", "ksave", "reg.example.org/me/ksave:1", "--dry-run", *real.where)
        assert dry.returncode == 0, dry.stdout + dry.stderr
        config_map, job = list(yaml.safe_load_all(dry.stdout))
        assert config_map["data"]["requirements.txt"] == installed + "\n"
        assert config_map["data"]["Dockerfile"].startswith(f"FROM {real.image}\n")
        assert job["spec"]["template"]["spec"]["containers"][0]["args"][-1].endswith(
            "name=reg.example.org/me/ksave:1,push=true"
        )
        from kubernetes import client

        batch = client.BatchV1Api(real.api)
        assert not batch.list_namespaced_job(real.namespace).items  # --dry-run made nothing
        saved = real.cli("dev", "save", "ksave", "reg.example.org/me/ksave:1", *real.where)
        assert saved.returncode == 0, saved.stdout + saved.stderr
        assert f"build job {real.namespace}/dev-ksave-save submitted" in saved.stdout
        made = batch.read_namespaced_job("dev-ksave-save", real.namespace)
        owners = client.CoreV1Api(real.api).read_namespaced_config_map("dev-ksave-save", real.namespace).metadata
        assert [o.uid for o in owners.owner_references] == [made.metadata.uid]
    finally:
        real.cli("dev", "stop", "ksave", *real.where)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_console_on_the_real_node_in_chromium(real_cpu: Real, tmp_path, browser) -> None:
    """The jobs page lists a PyTorchJob; a dev session is started from the dev page, opened through the page's
    `kubectl port-forward` (its local port changed to a free one: 8888 may be taken on this shared machine) and
    stopped with the confirmation."""
    real = real_cpu
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed")
    kubeconfig = tmp_path / "kubeconfig"
    minified = subprocess.run(
        ["kubectl", "config", "view", "--raw", "--minify", "--context", CONTEXT], capture_output=True, text=True
    )
    kubeconfig.write_text(minified.stdout)
    env = {**real.env, "KUBECONFIG": str(kubeconfig), "HPCTRAIN_NAMESPACE": real.namespace}
    submitted = real.cli(
        "submit", *real.where, "--image", real.image, "--job-name", "web-k8s", "--nodes", "1", "--cpus-per-task",
        "1", "--mem", "1G", "--", "python", "-c", "print('hello from a pod')",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    port = free_port()
    console = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "web", "--port", str(port), "--scheduler", "kubernetes", "--interval", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
    )  # fmt: skip
    try:
        url = re.search(
            r"open: (http://127\.0\.0\.1:\d+/\?token=\S+)", console.stdout.readline() + console.stdout.readline()
        )
        assert url, console.stderr.read()
        base = url.group(1).split("/?token=")[0]
        browser.get(url.group(1))
        WebDriverWait(browser, WAIT_S).until(lambda d: "web-k8s" in d.find_element(By.ID, "jobs").text)

        screenshot(browser, "web-jobs-kubernetes.png", tmp_path)
        browser.get(base + "/dev")
        form = browser.find_element(By.CSS_SELECTOR, "form.start")
        for field, value in (("name", "web-knb"), ("cpus", "1"), ("mem", "2G"), ("image", real.image)):
            form.find_element(By.NAME, field).clear()
            form.find_element(By.NAME, field).send_keys(value)
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        WebDriverWait(browser, DEADLINE_S, poll_frequency=2).until(lambda d: session_up(d, "web-knb"))
        assert "could not start" not in browser.page_source, browser.find_element(By.ID, "sessions").text
        conn = json.loads((tmp_path / "home" / "dev" / "web-knb" / "connection.json").read_text())
        assert "RUNNING" in browser.find_element(By.ID, "session-web-knb").text
        browser.find_element(By.CSS_SELECTOR, "#open-web-knb summary").click()
        command = browser.find_element(By.CSS_SELECTOR, "#open-web-knb code.command").text
        assert command == conn["port_forward"] and command.startswith("kubectl ")
        words = shlex.split(command)
        local = free_port()
        words[-1] = f"{local}:{words[-1].split(':')[1]}"
        forward = subprocess.Popen(words, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert f"Forwarding from 127.0.0.1:{local}" in forward.stdout.readline()
            lab = browser.find_element(By.CSS_SELECTOR, "#open-web-knb code.url").text
            browser.get(lab.replace(f"localhost:{conn['local_port']}", f"127.0.0.1:{local}"))
            WebDriverWait(browser, WAIT_S).until(lambda d: "JupyterLab" in d.title)
        finally:
            forward.terminate()
            forward.wait(timeout=30)
        browser.get(base + "/dev")
        stop = browser.find_element(By.CSS_SELECTOR, "#session-web-knb button.danger")
        stop.click()
        WebDriverWait(browser, WAIT_S).until(expected_conditions.alert_is_present()).accept()
        WebDriverWait(browser, 90).until(lambda d: "stopped" in d.find_element(By.TAG_NAME, "h1").text)
        assert "deleted" in browser.find_element(By.TAG_NAME, "main").text
        real.wait("the dev pod to be gone", lambda: not [
            p for p in real.standin.core.list_namespaced_pod(real.namespace).items if p.metadata.name == "dev-web-knb"
        ])  # fmt: skip
    finally:
        console.terminate()
        console.wait(timeout=60)
        real.cli("dev", "stop", "web-knb", *real.where)
