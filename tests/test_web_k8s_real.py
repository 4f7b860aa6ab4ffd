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
from pathlib import Path

import pytest
import yaml

from real_node import DEADLINE_S, Real, real_cpu  # noqa: F401 (fixture)
from slurm_fixtures import paused
from test_k8s_real_jobs import mnist
from test_k8s_real_pods import CONTEXT
from test_web_browser import (  # noqa: F401 (browser: a fixture)
    WAIT_S,
    assert_no_page_error,
    browser,
    checked_field,
    field,
    screenshot,
    text_of,
)

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
            # JupyterLab's own pages load slowly in a headless browser on a loaded machine: a bound, not a timing
            WebDriverWait(browser, 240).until(lambda d: "JupyterLab" in d.title)
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


def start_console(real: Real, cwd: Path, *flags: str) -> tuple[subprocess.Popen[str], str]:
    """`hpctrain web --port N --scheduler kubernetes FLAGS`; the process and its token URL."""
    console = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "web", "--port", str(free_port()), "--scheduler", "kubernetes",
         "--interval", "1", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=real.env,
    )  # fmt: skip
    url = re.search(
        r"open: (http://127\.0\.0\.1:\d+/\?token=\S+)", console.stdout.readline() + console.stdout.readline()
    )
    if url is None:
        console.kill()
        pytest.fail(f"hpctrain web did not start: {console.stderr.read()}")
    return console, url.group(1)


