"""The web console's security rules (hpctrain.web.guard), each tried against the real ASGI app through Starlette's
test client: a request without the token's cookie, a wrong token, a Host that is no loopback name (DNS rebinding),
a state-changing request from another origin or without the CSRF token, and the headers (CSP) on every answer.
No scheduler is reached: the one route that changes state is tried for a scheduler this console does not show, so
a request that passes the guard ends in the page's own 404, one that does not in the guard's 403."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the web extra (pip install 'hpctrain[web]') is not installed")
from starlette.testclient import TestClient

from hpctrain.errors import UserError
from hpctrain.web.app import create_app
from hpctrain.web.guard import CSP, Secrets

TEMPLATES = Path(__file__).resolve().parents[1] / "src" / "hpctrain" / "web" / "templates"
HOST = "http://localhost:8080"


@pytest.fixture
def keys() -> Secrets:
    return Secrets(token="t0ken-for-the-tests")


@pytest.fixture
def client(keys) -> TestClient:
    app = create_app({"slurm": UserError("the scheduler is not reached in these tests")}, keys)
    return TestClient(app, base_url=HOST, follow_redirects=False)


def logged_in(client: TestClient, keys: Secrets) -> TestClient:
    answer = client.get(f"/?token={keys.token}")
    assert answer.status_code == 303, answer.text
    return client


@pytest.mark.parametrize("path", ["/", "/api/jobs", "/cluster", "/job/slurm/1", "/static/console.js"])
def test_a_request_without_the_cookie_is_refused(client, path):
    answer = client.get(path)
    assert answer.status_code == 401
    assert "?token=" in answer.text


def test_a_wrong_token_is_refused_and_sets_no_cookie(client, keys):
    answer = client.get("/?token=" + keys.token[:-1] + "x")
    assert answer.status_code == 403
    assert "set-cookie" not in answer.headers
    assert client.get("/").status_code == 401


def test_the_token_becomes_an_httponly_strict_cookie_and_leaves_the_url(client, keys):
    answer = client.get(f"/cluster?token={keys.token}&x=1")
    assert answer.status_code == 303
    assert answer.headers["location"] == "/cluster?x=1"
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{keys.cookie_name}={keys.session};")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert keys.token not in cookie
    page = client.get("/")
    assert page.status_code == 200
    assert 'id="jobs"' in page.text


def test_the_token_url_redirects_within_the_console_only(client, keys):
    answer = client.get(f"{HOST}//evil.example/x?token={keys.token}")  # the path is //evil.example/x
    assert answer.status_code == 303
    assert answer.headers["location"] == "/evil.example/x"


def test_a_forged_cookie_is_refused(client, keys):
    client.cookies.set(keys.cookie_name, keys.token)  # the token is not the session key
    assert client.get("/").status_code == 401


@pytest.mark.parametrize("host", ["evil.example", "localhost.evil.example", "127.0.0.1.nip.io", "10.0.0.1", ""])
def test_a_host_that_is_no_loopback_name_is_refused_even_logged_in(client, keys, host):
    logged_in(client, keys)
    answer = client.get("/", headers={"host": host})
    assert answer.status_code == 403
    assert "Host" in answer.text
    # and the token URL under a rebound name gives no cookie
    assert "set-cookie" not in client.get(f"/?token={keys.token}", headers={"host": host}).headers


@pytest.mark.parametrize("host", ["localhost", "localhost:8080", "127.0.0.1:1", "[::1]:8080", "LOCALHOST"])
def test_loopback_hosts_are_served(client, keys, host):
    logged_in(client, keys)
    assert client.get("/", headers={"host": host}).status_code == 200


STOP = "/job/not-shown/1/stop"
# Every route that changes something: each is refused without the CSRF token or from another origin.
POSTS = [STOP, "/job/not-shown/1/preempt", "/job/not-shown/1/tensorboard", "/job/not-shown/1/resume"]


def test_a_post_from_another_origin_is_refused(client, keys):
    logged_in(client, keys)
    answer = client.post(STOP, data={"csrf": keys.csrf}, headers={"origin": "http://evil.example"})
    assert answer.status_code == 403
    assert "another origin" in answer.text
    # a loopback origin on another port is another origin too (another console, another program)
    assert client.post(STOP, data={"csrf": keys.csrf}, headers={"origin": "http://localhost:9999"}).status_code == 403


def test_a_post_with_neither_origin_nor_referer_is_refused(client, keys):
    logged_in(client, keys)
    assert client.post(STOP, data={"csrf": keys.csrf}).status_code == 403


@pytest.mark.parametrize("csrf", [None, "", "wrong", "t0ken-for-the-tests"])
@pytest.mark.parametrize("route", POSTS)
def test_a_post_without_the_csrf_token_is_refused(client, keys, csrf, route):
    logged_in(client, keys)
    data = {} if csrf is None else {"csrf": csrf}
    answer = client.post(route, data=data, headers={"origin": HOST})
    assert answer.status_code == 403
    assert "CSRF" in answer.text


@pytest.mark.parametrize("route", POSTS)
def test_every_post_route_is_refused_from_another_origin_and_passes_with_the_token(client, keys, route):
    """The routes exist as POSTs (a GET is no way to reach them) and pass only the guard's rules."""
    logged_in(client, keys)
    assert client.get(route).status_code == 405
    answer = client.post(route, data={"csrf": keys.csrf}, headers={"origin": "http://evil.example"})
    assert answer.status_code == 403 and "another origin" in answer.text
    passed = client.post(route, data={"csrf": keys.csrf}, headers={"origin": HOST})
    assert passed.status_code == 404 and "no scheduler" in passed.text, passed.text


