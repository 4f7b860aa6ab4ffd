"""The web console in a real browser: Debian's Chromium, headless, driven by Selenium through chromedriver, against
`hpctrain web --port` on the local Slurm cluster.

It logs in through the token URL (and a browser without the cookie is refused), finds a held job named
`<img src=x onerror=window.__pwned=1>` in the live jobs table as text, with no element made of it and the script
flag unset; searches and sorts the table; follows a job's log whose lines hold HTML; shows the cluster; stops a job
with the confirmation; and takes a screenshot of each page (HPCTRAIN_WEB_SCREENSHOTS=DIR keeps them, e.g.
docs/images)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the web extra (pip install 'hpctrain[web]') is not installed")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium (the dev extra) is not installed")
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from slurm_fixtures import Job
from training_helpers import hpctrain, ok

pytestmark = pytest.mark.slurm

HOSTILE = "<img src=x onerror=window.__pwned=1>"
LOG_SCRIPT = 'for i in 1 2 3; do echo "step $i <b>loss</b> <script>window.__pwned=2</script>"; done'
WAIT_S = 60


def chromium() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.skip("Debian's chromium and chromium-driver are not installed: apt-get install chromium chromium-driver")
    return browser, driver


@pytest.fixture
def console(slurm_cluster, tmp_path):
    """`hpctrain web --port` on a free loopback port; its token URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "web", "--port", str(port), "--scheduler", "slurm", "--interval", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    lines = [process.stdout.readline(), process.stdout.readline()]
    found = re.search(r"open: (http://127\.0\.0\.1:\d+/\?token=\S+)", "".join(lines))
    if found is None:
        process.kill()
        pytest.fail(f"hpctrain web did not start: {lines} {process.stderr.read()}")
    yield found.group(1)
    process.terminate()
    process.wait(timeout=60)


@pytest.fixture
def browser():
    binary, driver_path = chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    # --no-sandbox: the tests run as root in CI, where Chromium's sandbox refuses to start.
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,900",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console: CSP reports, errors
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver_path), options=options)
    yield driver
    driver.quit()


