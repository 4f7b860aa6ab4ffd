"""The dev sessions page in a real browser (Debian's Chromium, headless, through Selenium; the fixtures of
test_web_browser.py) against `hpctrain web --port` on the local Slurm cluster: a JupyterLab session started from the
form, its steps shown while it starts, then listed (RUNNING, its age, no GPUs), opened (the exact tunnel command and
URL, each with a copy button; the JupyterLab they lead to answers in the same browser), and stopped with the
confirmation (dismissed first, which changes nothing). A screenshot of the page (HPCTRAIN_WEB_SCREENSHOTS=DIR keeps
it as web-dev.png, e.g. docs/images).

The tunnel itself (`ssh -N -L PORT:NODE:PORT LOGIN`) is not run: this machine has no sshd to tunnel through. The
browser opens the address the tunnel forwards to (NODE:PORT, the same path and token)."""

from __future__ import annotations

import json
import time

import pytest

from around_helpers import venv_args
from test_web_browser import WAIT_S, browser, console, screenshot  # noqa: F401 (fixtures)

pytest.importorskip("starlette", reason="the web extra (pip install 'hpctrain[web]') is not installed")
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

pytestmark = pytest.mark.slurm
START_S = 500  # a bound on a loaded shared cluster, never asserted on


@pytest.fixture
def home(tmp_path, monkeypatch):
    """The console's (and so the sessions') HPCTRAIN_HOME: set before `console` starts it."""
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def no_errors(driver) -> None:
    """The console's pages worked under their Content-Security-Policy: nothing blocked, no script failed."""
    said = [entry["message"] for entry in driver.get_log("browser")]
    assert not [m for m in said if "Content Security Policy" in m or "Uncaught" in m], said


def test_a_dev_session_started_opened_and_stopped_in_chromium(slurm_cluster, tmp_path, home, console, browser):
    base = console.split("/?token=")[0]
    browser.get(console)
    browser.get(base + "/dev")
    assert "no dev sessions" in browser.find_element(By.ID, "sessions").text
    form = browser.find_element(By.CSS_SELECTOR, "form.start")
    form.find_element(By.NAME, "name").send_keys("browser-nb")
    form.find_element(By.NAME, "cpus").clear()
    form.find_element(By.NAME, "cpus").send_keys("1")
    form.find_element(By.NAME, "time").clear()
    form.find_element(By.NAME, "time").send_keys("0:20:00")
    venv = venv_args()
    if venv:
        form.find_element(By.NAME, "venv").send_keys(venv[1])
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    state = home / "dev" / "browser-nb"
    conn: dict = {}
    try:
        WebDriverWait(browser, WAIT_S).until(lambda d: "starting browser-nb" in d.find_element(By.ID, "sessions").text)
        # the page reloads itself while the session starts, showing its steps, until it is up
        WebDriverWait(browser, START_S, poll_frequency=2).until(
            lambda d: (
                "could not start" in d.page_source
                or (
                    d.find_elements(By.CSS_SELECTOR, "#open-browser-nb code.url")
                    and not d.find_elements(By.CSS_SELECTOR, "[data-starting]")
                )
            )
        )
        assert "could not start" not in browser.page_source, browser.find_element(By.ID, "sessions").text
        conn = json.loads((state / "connection.json").read_text())
        row = browser.find_element(By.ID, "session-browser-nb").text
        assert conn["job_id"] in row and "RUNNING" in row, row
        cells = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#session-browser-nb td")]
        assert cells[6] == "0"  # GPUs held

        # open: the tunnel command and URL, exactly as `hpctrain dev start` printed them, with copy buttons
        browser.find_element(By.CSS_SELECTOR, "#open-browser-nb summary").click()
        command = browser.find_element(By.CSS_SELECTOR, "#open-browser-nb code.command")
        url = browser.find_element(By.CSS_SELECTOR, "#open-browser-nb code.url")
        assert command.text == conn["tunnel"] and url.text == conn["url"]
        copy = browser.find_element(By.CSS_SELECTOR, "#open-browser-nb button.copy")
        copy.click()
        WebDriverWait(browser, WAIT_S).until(lambda d: copy.text != "copy")
        # idle past the limit (here a second, as `dev list --idle-warn 0:01`): the warning under its row
        time.sleep(2)
        browser.get(base + "/dev?idle-warn=0:01")
        warning = browser.find_element(By.CSS_SELECTOR, "td.warning").text
        assert warning.startswith("⚠ browser-nb: idle for ") and "stop it if you are done" in warning, warning
        browser.find_element(By.CSS_SELECTOR, "#open-browser-nb summary").click()
        screenshot(browser, "web-dev.png", tmp_path)
        no_errors(browser)

        # what the tunnel leads to: the JupyterLab on NODE:PORT answers with the URL's token
        browser.get(conn["url"].replace(f"localhost:{conn['local_port']}", f"{conn['node']}:{conn['port']}"))
        WebDriverWait(browser, WAIT_S).until(lambda d: "JupyterLab" in d.title)
        browser.get_log("browser")  # JupyterLab's own messages, not the console's

        # stop, confirmed in the page's dialog; dismissed first, which changes nothing
        browser.get(base + "/dev")
        stop = browser.find_element(By.CSS_SELECTOR, "#session-browser-nb button.danger")
        stop.click()
        WebDriverWait(browser, WAIT_S).until(expected_conditions.alert_is_present()).dismiss()
        assert slurm_cluster.state(conn["job_id"]) == "RUNNING"
        stop.click()
        WebDriverWait(browser, WAIT_S).until(expected_conditions.alert_is_present()).accept()
        WebDriverWait(browser, 90).until(lambda d: "stopped" in d.find_element(By.TAG_NAME, "h1").text)
        assert "cancelled" in browser.find_element(By.TAG_NAME, "main").text
        assert slurm_cluster.state(conn["job_id"]) in ("CANCELLED", "COMPLETED", "GONE")
        browser.get(base + "/dev")
        assert "no dev sessions" in browser.find_element(By.ID, "sessions").text
        no_errors(browser)
    finally:
        if conn.get("job_id"):
            slurm_cluster.cancel_quietly(conn["job_id"])