def test_a_same_origin_post_with_the_csrf_token_passes_the_guard(client, keys):
    logged_in(client, keys)
    by_form = client.post(STOP, data={"csrf": keys.csrf}, headers={"origin": HOST})
    by_header = client.post(STOP, headers={"referer": HOST + "/job/x/1", "x-csrf-token": keys.csrf})
    for answer in (by_form, by_header):
        assert answer.status_code == 404, answer.text  # the page's own answer: no such scheduler here
        assert "no scheduler" in answer.text


def test_a_post_without_the_cookie_is_refused_first(client, keys):
    answer = client.post(STOP, data={"csrf": keys.csrf}, headers={"origin": HOST})
    assert answer.status_code == 401


@pytest.mark.parametrize("path", ["/", "/static/console.js", "/nowhere", "/?token=wrong"])
def test_every_answer_has_the_csp_and_no_sniffing(client, keys, path):
    if path != "/?token=wrong":
        logged_in(client, keys)
    for answer in (client.get(path), client.get(path, headers={"host": "evil.example"})):
        assert answer.headers["content-security-policy"] == CSP
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["x-frame-options"] == "DENY"
    assert "script-src 'self';" in CSP and "unsafe" not in CSP and "default-src 'none'" in CSP


def test_no_template_holds_inline_script_or_handlers():
    """What the CSP forbids, the templates do not try: every <script> has a src, no on*= attribute, no style=."""
    for template in TEMPLATES.glob("*.html"):
        text = template.read_text()
        for tag in re.findall(r"<script\b[^>]*>", text):
            assert "src=" in tag, f"{template.name}: inline script {tag}"
        assert not re.search(r"\son[a-z]+\s*=", text), template.name
        assert not re.search(r"\sstyle\s*=", text), template.name
        assert "http://" not in text and "https://" not in text, f"{template.name}: an asset from elsewhere"


def test_a_scheduler_that_cannot_answer_is_one_line_on_the_page(client, keys):
    logged_in(client, keys)
    answer = client.get("/api/jobs")
    assert answer.status_code == 200
    (section,) = answer.json()["schedulers"]
    assert section == {"name": "slurm", "error": "the scheduler is not reached in these tests"}
    assert answer.json()["rows"] == []
    page = client.get("/job/slurm/1")
    assert page.status_code == 400
    assert "the scheduler is not reached in these tests" in page.text


def test_strings_from_a_scheduler_are_text_with_hidden_characters_made_visible(keys):
    """What a backend returns (a View of Tables and lines) on a page: a name with HTML, an escape sequence, a bidi
    override and a line separator shows each visibly, in the table and in a line; nothing of it is markup."""
    from hpctrain.schedulers.base import Table, View
    from hpctrain.web.safeview import view_parts

    name = "<b>x</b>\x1b[2J\u202egpj.exe\u2028forged"
    view = View(records=[], parts=(Table(("job", "name"), [("7", name)], title=name), "reason: " + name))
    shown = "<b>x</b>\\x1b[2J\\u202egpj.exe\\u2028forged"
    assert view_parts(view) == [
        {"table": {"title": shown, "columns": ["job", "name"], "rows": [["7", shown]]}},
        {"line": "reason: " + shown},
    ]
    html = create_app({}, keys).state.console.env.get_template("parts.html").module.show(view_parts(view), "s")
    assert "&lt;b&gt;x&lt;/b&gt;\\x1b[2J\\u202egpj.exe\\u2028forged" in html
    assert "<b>" not in html and "\x1b" not in html and "\u202e" not in html


def test_one_hidden_character_among_many_cells_is_made_visible_in_its_cell_only():
    """A node table's cells are checked as a whole and given back as they are when all are printable; one cell of
    10,000 rows that is not (its last) is escaped, and only that one."""
    from hpctrain.schedulers.base import Table, View
    from hpctrain.web.safeview import view_parts

    rows = [(f"node{i}", "idle", "96/96") for i in range(10_000)]
    rows[-1] = ("node\u202eevil", "idle", "96/96")
    (part,) = view_parts(View(records=[], parts=(Table(("node", "state", "CPUs"), rows),)))
    shown = part["table"]["rows"]
    assert shown[:-1] == [list(row) for row in rows[:-1]]
    assert shown[-1] == ["node\\u202eevil", "idle", "96/96"]


def test_a_websocket_is_refused(client, keys):
    from starlette.websockets import WebSocketDisconnect

    logged_in(client, keys)
    with pytest.raises(WebSocketDisconnect) as refused:
        with client.websocket_connect("/api/jobs"):
            pass
    assert refused.value.code == 1008