def screenshot(driver, name: str, tmp_path: Path) -> None:
    folder = Path(os.environ.get("HPCTRAIN_WEB_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(folder / name))


ROWS = """return Array.from(document.querySelectorAll('#jobs tbody tr')).filter((r) => !r.hidden)
    .map((r) => Array.from(r.cells).map((c) => c.textContent));"""


def rows(driver) -> list[list[str]]:
    """The jobs table's visible rows as text, read in one go (the page redraws the table when the jobs change)."""
    return driver.execute_script(ROWS)


def row_of(driver, job: str) -> list[str]:
    return WebDriverWait(driver, WAIT_S).until(lambda d: next((r for r in rows(d) if r[1] == job), None))


def natural(text: str) -> list:
    """The key that orders 9 before 10 (the page's collator with numeric: true)."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text) if part]


def click(driver, xpath: str) -> None:
    """A real click on the element at `xpath`, found again if a redraw replaced it meanwhile."""

    def clicked(d) -> bool:
        try:
            d.find_element(By.XPATH, xpath).click()
            return True
        except StaleElementReferenceException:
            return False

    WebDriverWait(driver, WAIT_S).until(clicked)


def test_the_console_in_chromium(slurm_cluster, tmp_path, console, browser):
    held = slurm_cluster.sbatch("--hold", f"--job-name={HOSTILE}", "--wrap", "sleep 60", cwd=tmp_path)
    logged = slurm_cluster.sbatch(
        "--job-name=web-log", f"--output={tmp_path}/out-%j.log", "--wrap", LOG_SCRIPT, cwd=tmp_path
    )
    try:
        base = console.split("/?token=")[0]
        # Without the cookie: refused.
        browser.get(base + "/")
        assert "not logged in" in browser.find_element(By.TAG_NAME, "body").text

        # The token URL logs in and leaves the address bar without the token.
        browser.get(console)
        assert browser.current_url == base + "/"
        scheduler, _, name, state, shape, _, age, restarts = row_of(browser, held)
        assert (scheduler, name, state, shape, restarts) == ("slurm", HOSTILE, "PENDING", "1 × 1", "0")
        assert re.fullmatch(r"\d+s|\d+m", age), age  # counted by the page from when it was submitted
        assert browser.execute_script("return document.querySelectorAll('#jobs img').length") == 0
        assert browser.execute_script("return typeof window.__pwned") == "undefined"
        (cookie,) = browser.get_cookies()
        assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
        assert browser.execute_script("return document.cookie") == ""

        # Search, then sort.
        search = browser.find_element(By.ID, "search")
        search.send_keys(held)
        assert [r[1] for r in rows(browser)] == [held]
        search.clear()
        search.send_keys(" ")  # an input event with no words: every row again
        header = "//div[@id='jobs']//th[text()='job']"
        click(browser, header)
        click(browser, header)
        sorted_by = "return document.evaluate(arguments[0], document).iterateNext().dataset.sort"
        assert browser.execute_script(sorted_by, header) == "desc"
        ids = [r[1] for r in rows(browser)]  # 12, 12_3 (an array task of other tests), 100: in numeric order
        assert len(ids) > 1 and ids == sorted(ids, key=natural, reverse=True)
        WebDriverWait(browser, WAIT_S).until(lambda d: "as of" in d.find_element(By.ID, "taken").text)
        assert row_of(browser, held)[1] == held  # still the table (after the live updates) when it is taken
        screenshot(browser, "web-jobs.png", tmp_path)

        # A job's page: its details and its log, followed live, as text.
        slurm_cluster.wait_state(logged, {"COMPLETED", "GONE"})
        browser.get(f"{base}/job/slurm/{logged}")
        WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element(By.ID, "log-state").text == "(ended)")
        log = browser.find_element(By.ID, "log").text
        assert "step 3 <b>loss</b> <script>window.__pwned=2</script>" in log
        assert browser.find_elements(By.CSS_SELECTOR, "#log b, #log script") == []
        assert browser.execute_script("return typeof window.__pwned") == "undefined"
        # The details said the job ended: the page stopped asking for them (console.js poll).
        WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element(By.ID, "details").get_attribute("data-ended"))

        # The cluster.
        browser.get(base + "/cluster")  # its tables drawn by the page from /api/cluster
        first_cells = (
            "return Array.from(document.querySelectorAll('#cluster tbody td:first-child')).map((c) => c.textContent)"
        )
        WebDriverWait(browser, WAIT_S).until(lambda d: {"node1", "node2"} <= set(d.execute_script(first_cells)))
        # Does a job of 3 nodes fit? The form asks the scheduler's own check, which names the fix.
        field = browser.find_element(By.CSS_SELECTOR, "#fit input[name=nodes]")
        field.clear()
        field.send_keys("3")
        browser.find_element(By.CSS_SELECTOR, "#fit button").click()
        answer = WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element(By.ID, "fit-slurm")).text
        assert "--nodes 3: partition debug has only 2 node(s)" in answer
        WebDriverWait(browser, WAIT_S).until(lambda d: {"node1", "node2"} <= set(d.execute_script(first_cells)))
        screenshot(browser, "web-cluster.png", tmp_path)

        # Stop, confirmed in the page's dialog; dismissed first, which changes nothing.
        browser.get(f"{base}/job/slurm/{held}")
        stop = browser.find_element(By.CSS_SELECTOR, "button.danger")
        stop.click()
        WebDriverWait(browser, WAIT_S).until(expected_conditions.alert_is_present()).dismiss()
        assert slurm_cluster.state(held) == "PENDING"
        stop.click()
        WebDriverWait(browser, WAIT_S).until(expected_conditions.alert_is_present()).accept()
        WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element(By.TAG_NAME, "h1").text.startswith("Stop job"))
        assert slurm_cluster.wait_state(held, {"CANCELLED", "GONE"}, timeout_s=WAIT_S)
        assert browser.execute_script("return typeof window.__pwned") == "undefined"

        # Every page worked under its own Content-Security-Policy: nothing was blocked, no script failed.
        assert_no_page_error(browser)
    finally:
        slurm_cluster.cancel_quietly(held)
        slurm_cluster.cancel_quietly(logged)


def assert_no_page_error(driver) -> None:
    """Every page so far worked under its own Content-Security-Policy: the browser's log has no blocked resource and
    no script error."""
    said = [entry["message"] for entry in driver.get_log("browser")]
    assert not [m for m in said if "Content Security Policy" in m or "Uncaught" in m], said


def field(driver, name: str):
    return driver.find_element(By.ID, f"in-{name}")


def test_the_job_form_in_chromium(slurm_cluster, tmp_path, console, browser):
    """Fill the form, Check shows a problem beside its field with its fix, fix it, Preview shows the script, Submit
    opens the new job's page; the job is cancelled at the end."""
    base = console.split("/?token=")[0]
    browser.get(console)
    browser.get(base + "/jobs/new")
    browser.find_element(By.CSS_SELECTOR, "input[name=what][value=command]").click()
    browser.find_element(By.ID, "command").send_keys("sleep 300")
    for name, value in (
        ("name", "web-form"),
        ("time", "5"),
        ("run_dir", "runs/web-form-%j"),  # in the console's working directory, tmp_path
        ("partition", "debug"),
        ("nproc_per_node", "64"),  # more processes than a node has CPUs
    ):
        field(browser, name).send_keys(value)
    browser.find_element(By.ID, "check").click()
    beside, problem, fix = checked_field(browser, "nproc_per_node")
    assert problem.startswith("--nproc-per-node 64") and "CPUs" in problem and fix.startswith("fix: "), problem
    assert field(browser, "partition").get_attribute("value") == "debug"  # the form keeps what was typed
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", beside)
    screenshot(browser, "web-form.png", tmp_path)

    field(browser, "nproc_per_node").clear()
    field(browser, "nproc_per_node").send_keys("1")
    browser.find_element(By.ID, "preview-button").click()
    script = WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element(By.ID, "preview")).text
    assert "#SBATCH --partition=debug" in script and "sleep 300" in script
    assert browser.find_elements(By.CSS_SELECTOR, ".problem.error") == []

    browser.find_element(By.ID, "submit").click()
    WebDriverWait(browser, WAIT_S).until(lambda d: re.search(r"/job/slurm/\d+$", d.current_url))
    job_id = browser.current_url.rsplit("/", 1)[1]
    try:
        assert browser.find_element(By.TAG_NAME, "h1").text.startswith(f"Job {job_id}")
        assert (tmp_path / "runs" / f"web-form-{job_id}" / "job.yaml").is_file()
        assert_no_page_error(browser)
    finally:
        slurm_cluster.cancel_quietly(job_id)


def checked_field(driver, name: str, wait_s: float = WAIT_S) -> tuple[object, str, str]:
    """After **Check**: the answered page's field `name`, its problem and its fix, read together. The page before
    the answer, still there for a moment, has the field too: an element of it goes stale, and is read again."""

    def answered(d):
        beside = d.find_element(By.ID, f"field-{name}")
        problem = beside.find_element(By.CSS_SELECTOR, ".problem.error")
        return beside, problem.text, beside.find_element(By.CSS_SELECTOR, ".fix").text

    return WebDriverWait(driver, wait_s, ignored_exceptions=(StaleElementReferenceException,)).until(answered)


def text_of(driver, element_id: str) -> str:
    return driver.execute_script(
        "const e = document.getElementById(arguments[0]); return e ? e.innerText : ''", element_id
    )


@pytest.mark.slow
def test_a_training_job_s_page_in_chromium(slurm_cluster, tmp_path, console, browser, fashion_data_dir):
    """A real `train mnist` job submitted with `hpctrain submit`: its page shows it running with each rank's
    progress and the live log; the clone link and the shell command (copied by its button); once it has run, the plot
    of each series has a point per epoch; and its run directory's description and attempts; resume (confirmed) opens
    the page of the new job that continues it."""
    train = ["train", "mnist", "--dataset", "fashion-mnist", "--data-dir", str(fashion_data_dir), "--recipe", "classic"]
    train += ["--train-limit", "2048", "--test-limit", "500", "--epochs", "2", "--log-interval", "0"]
    submitted = hpctrain(
        "submit", "--launcher", "single", "--job-name", "web-train", "--output", "job-%j.out", *train, cwd=tmp_path
    )
    job_id = ok(submitted).stdout.strip()
    job = Job(job_id, tmp_path, tmp_path / "runs" / f"mnist-fashion-mnist-classic-{job_id}")
    resumed: list[str] = []
    try:
        base = console.split("/?token=")[0]
        browser.get(console)
        browser.get(f"{base}/job/slurm/{job_id}")
        # Running, each rank's live record (the run directory's, as `hpctrain status JOB` shows it), the live log.
        WebDriverWait(browser, 600).until(lambda d: "epoch 1/2 step" in text_of(d, "log"))
        WebDriverWait(browser, 300).until(  # the details poll every interval; a loaded machine delays them
            lambda d: "RUNNING" in text_of(d, "details") and "RANK" in text_of(d, "details")
        )
        ranks = [line for line in text_of(browser, "details").splitlines() if line.lstrip().startswith("0 ")]
        assert ranks and ranks[0].split()[1] in ("node1", "node2"), text_of(browser, "details")  # rank 0, its host
        clone = browser.find_element(By.ID, "clone").get_attribute("href")
        assert clone == f"{base}/jobs/new?from=slurm/{job_id}"
        assert text_of(browser, "shell") == f"srun --jobid {job_id} --overlap --pty bash"
        copy = browser.find_element(By.CSS_SELECTOR, "button.copy")
        copy.click()
        WebDriverWait(browser, WAIT_S).until(lambda d: copy.text != "copy")

        job.follow()
        # After it ran: a point per epoch in each plot, and the attempt that completed.
        browser.get(f"{base}/job/slurm/{job_id}")
        points = """return Array.from(document.querySelectorAll('#plots figure'))
            .map((f) => [f.dataset.key, f.dataset.points, f.querySelectorAll('circle').length])"""
        WebDriverWait(browser, WAIT_S).until(lambda d: ["train_loss", "2", 2] in d.execute_script(points))
        assert ["test_accuracy", "2", 2] in browser.execute_script(points)
        assert "--train-limit" in text_of(browser, "description")
        assert "completed" in browser.find_element(By.XPATH, "//h3[text()='Attempts']/following-sibling::table").text
        WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element(By.ID, "log-state").text == "(ended)")
        browser.set_window_size(1400, 2300)  # the whole page: plots, log, attempts, description
        screenshot(browser, "web-job.png", tmp_path)
        # Resume, confirmed: a new job continues the run directory, and its page opens.
        browser.find_element(By.ID, "resume-button").click()
        WebDriverWait(browser, WAIT_S).until(expected_conditions.alert_is_present()).accept()
        WebDriverWait(browser, 120).until(lambda d: re.search(r"/job/slurm/\d+$", d.current_url))
        resumed.append(browser.current_url.rsplit("/", 1)[1])
        assert resumed[0] != job_id and browser.find_element(By.TAG_NAME, "h1").text.startswith(f"Job {resumed[0]}")
        assert_no_page_error(browser)
    finally:
        slurm_cluster.cancel_quietly(job_id)
        for again in resumed:
            slurm_cluster.cancel_quietly(again)
