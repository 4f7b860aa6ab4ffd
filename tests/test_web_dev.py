"""The console's dev sessions page over the real local Slurm cluster (Starlette's test client, the real
SlurmScheduler, a real JupyterLab in a real job): started from the form with the same engine function as `hpctrain
dev start`, listed with its age and GPUs, opened (the exact tunnel command and URL; the JupyterLab behind them
answers), saved (a venv session: the steps, with the advice) and stopped, each POST with the CSRF token; bad input
is the CLI's one line and changes nothing."""

from __future__ import annotations

import json
import re
import time

import pytest

pytest.importorskip("starlette", reason="the web extra (pip install 'hpctrain[web]') is not installed")
from starlette.testclient import TestClient

from around_helpers import venv_args
from hpctrain.schedulers import get_scheduler
from hpctrain.servers.common import http_get
from hpctrain.servers.sessions import SAVE_ADVICE, SessionView, idle_too_long
from hpctrain.web.app import create_app
from hpctrain.web.guard import Secrets

HOST = "http://localhost"


@pytest.fixture
def console(tmp_path, monkeypatch) -> tuple[TestClient, Secrets]:
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    keys = Secrets(token="dev-test-token")
    client = TestClient(create_app({"slurm": get_scheduler("slurm")}, keys, 1.0), base_url=HOST, follow_redirects=False)
    assert client.get(f"/?token={keys.token}").status_code == 303
    return client, keys


def post(client: TestClient, path: str, **fields: str):
    return client.post(path, data=fields, headers={"origin": HOST})


def test_the_idle_rule_is_dev_list_s() -> None:
    view = SessionView("nb", "slurm", "1", "RUNNING", 100, None, 3601, {})
    assert idle_too_long(view, 3600) and not idle_too_long(view, 3601)
    assert not idle_too_long(SessionView("nb", "slurm", "1", "RUNNING", 100, None, None, {}), 0)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"name": "Bad Name"}, "session name &#39;Bad Name&#39;: use lower-case letters"),
        ({"name": "nb", "cpus": "two"}, "CPUs &#39;two&#39;: give a whole number"),
        ({"name": "nb", "service": "vnc"}, "--service &#39;vnc&#39; is unknown: use jupyter, ssh, code"),
        ({"name": "nb", "venv": "/v", "conda_env": "c"}, "--conda-env and --venv: choose one environment"),
        ({"name": "nb", "image": "docker://x/y:1"}, "pull it once here with `hpctrain image pull"),
    ],
)
def test_bad_form_input_is_the_cli_s_one_line_and_starts_nothing(console, tmp_path, fields, error) -> None:
    client, keys = console
    page = post(client, "/dev/start", csrf=keys.csrf, **fields)
    assert page.status_code == 400 and error in page.text, page.text
    assert not list((tmp_path / "home").glob("dev/*/connection.json"))


def test_a_repeatable_flag_s_field_takes_one_value_a_line(console, tmp_path) -> None:
    """`--module A --module B` in the start form: its field (a text area) takes one value a line, each loaded in the
    session's script as `dev start` with the flag twice would; the page shows the field as a text area."""
    from hpctrain.web.dev_pages import form_config

    client, _ = console
    page = client.get("/dev")
    assert re.search(r'<textarea name="modules"', page.text) and re.search(r'<input name="partition">', page.text)
    services = get_scheduler("slurm").services()
    cfg, placement = form_config({"name": ["nb"], "modules": ["cuda/12.4\n\n nccl/2.21 \n"]}, services)
    assert placement.options["modules"] == ("cuda/12.4", "nccl/2.21")
    script = services.dev_render(cfg, placement)
    assert "cuda/12.4" in script and "nccl/2.21" in script, script


def test_stop_and_save_need_the_csrf_token_and_a_known_session(console) -> None:
    client, keys = console
    for path in ("/dev/nb/stop", "/dev/nb/save", "/dev/start"):
        assert post(client, path, csrf="forged").status_code == 403
        assert client.post(path, data={"csrf": keys.csrf}, headers={"origin": "http://evil.example"}).status_code == 403
    missing = post(client, "/dev/nb/stop", csrf=keys.csrf)
    assert missing.status_code == 400 and "no dev session named &#39;nb&#39;: see `hpctrain dev list`" in missing.text


@pytest.mark.slurm
def test_a_session_is_started_opened_saved_and_stopped_from_the_page(console, slurm_cluster, tmp_path) -> None:
    client, keys = console
    venv = venv_args()
    fields = {"name": "web-nb", "cpus": "1", "time": "0:20:00", **({"venv": venv[1]} if venv else {})}
    started = post(client, "/dev/start", csrf=keys.csrf, **fields)
    assert started.status_code == 303 and started.headers["location"] == "/dev"
    again = post(client, "/dev/start", csrf=keys.csrf, **fields)  # while the first is starting: refused
    assert again.status_code == 400 and "is being started right now" in again.text
    state = tmp_path / "home" / "dev" / "web-nb"
    conn: dict = {}
    try:
        deadline = time.monotonic() + 500  # a bound on a loaded shared cluster, never asserted on
        page = ""
        while time.monotonic() < deadline:
            page = client.get("/dev").text
            if (state / "connection.json").exists():
                conn = json.loads((state / "connection.json").read_text())
            if conn.get("url") and "data-starting" not in page:
                break
            assert "could not start" not in page, page
            time.sleep(2)
        assert conn.get("url"), page
        row = re.search(r'<tr id="session-web-nb".*?</tr>', page, re.S).group(0)
        assert conn["job_id"] in row and "RUNNING" in row and ">0</td>" in row  # job, state, GPUs held
        # open: the exact tunnel command and URL of `dev start`, each with a copy button
        assert f'<code class="command">{conn["tunnel"]}</code> <button type="button" class="copy">' in page
        assert f'<code class="url">{conn["url"].replace("&", "&amp;")}</code>' in page
        token = conn["url"].split("token=", 1)[1]
        assert http_get(f"http://{conn['node']}:{conn['port']}/api/status", token)[0] == 200  # what the tunnel reaches
        # idle: the rule of `dev list --idle-warn`, its default an hour; a bad time is its one line
        assert 'class="warning"' not in page
        time.sleep(2)
        idle = client.get("/dev?idle-warn=0:01").text
        assert re.search(r'class="warning">⚠ web-nb: idle for \d\d:\d\d:\d\d while holding its node', idle), idle
        bad = client.get("/dev?idle-warn=2h")
        assert bad.status_code == 400 and "idle-warn &#39;2h&#39;: give a time as --time takes it" in bad.text
        # save: a venv session has nothing to save; the page gives the steps and the advice
        saved = post(client, "/dev/web-nb/save", csrf=keys.csrf, image=str(tmp_path / "nb.sqsh"))
        assert saved.status_code == 200 and "not saved (what to do instead)" in saved.text, saved.text
        assert "pip freeze &gt; requirements.txt" in saved.text and SAVE_ADVICE in saved.text
        # stop
        stopped = post(client, "/dev/web-nb/stop", csrf=keys.csrf)
        assert stopped.status_code == 200 and "cancelled" in stopped.text, stopped.text
        assert slurm_cluster.state(conn["job_id"]) in ("CANCELLED", "COMPLETED", "GONE")
        assert "no dev sessions" in client.get("/dev").text
    finally:
        if conn.get("job_id"):
            slurm_cluster.cancel_quietly(conn["job_id"])
