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


def field_value(page: str, name: str) -> str:
    """The value a text field of the form holds (its selected option for a choice)."""
    part = field_of(page, name)
    found = re.search(r'<option value="([^"]*)" selected>', part) or re.search(r'value="([^"]*)"', part)
    return html.unescape(found.group(1)) if found else ""


@pytest.mark.k8s
def test_the_form_sends_jobs_where_the_console_shows_them(k8s_cluster, keys, tmp_path: Path) -> None:
    """`hpctrain web --context C --namespace team-x`: the form's fields hold that connection (not the kubeconfig's
    defaults), a job previewed with them goes to team-x, and one the fields would send elsewhere (another namespace,
    or the context left empty: the kubeconfig's current one) is refused with the line that names the field and the
    fix: the console would not find it. Nothing is sent in any case (Preview)."""
    sched = get_scheduler("kubernetes", context=k8s_cluster.context, namespace="team-x")
    client = TestClient(create_app({"kubernetes": sched}, keys), base_url=HOST, follow_redirects=False)
    assert client.get(f"/?token={keys.token}").status_code == 303
    page = client.get("/jobs/new").text
    assert field_value(page, "namespace") == "team-x"
    assert field_value(page, "context") == k8s_cluster.context
    assert field_value(page, "k8s_api") == "pytorchjob"
    assert field_value(page, "scheduler") == "kubernetes"

    here = {"scheduler": "kubernetes", "namespace": "team-x", "context": k8s_cluster.context, "image": "python:3.12"}
    job = {**form(keys, tmp_path, "preview"), **here}
    shown = client.post("/jobs/new", data=job, headers=SAME_ORIGIN)
    assert shown.status_code == 200, texts(shown.text, "error line")
    assert "namespace: team-x" in html.unescape(re.search(r'<pre id="preview">(.*?)</pre>', shown.text, re.S)[1])
    for changed, said in (
        ({"namespace": "elsewhere"}, "--namespace elsewhere: this console shows the kubernetes jobs at "),
        ({"context": ""}, "--context left empty: this console shows the kubernetes jobs at "),
    ):
        page = client.post("/jobs/new", data={**job, **changed}, headers=SAME_ORIGIN)
        assert page.status_code == 400
        (error,) = texts(page.text, "error line")
        assert error.startswith(said) and "--namespace team-x" in error and "and would not find this one" in error
        assert '<pre id="preview">' not in page.text


@pytest.mark.k8s
def test_a_kubernetes_job_s_page_and_clone_read_its_run_directory_where_this_machine_sees_it(
    k8s_cluster, keys, tmp_path: Path
) -> None:
    """Two PyTorchJobs on the local API server, submitted as the form submits (engine.submission): one with its run
    directory on a host volume this machine has (the node would be this machine), one on an NFS volume not mounted
    here. The first's page reads its run directory (found from the job object) and its clone is filled with its
    job.yaml; the second's page says plainly that no run directory is visible from here, and its clone says why it
    cannot be filled."""
    from hpctrain.engine import submission
    from kubeflow_standin import create_namespace, delete_namespace

    api = k8s_cluster.api_client()
    namespace = create_namespace(api)
    try:
        where = ["--scheduler", "kubernetes", "--context", k8s_cluster.context, "--namespace", namespace]

        def submit(name: str, volume: str) -> None:
            argv = [*where, "--image", "python:3.12", "--job-name", name, "--volume", volume]
            flags = submission.flags_from_argv([*argv, "--run-dir", "/mnt/runs/%j"])
            flags["job_command"] = ["--", "python", "-c", "print(1)"]
            submission.submit(submission.build(flags), live=False)

        submit("seen", f"host:{tmp_path}:/mnt/runs")
        submit("unseen", "nfs:nas.invalid:/export:/mnt/runs")
        sched = get_scheduler("kubernetes", context=k8s_cluster.context, namespace=namespace)
        client = TestClient(create_app({"kubernetes": sched}, keys), base_url=HOST, follow_redirects=False)
        assert client.get(f"/?token={keys.token}").status_code == 303

        page = client.get("/job/kubernetes/seen")
        assert page.status_code == 200
        assert f'Run directory <span class="muted">{tmp_path / "seen"}</span>' in page.text
        assert "name: seen" in html.unescape(
            re.search(r'<pre class="report" id="description">(.*?)</pre>', page.text, re.S)[1]
        )
        clone = client.get("/jobs/new?from=kubernetes/seen")
        assert clone.status_code == 200 and field_value(clone.text, "namespace") == namespace
        assert "name: seen" in html.unescape(
            re.search(r'<textarea name="job_file_text"[^>]*>(.*?)</textarea>', clone.text, re.S)[1]
        )

        page = client.get("/job/kubernetes/unseen")
        assert page.status_code == 200 and "No run directory of this job is visible from here" in page.text
        clone = client.get("/jobs/new?from=kubernetes/unseen")
        assert clone.status_code == 400
        assert "job unseen: its run directory is not readable here, so its description is unknown" in clone.text
    finally:
        delete_namespace(api, namespace)
