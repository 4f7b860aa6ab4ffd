"""The web console's job form (`/jobs/new`, hpctrain.web.job_form) through Starlette's test client, against the
local Slurm cluster: its fields are the job flags of `hpctrain submit` (the common ones and each backend's, with
their help text, derived from the one parser); Check shows each problem beside its field with its fix; Preview shows
the script `submit --dry-run` prints; Submit queues the job and opens its page; a bad value gets the CLI's line and
sends nothing; a POST without the CSRF token is refused; ?from=SCHEDULER/JOB fills the form from the job's record."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the web extra (pip install 'hpctrain[web]') is not installed")
from starlette.testclient import TestClient

from hpctrain.engine.submission import job_parser
from hpctrain.schedulers import get_scheduler
from hpctrain.web.app import create_app
from hpctrain.web.guard import Secrets

HOST = "http://localhost:8080"
SAME_ORIGIN = {"origin": HOST}


@pytest.fixture
def keys() -> Secrets:
    return Secrets(token="t0ken-for-the-form")


@pytest.fixture
def client(slurm_cluster, keys) -> TestClient:
    client = TestClient(create_app({"slurm": get_scheduler("slurm")}, keys), base_url=HOST, follow_redirects=False)
    assert client.get(f"/?token={keys.token}").status_code == 303
    return client


def form(keys: Secrets, tmp_path: Path, action: str, **fields: str) -> dict[str, str]:
    return {
        "csrf": keys.csrf,
        "what": "command",
        "command": "sleep 300",
        "scheduler": "slurm",
        "name": "web-form-test",
        "time": "5",
        "run_dir": str(tmp_path / "run-%j"),
        "action": action,
        **fields,
    }


def texts(page: str, cls: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(rf"<p class=\"{cls}[^\"]*\"[^>]*>(.*?)</p>", page, re.S)]


def field_of(page: str, name: str) -> str:
    found = re.search(rf'<div class="field[^"]*" id="field-{name}">(.*?)</div>', page, re.S)
    assert found, name
    return found.group(1)


def test_the_fields_are_the_job_flags_with_their_help(client) -> None:
    """Every job flag of the console's schedulers (here Slurm's, and the common ones) is a field; another backend's
    is not."""
    page = client.get("/jobs/new").text
    parser = job_parser(["slurm"])
    actions = [a for a in parser._actions if a.option_strings and a.dest not in ("job_command", "job_file")]
    assert len(actions) > 30
    every = {a.dest for a in job_parser()._actions}
    others = every - {a.dest for a in parser._actions}
    assert "namespace" in others and not [d for d in others if f'id="field-{d}"' in page]
    for action in actions:
        shown = field_of(page, action.dest)
        assert f'name="{action.dest}"' in shown and f">{action.option_strings[0]}</label>" in shown
        assert html.escape((action.help or "").replace("%%", "%"), quote=False) in shown.replace("&#39;", "'")
    assert "<legend>slurm (with --scheduler slurm)</legend>" in page  # each backend's group, by its title


def test_check_shows_each_problem_beside_its_field_with_its_fix(client, keys, tmp_path: Path) -> None:
    page = client.post("/jobs/new", data=form(keys, tmp_path, "check", partition="nosuch"), headers=SAME_ORIGIN)
    assert page.status_code == 200
    beside = field_of(page.text, "partition")
    assert "--partition nosuch: no such partition" in beside
    assert "fix: choose one of: debug, short" in html.unescape(beside)
    fixed = form(keys, tmp_path, "check", partition="debug", nproc_per_node="64")
    beside = field_of(client.post("/jobs/new", data=fixed, headers=SAME_ORIGIN).text, "nproc_per_node")
    assert "--nproc-per-node 64" in beside and "CPUs" in beside and "fix: " in beside


def test_preview_shows_the_script_the_cli_prints(client, keys, tmp_path: Path) -> None:
    page = client.post("/jobs/new", data=form(keys, tmp_path, "preview", partition="debug"), headers=SAME_ORIGIN)
    (shown,) = re.findall(r'<pre id="preview">(.*?)</pre>', page.text, re.S)
    cli = subprocess.run(
        [sys.executable, "-m", "hpctrain", "submit", "--dry-run", "--scheduler", "slurm", "--job-name", "web-form-test"]
        + ["--time", "5", "--run-dir", str(tmp_path / "run-%j"), "--partition", "debug", "--", "sleep", "300"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert html.unescape(shown) == cli.stdout and "#SBATCH --partition=debug" in cli.stdout


def test_bad_input_is_the_clis_line_on_the_page_and_sends_nothing(client, keys, tmp_path: Path) -> None:
    for fields, said in (
        ({"nproc_per_node": "x"}, "argument --nproc-per-node/--ntasks-per-node: invalid int value: 'x'"),
        ({"launcher": "mpirun"}, "argument --launcher: invalid choice: 'mpirun'"),
        ({"nodes": "0"}, "--nodes"),
        ({"command": "python 'unclosed"}, "the command: No closing quotation"),
    ):
        page = client.post("/jobs/new", data=form(keys, tmp_path, "submit", **fields), headers=SAME_ORIGIN)
        assert page.status_code == 400
        (error,) = texts(page.text, "error line")
        assert said in error
        assert fields.popitem()[1] in html.unescape(page.text)  # the form keeps what was typed
    assert list(tmp_path.iterdir()) == []


def test_a_post_without_the_csrf_token_is_refused(client, keys, tmp_path: Path) -> None:
    data = form(keys, tmp_path, "submit", partition="debug")
    del data["csrf"]
    assert client.post("/jobs/new", data=data, headers=SAME_ORIGIN).status_code == 403
    elsewhere = {"origin": "http://evil.example"}
    assert client.post("/jobs/new", data={**data, "csrf": keys.csrf}, headers=elsewhere).status_code == 403
    assert list(tmp_path.iterdir()) == []


def test_submit_opens_the_jobs_page_and_clone_fills_the_form(client, keys, tmp_path: Path, slurm_cluster) -> None:
    answer = client.post("/jobs/new", data=form(keys, tmp_path, "submit", partition="debug"), headers=SAME_ORIGIN)
    assert answer.status_code == 303, answer.text
    job_id = answer.headers["location"].rsplit("/", 1)[1]
    try:
        assert answer.headers["location"] == f"/job/slurm/{job_id}" and job_id.isdigit()
        assert (tmp_path / f"run-{job_id}" / "job.yaml").is_file()
        page = client.get(f"/jobs/new?from=slurm/{job_id}").text
        (record,) = re.findall(r'<textarea name="job_file_text"[^>]*>(.*?)</textarea>', page, re.S)
        assert "name: web-form-test" in record and "partition: debug" in record
        assert 'value="file" checked' in page
    finally:
        slurm_cluster.cancel_quietly(job_id)