def job_processes(run_dir: Path) -> list[int]:
    """The processes of the pods whose HPCTRAIN_RUN_DIR is `run_dir` (the node is this machine: they are in its
    /proc): the log keeper, the launcher and the training process."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if f"HPCTRAIN_RUN_DIR={run_dir}".encode() in environ:
            found.append(int(entry.name))
    return found


PLOT_POINTS = """return Array.from(document.querySelectorAll('#plots figure'))
    .map((f) => [f.dataset.key, Number(f.dataset.points), f.querySelectorAll('circle').length])"""


@pytest.mark.slow
def test_the_job_form_and_a_pytorchjob_s_page_on_the_real_node_in_chromium(
    real_cpu: Real, tmp_path: Path, browser, fashion_data_dir: Path
) -> None:
    """`hpctrain web --context C --namespace NS` (the kubeconfig's current context is another cluster's): the job
    form holds that context and namespace; a 1-pod PyTorchJob of `train mnist` asking for 64 CPUs: Check shows the
    live check's line beside --cpus-per-task with its fix; with 1 CPU, Preview shows the PyTorchJob in NS, Submit
    creates it there and opens its page. The page shows it running, the replica's log live and rank 0's progress
    (its run directory is on a hostPath volume of the node, which is this machine, so the console reads it); it is
    cloned (the form filled from its job.yaml), stopped from the page, and the clone runs to the end: its page shows
    the plots with a point per epoch, its description and its ended log. Screenshots: the form, the clone's page."""
    real = real_cpu
    runs = tmp_path / "runs"
    runs.mkdir()
    # The pods' own run directory: HPCTRAIN_RUN_DIR, the job's --run-dir (RUNS/NAME), so a clone gets its own.
    train = [w for w in mnist(fashion_data_dir, runs, 8192, 2)]
    train = train[: train.index("--run-dir")]
    console, url = start_console(real, tmp_path, "--context", CONTEXT, "--namespace", real.namespace)
    try:
        base = url.split("/?token=")[0]
        browser.get(url)
        browser.get(base + "/jobs/new")
        assert field(browser, "namespace").get_attribute("value") == real.namespace
        assert field(browser, "context").get_attribute("value") == CONTEXT
        browser.find_element(By.CSS_SELECTOR, "input[name=what][value=command]").click()
        browser.find_element(By.ID, "command").send_keys(shlex.join(train))
        volumes = f"host:{fashion_data_dir}:{fashion_data_dir}:ro\nhost:{runs}:{runs}"
        for name, value in (
            ("name", "web-k8s"),
            ("image", real.image),
            ("nodes", "1"),
            ("cpus_per_task", "64"),  # more than the node has
            ("mem", "2G"),
            ("run_dir", f"{runs}/%j"),
            ("volumes", volumes),
        ):
            field(browser, name).send_keys(value)
        browser.find_element(By.ID, "check").click()
        beside, problem, fix = checked_field(browser, "cpus_per_task")
        assert "asks for cpu 64" in problem and "more than any node offers" in problem, problem
        assert fix.startswith("fix: ") and "--cpus-per-task" in fix, fix
        assert field(browser, "volumes").get_attribute("value") == volumes  # the form keeps what was typed
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", beside)
        screenshot(browser, "web-form-k8s.png", tmp_path)

        field(browser, "cpus_per_task").clear()
        field(browser, "cpus_per_task").send_keys("1")
        browser.find_element(By.ID, "preview-button").click()
        manifest = WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element(By.ID, "preview")).text
        assert "kind: PyTorchJob" in manifest and f"namespace: {real.namespace}" in manifest, manifest
        assert f"image: {real.image}" in manifest and "--train-limit" in manifest
        assert browser.find_elements(By.CSS_SELECTOR, ".problem.error") == []

        browser.find_element(By.ID, "submit").click()
        WebDriverWait(browser, WAIT_S).until(lambda d: d.current_url == f"{base}/job/kubernetes/web-k8s")
        assert (runs / "web-k8s" / "job.yaml").is_file()  # recorded where the pods' run directory is

        # Running: the log, followed from before its pod started, live; then (held still) rank 0's progress from
        # the run directory, and the page again, now with a log link for each replica.
        WebDriverWait(browser, DEADLINE_S, poll_frequency=1).until(lambda d: "epoch 1/2 step" in text_of(d, "log"))
        with paused(job_processes(runs / "web-k8s")):
            browser.refresh()
            WebDriverWait(browser, WAIT_S).until(
                lambda d: "RUNNING" in text_of(d, "details") and "RANK" in text_of(d, "details")
            )
            details = text_of(browser, "details")
            assert f"run dir: {runs / 'web-k8s'}" in details, details
            ranks = [line for line in details.splitlines() if line.lstrip().startswith("0 ")]
            assert ranks and ranks[0].split()[1] in {*real.nodes, "web-k8s-master-0"}, details  # its host
            replica = browser.find_element(By.XPATH, "//a[contains(@class, 'choice') and contains(., 'master-0')]")
            replica.click()
            WebDriverWait(browser, WAIT_S).until(lambda d: "epoch 1/2 step" in text_of(d, "log"))
            assert browser.current_url.endswith("replica=master-0")
            assert text_of(browser, "shell").startswith(f"kubectl --context {CONTEXT} exec -it -n {real.namespace}")

            # Clone, in a tab of its own: the form holds the job's description and the console's connection.
            page = browser.current_window_handle
            clone = browser.find_element(By.ID, "clone").get_attribute("href")
            browser.switch_to.new_window("tab")
            browser.get(clone)
            assert "the description job web-k8s was submitted with" in browser.find_element(By.ID, "form-note").text
            recorded = (
                field(browser, "namespace").get_attribute("value"),
                field(browser, "context").get_attribute("value"),
            )
            assert recorded == (real.namespace, CONTEXT)
            assert "--train-limit" in browser.find_element(By.ID, "job-file-text").get_attribute("value")
            field(browser, "name").send_keys("web-k8s-clone")

            # Stop it from its page (confirmed): its pods get SIGTERM, pending until the block lets them go on.
            browser.switch_to.window(page)
            browser.find_element(By.CSS_SELECTOR, "button.danger").click()
            WebDriverWait(browser, WAIT_S).until(expected_conditions.alert_is_present()).accept()
        WebDriverWait(browser, 90).until(lambda d: d.find_element(By.TAG_NAME, "h1").text.startswith("Stop job"))
        said = browser.find_element(By.TAG_NAME, "main").text
        assert "job web-k8s: RUNNING -> deleted" in said or "still terminating" in said, said

        # The clone runs to the end: its page shows a point per epoch in each plot, its description, its log.
        browser.switch_to.window([h for h in browser.window_handles if h != page][0])
        browser.find_element(By.ID, "submit").click()
        WebDriverWait(browser, WAIT_S).until(lambda d: d.current_url == f"{base}/job/kubernetes/web-k8s-clone")
        WebDriverWait(browser, DEADLINE_S, poll_frequency=2).until(lambda d: "SUCCEEDED" in text_of(d, "details"))
        browser.refresh()
        WebDriverWait(browser, WAIT_S).until(lambda d: ["train_loss", 2, 2] in d.execute_script(PLOT_POINTS))
        assert ["test_accuracy", 2, 2] in browser.execute_script(PLOT_POINTS)
        assert "name: web-k8s-clone" in text_of(browser, "description")
        WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element(By.ID, "log-state").text == "(ended)")
        assert "hpctrain: epoch 2/2: train loss" in text_of(browser, "log")
        browser.set_window_size(1400, 2300)  # the whole page: plots, log, attempts, description
        screenshot(browser, "web-job-k8s.png", tmp_path)
        assert_no_page_error(browser)
    finally:
        console.terminate()
        console.wait(timeout=60)
