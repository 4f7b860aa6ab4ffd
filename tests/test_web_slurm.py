"""The web console's pages over the real local Slurm cluster (Starlette's test client, the real SlurmScheduler):
a job named with HTML shows as text, a log with HTML and escape sequences is sent as visible text, the jobs of
all pages come from one query per interval, and stop (a POST with the CSRF token) cancels the job."""

from __future__ import annotations

import html
import json
import re
import signal
import threading
import time

import pytest

pytest.importorskip("starlette", reason="the web extra (pip install 'hpctrain[web]') is not installed")
httpx = pytest.importorskip("httpx", reason="the dev extra (pip install 'hpctrain[dev]') is not installed")
from starlette.testclient import TestClient

from hpctrain.schedulers import get_scheduler
from hpctrain.web.app import create_app
from hpctrain.web.board import Board
from hpctrain.web.guard import Secrets
from slurm_fixtures import Job
from training_helpers import hpctrain, ok

pytestmark = pytest.mark.slurm

HOSTILE = "<img src=x onerror=window.__pwned=1>"
# The same without spaces: the job page's details come from `scontrol show job -o`, whose parser ends a name at
# its first space (the jobs table, from squeue, shows HOSTILE whole).
HOSTILE_WORD = "<svg/onload=window.__pwned=1>"
HOST = "http://localhost"
LOG_SCRIPT = "printf '<b>bold</b><script>window.__pwned=2</script>\\n\\033[31mred\\n'"


@pytest.fixture
def held_job(slurm_cluster, tmp_path) -> str:
    job = slurm_cluster.sbatch("--hold", f"--job-name={HOSTILE}", "--wrap", "sleep 60", cwd=tmp_path)
    yield job
    slurm_cluster.cancel_quietly(job)


@pytest.fixture
def held_word_job(slurm_cluster, tmp_path) -> str:
    job = slurm_cluster.sbatch("--hold", f"--job-name={HOSTILE_WORD}", "--wrap", "sleep 60", cwd=tmp_path)
    yield job
    slurm_cluster.cancel_quietly(job)


@pytest.fixture
def ended_job(slurm_cluster, tmp_path) -> str:
    job = slurm_cluster.sbatch(
        "--job-name=web-log", f"--output={tmp_path}/out-%j.log", "--wrap", LOG_SCRIPT, cwd=tmp_path
    )
    slurm_cluster.wait_state(job, {"COMPLETED", "GONE"})
    yield job


@pytest.fixture
def client(slurm_cluster) -> tuple[TestClient, Secrets]:
    keys = Secrets(token="slurm-test-token")
    client = TestClient(create_app({"slurm": get_scheduler("slurm")}, keys, 1.0), base_url=HOST, follow_redirects=False)
    assert client.get(f"/?token={keys.token}").status_code == 303
    return client, keys


def test_a_job_named_with_html_is_text_in_the_table_and_on_its_page(client, held_job, held_word_job):
    client, _ = client
    rows = {row[1]: row for row in client.get("/api/jobs").json()["rows"]}
    assert rows[held_job][2] == HOSTILE  # the name as text; the page's script sets it as textContent
    assert rows[held_word_job][2] == HOSTILE_WORD
    for job in (held_job, held_word_job):
        page = client.get(f"/job/slurm/{job}")
        assert page.status_code == 200
        assert "<img" not in page.text and "<svg" not in page.text
    assert "<td>&lt;svg/onload=window.__pwned=1&gt;</td>" in page.text


def test_an_unknown_job_is_the_cli_s_one_line(client):
    client, _ = client
    page = client.get("/job/slurm/999999999")
    assert page.status_code in (400, 404)
    assert "job 999999999 not found: Slurm forgets ended jobs" in page.text


def log_events(client, job: str):
    """(event, data) of the job's log stream, as they come."""
    with client.stream("GET", f"/api/log/slurm/{job}") as answer:
        kind = None
        for text in answer.iter_lines():
            if text.startswith("event: "):
                kind = text[len("event: ") :]
            elif text.startswith("data: "):
                yield kind, json.loads(text[len("data: ") :])
                if kind == "end":
                    return


def test_the_log_is_sent_as_visible_text(client, ended_job):
    client, _ = client
    with client.stream("GET", f"/api/log/slurm/{ended_job}") as answer:
        assert answer.headers["content-type"].startswith("text/event-stream")
    events = list(log_events(client, ended_job))
    lines = [line for kind, data in events if kind == "log" for line in data.get("lines", [])]
    assert lines == ["<b>bold</b><script>window.__pwned=2</script>", "\\x1b[31mred"]
    notes = [note for kind, data in events if kind == "log" for note in data.get("notes", [])]
    assert any(f"job {ended_job} ended" in note for note in notes), notes
    assert events[-1] == ("end", {})


def test_a_running_job_s_log_is_followed_live(client, slurm_cluster, tmp_path):
    """The job writes a line, then waits for a file that the test makes only once the page has that line; its
    second line comes on the same stream, then the end."""
    client, _ = client
    go = tmp_path / "go"
    script = f"echo first; while [ ! -e {go} ]; do sleep 0.2; done; echo second"
    job = slurm_cluster.sbatch("--job-name=web-live", f"--output={tmp_path}/out-%j.log", "--wrap", script, cwd=tmp_path)
    try:
        seen = []
        for kind, data in log_events(client, job):
            seen += data.get("lines", [])
            if seen == ["first"] and not go.exists():
                assert slurm_cluster.state(job) == "RUNNING"
                go.touch()
        assert seen == ["first", "second"]
        assert kind == "end"
    finally:
        slurm_cluster.cancel_quietly(job)


def test_a_followed_log_learns_that_its_job_ended_from_the_shared_view(slurm_cluster, tmp_path):
    """The page's log follower asks the scheduler nothing of its own (it asked squeue every 2 s, for every open
    page): it reads the job's view on the board, which the page polls anyway, so it goes on while that view says the
    job runs, even after the job ended, and ends (its last lines, the `end` event) once the view is asked again.
    The board's clock is the test's; the follower's checks are counted, not timed."""
    go = tmp_path / "go"
    script = f"echo first; while [ ! -e {go} ]; do sleep 0.2; done; echo second"
    job = slurm_cluster.sbatch("--job-name=web-ends", f"--output={tmp_path}/out-%j.log", "--wrap", script, cwd=tmp_path)
    try:
        slurm_cluster.wait_state(job, {"RUNNING"})
        scheduler = get_scheduler("slurm")
        asked: list[tuple[str, ...]] = []
        real_run = scheduler.run
        scheduler.run = lambda argv, *a, **kw: (asked.append(tuple(argv)), real_run(argv, *a, **kw))[1]
        app = create_app({"slurm": scheduler}, Secrets(token="t"), interval_s=5.0)
        console = app.state.console
        now = [0.0]
        console.board.clock = lambda: now[0]
        checks = []
        real_ended = console.job_ended
        console.job_ended = lambda *args: checks.append(real_ended(*args)) or checks[-1]
        tab = TestClient(app, base_url=HOST, follow_redirects=False)
        assert tab.get("/?token=t").status_code == 303
        assert tab.get(f"/api/job/slurm/{job}").json()["ended"] is False
        events: list[tuple[str, dict]] = []
        follower = threading.Thread(target=lambda: events.extend(log_events(tab, job)), daemon=True)
        follower.start()
        wait_for(lambda: any("first" in data.get("lines", []) for _, data in list(events)) or None, "the first line")
        go.touch()
        slurm_cluster.wait_state(job, {"COMPLETED", "GONE"})
        asked.clear()
        before = len(checks)
        wait_for(lambda: len(checks) >= before + 3 or None, "three checks of the follower after the job ended")
        assert follower.is_alive() and not any(kind == "end" for kind, _ in events)
        assert checks[before:] == [False] * (len(checks) - before)  # the view it shares says RUNNING still
        assert asked == []  # and neither it nor anything else asked Slurm meanwhile
        now[0] = 5.0  # the interval passed: the next check asks for the view again, which says the job ended
        follower.join(timeout=120)
        assert not follower.is_alive() and events[-1] == ("end", {})
        assert [line for _, data in events for line in data.get("lines", [])] == ["first", "second"]
        assert sum(1 for argv in asked if argv[0] in ("squeue", "scontrol", "sacct")) >= 1
        assert tab.get(f"/api/job/slurm/{job}").json()["ended"] is True
    finally:
        slurm_cluster.cancel_quietly(job)


def wait_for(probe, what: str, timeout_s: float = 120.0):
    """probe()'s first value that is not None, asked every 0.1 s; a bound on waiting, never asserted on."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value is not None:
            return value
        time.sleep(0.1)
    raise AssertionError(f"waited {timeout_s:g} s for {what}")


def test_the_jobs_of_all_pages_come_from_one_query_per_interval(slurm_cluster):
    now = [0.0]
    board = Board({"slurm": get_scheduler("slurm")}, interval_s=5.0, clock=lambda: now[0])
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(board.snapshot())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert board.refreshes == 1
    assert all(snapshot is seen[0] for snapshot in seen)
    now[0] = 4.9
    board.snapshot()
    assert board.refreshes == 1
    now[0] = 5.0
    board.snapshot()
    assert board.refreshes == 2


def test_every_page_and_tab_shares_one_query_per_interval(slurm_cluster, held_job):
    """Three tabs on the jobs, a job and the cluster: each thing is asked of the scheduler once per interval (a job's
    page asks for its view, how to reach it and its run directory)."""
    keys = Secrets(token="t")
    app = create_app({"slurm": get_scheduler("slurm")}, keys, interval_s=600.0)
    tabs = [TestClient(app, base_url=HOST, follow_redirects=False) for _ in range(3)]
    for tab in tabs:
        assert tab.get("/?token=t").status_code == 303
    for tab in tabs:
        assert tab.get("/api/jobs").status_code == 200
        assert tab.get(f"/job/slurm/{held_job}").status_code == 200
        assert tab.get(f"/api/job/slurm/{held_job}").json()["parts"]
        assert tab.get("/cluster").status_code == 200
        assert tab.get("/api/cluster").status_code == 200
    # the jobs, the job's view, how to reach it (its shell command, its logs), its run directory, the cluster
    assert app.state.console.board.refreshes == 5


def test_stop_is_a_post_with_the_csrf_token_and_cancels_the_job(client, held_job, slurm_cluster):
    client, keys = client
    assert client.get(f"/job/slurm/{held_job}/stop").status_code == 405  # a GET changes nothing
    refused = client.post(f"/job/slurm/{held_job}/stop", data={"csrf": "x"}, headers={"origin": HOST})
    assert refused.status_code == 403
    assert slurm_cluster.state(held_job) == "PENDING"
    page = client.post(f"/job/slurm/{held_job}/stop", data={"csrf": keys.csrf}, headers={"origin": HOST})
    assert page.status_code == 200, page.text
    assert slurm_cluster.wait_state(held_job, {"CANCELLED", "GONE"}, timeout_s=60)
    assert f"job {held_job}" in page.text


def test_the_cluster_page_shows_the_nodes(client):
    """The page itself is the form; the nodes are its JSON (drawn by the page a page at a time), versioned: asked
    again unchanged, it is a 304 with nothing sent."""
    client, _ = client
    assert client.get("/cluster").status_code == 200
    answer = client.get("/api/cluster")
    assert answer.status_code == 200
    (section,) = answer.json()["schedulers"]
    nodes = [row[0] for part in section["parts"] if "table" in part for row in part["table"]["rows"]]
    assert {"node1", "node2"} <= set(nodes)
    again = client.get("/api/cluster", headers={"if-none-match": answer.headers["etag"]})
    assert again.status_code == 304 and again.content == b""


def test_an_unchanged_jobs_table_is_a_304_with_nothing_sent(slurm_cluster, held_job, tmp_path):
    """The jobs JSON has a version (ETag): a page that sends it back while nothing changed gets 304 and no body; once
    a job changes (here: one more), the table is sent again with a new version. (The cluster is shared with other
    tests that may change their jobs between two refreshes: a changed table is a 200 whose rows did change.)"""
    keys = Secrets(token="t")
    now = [0.0]
    app = create_app({"slurm": get_scheduler("slurm")}, keys, interval_s=5.0)
    app.state.console.board.clock = lambda: now[0]
    client = TestClient(app, base_url=HOST, follow_redirects=False)
    assert client.get("/?token=t").status_code == 303
    shown = client.get("/api/jobs")
    assert shown.status_code == 200 and held_job in [row[1] for row in shown.json()["rows"]]
    unchanged = 0
    for refresh in range(1, 11):
        now[0] = 10.0 * refresh  # the board asks the scheduler again
        answer = client.get("/api/jobs", headers={"if-none-match": shown.headers["etag"]})
        if answer.status_code == 304:
            assert answer.content == b""
            unchanged += 1
            if unchanged == 2:
                break
        else:
            assert answer.status_code == 200 and answer.json()["rows"] != shown.json()["rows"]
            assert answer.headers["etag"] != shown.headers["etag"]
            shown = answer
    assert unchanged == 2
    other = slurm_cluster.sbatch("--hold", "--job-name=web-etag", "--wrap", "true", cwd=tmp_path)
    try:
        now[0] = 1000.0
        changed = client.get("/api/jobs", headers={"if-none-match": shown.headers["etag"]})
        assert changed.status_code == 200 and changed.headers["etag"] != shown.headers["etag"]
        assert other in [row[1] for row in changed.json()["rows"]]
    finally:
        slurm_cluster.cancel_quietly(other)


@pytest.mark.k8s
def test_slurm_and_kubernetes_side_by_side(slurm_cluster, k8s_cluster, held_job):
    """Both schedulers in one console (the local cluster and the local API server): each has its section on the
    jobs page and on the cluster page, neither with an error; the web package knows neither."""
    keys = Secrets(token="t")
    schedulers = {
        "slurm": get_scheduler("slurm"),
        "kubernetes": get_scheduler("kubernetes", context=k8s_cluster.context),
    }
    client = TestClient(create_app(schedulers, keys, interval_s=600.0), base_url=HOST, follow_redirects=False)
    assert client.get("/?token=t").status_code == 303
    jobs = client.get("/api/jobs").json()
    assert jobs["schedulers"] == [{"name": "slurm", "error": None}, {"name": "kubernetes", "error": None}]
    assert jobs["columns"] == ["scheduler", "job", "name", "state", "nodes × processes", "GPUs", "age", "restarts"]
    assert ["slurm", held_job] in [row[:2] for row in jobs["rows"]]
    assert client.get("/cluster").status_code == 200
    cluster = client.get("/api/cluster").json()["schedulers"]
    assert [(s["name"], s["error"]) for s in cluster] == [("slurm", None), ("kubernetes", None)]
    # each one's nodes: a table, or the line the CLI says of a cluster with none (the local API server has no node
    # unless a test registered one)
    assert all(
        any("table" in part or "no nodes" in str(part.get("line", "")) for part in s["parts"]) for s in cluster
    ), cluster


@pytest.mark.slow
def test_the_job_page_rehearses_a_preemption_and_shows_the_attempts_and_the_plot(
    slurm_cluster, tmp_path, fashion_data_dir, monkeypatch
):
    """A real `train mnist` job submitted with `hpctrain submit`: its page shows the shell command beside it (the
    backend's), the clone link and its job description; **rehearse preemption** (a POST with the CSRF token, refused
    without it) sends the warning as `debug preempt` does; the job checkpoints, requeues itself and completes; its
    page then lists two attempts, the first ended by the warning with its state saved and requeued, the second
    completed, and the plot's JSON has a point per epoch."""
    (tmp_path / "data").symlink_to(fashion_data_dir)  # relative in the job, as a user types it: `--data-dir data`
    train = ["train", "mnist", "--dataset", "fashion-mnist", "--data-dir", "data", "--recipe", "classic"]
    train += ["--train-limit", "2048", "--test-limit", "500", "--epochs", "2", "--checkpoint-every", "0"]
    submitted = hpctrain(
        "submit",
        "--launcher",
        "single",
        "--job-name",
        "web-preempt",
        "--output",
        "job-%j.out",
        *train,
        "--log-interval",
        "0",
        cwd=tmp_path,
    )
    job_id = ok(submitted).stdout.strip()
    job = Job(job_id, tmp_path, tmp_path / "runs" / f"mnist-fashion-mnist-classic-{job_id}")
    keys = Secrets(token="t")
    client = TestClient(create_app({"slurm": get_scheduler("slurm")}, keys, 0.5), base_url=HOST, follow_redirects=False)
    assert client.get("/?token=t").status_code == 303
    try:
        job.wait_for_log("epoch 1/2 step")
        page = client.get(f"/job/slurm/{job_id}")
        assert page.status_code == 200, page.text
        assert f"srun --jobid {job_id} --overlap --pty bash" in page.text
        assert f'href="/jobs/new?from=slurm/{job_id}"' in page.text
        description = re.search(r'<pre class="report" id="description">(.*?)</pre>', page.text, re.S)
        assert description and "--train-limit" in description.group(1), page.text  # job.yaml, as submitted
        preempt = f"/job/slurm/{job_id}/preempt"
        assert client.post(preempt, data={"csrf": "wrong"}, headers={"origin": HOST}).status_code == 403
        answer = slurm_cluster.interrupt_mid_run(
            job_id,
            1,
            signal.SIGUSR1,
            lambda: client.post(preempt, data={"csrf": keys.csrf}, headers={"origin": HOST}),
        )
        assert answer.status_code == 200, answer.text
        assert f"sent USR1 to job {job_id} (its batch shell), as Slurm would" in answer.text
        job.follow()  # requeued (after Slurm's BeginTime hold), resumed, completed
        assert "step finished with exit status 0" in job.log, job.log
        time.sleep(1.0)  # the board's interval: the page asks again
        page = client.get(f"/job/slurm/{job_id}")
        assert page.status_code == 200, page.text
        section = page.text.split("<h3>Attempts</h3>", 1)[1].split("</table>", 1)[0]
        attempts = re.findall(r"<tr><td>(\d+)</td>(.*?)</tr>", section)
        assert [number for number, _ in attempts] == ["1", "2"], page.text
        assert "time-limit warning or preemption: state saved, requeued" in attempts[0][1]
        assert "requeued (restart 1)" in attempts[1][1] and "<td>completed</td>" in attempts[1][1]
        plot = client.get(f"/api/metrics/slurm/{job_id}").json()
        series = {s["key"]: s["points"] for s in plot["series"]}
        assert plot["records"] == 2 and [p[0] for p in series["train_loss"]] == sorted(
            p[0] for p in series["train_loss"]
        )
        assert len(series["train_loss"]) == 2 and len(series["test_accuracy"]) == 2
        # TensorBoard on the run directory: started here by the console (a POST with the CSRF token), and answering.
        tensorboard = f"/job/slurm/{job_id}/tensorboard"
        assert client.post(tensorboard, data={"csrf": "x"}, headers={"origin": HOST}).status_code == 403
        started = client.post(tensorboard, data={"csrf": keys.csrf}, headers={"origin": HOST})
        url = re.search(r"TensorBoard on \S+: (http://127\.0\.0\.1:\d+/) on this machine", started.text)
        assert started.status_code == 200 and url, started.text
        assert httpx.get(url.group(1), timeout=30).status_code == 200
        again = client.post(tensorboard, data={"csrf": keys.csrf}, headers={"origin": HOST})
        assert url.group(1) in again.text  # one server per run directory
        # Resume, the button (a POST with the CSRF token, confirmed on the page): the CLI's resume path, whose
        # command the page shows beside it; a new job that continues this run directory (all epochs done: it says
        # so and ends), and its page opens.
        shown = re.search(r'<code id="resume">(.*?)</code>', page.text)
        where, _, command = html.unescape(shown.group(1)).partition(" && ")
        assert where == f"cd {tmp_path}" and command.startswith("hpctrain submit --job-file "), shown.group(1)
        assert f'<form method="post" action="/job/slurm/{job_id}/resume"' in page.text
        resume = f"/job/slurm/{job_id}/resume"
        # A console started elsewhere: the job's relative --data-dir and --output still mean what they meant (the
        # resume is checked and submitted from the directory the job ran in, not the console's).
        (tmp_path / "elsewhere").mkdir()
        monkeypatch.chdir(tmp_path / "elsewhere")
        assert client.post(resume, data={"csrf": "x"}, headers={"origin": HOST}).status_code == 403
        opened = client.post(resume, data={"csrf": keys.csrf}, headers={"origin": HOST})
        assert opened.status_code == 303, opened.text
        again = opened.headers["location"].rsplit("/", 1)[1]
        assert opened.headers["location"] == f"/job/slurm/{again}" and again != job_id
        resumed = Job(again, tmp_path, job.run_dir)
        try:
            assert client.get(opened.headers["location"]).status_code == 200
            recorded = (job.run_dir / "job.yaml").read_text()
            assert "--resume" in recorded and str(job.run_dir) in recorded, recorded  # the new job's description
            resumed.follow()
            assert f"{job.run_dir} is already complete" in resumed.log, resumed.log
        finally:
            slurm_cluster.cancel_quietly(again)
    finally:
        client.app.state.console.job_routes.close()
        slurm_cluster.cancel_quietly(job_id)


def test_resume_says_the_cli_s_line_where_there_is_nothing_to_resume(client, slurm_cluster, tmp_path, fashion_data_dir):
    """Resume of a job whose run directory is not readable here (not submitted by hpctrain), and of one submitted
    by `hpctrain submit` that has no checkpoint yet (held): each is its one line on the page, and nothing is
    submitted."""
    client, keys = client
    plain = slurm_cluster.sbatch("--hold", "--job-name=web-no-run-dir", "--wrap", "true", cwd=tmp_path)
    train = ["train", "mnist", "--dataset", "fashion-mnist", "--data-dir", str(fashion_data_dir), "--epochs", "1"]
    held = ok(hpctrain("submit", "--launcher", "single", "--sbatch=--hold", "--job-name", "web-held", *train,
                       cwd=tmp_path)).stdout.strip()  # fmt: skip
    try:
        answer = client.post(f"/job/slurm/{plain}/resume", data={"csrf": keys.csrf}, headers={"origin": HOST})
        assert answer.status_code == 400
        assert f"job {plain}: its run directory is not readable here" in answer.text
        answer = client.post(f"/job/slurm/{held}/resume", data={"csrf": keys.csrf}, headers={"origin": HOST})
        assert answer.status_code == 400
        assert re.search(r"--resume \S+: there is no checkpoint in \S+/checkpoints; nothing to continue", answer.text)
        time.sleep(1.0)  # the board's interval
        names = {row[1] for row in client.get("/api/jobs").json()["rows"] if row[2] in ("web-held", "web-no-run-dir")}
        # Nothing was submitted: no job of these names after them (an earlier run's may still be listed as ended).
        assert {plain, held} <= names and not [i for i in names if int(i) > int(held)], names
    finally:
        slurm_cluster.cancel_quietly(plain)
        slurm_cluster.cancel_quietly(held)


def test_the_jobs_table_shows_each_job_s_shape_gpus_age_and_restarts(client, slurm_cluster, tmp_path):
    """A job of 2 nodes of 2 tasks, a GPU each: its row in the neutral table (from Scheduler.list_jobs)."""
    client, _ = client
    job = slurm_cluster.sbatch(
        "--hold", "--job-name=web-shape", "--nodes=2", "--ntasks-per-node=2", "--gres=gpu:1", "--wrap", "true",
        cwd=tmp_path,
    )  # fmt: skip
    try:
        rows = {row[1]: row for row in client.get("/api/jobs").json()["rows"]}
        scheduler, _, name, state, shape, gpus, submitted, restarts = rows[job]
        assert (scheduler, name, state, shape, gpus, restarts) == ("slurm", "web-shape", "PENDING", "2 × 2", "2", "0")
        assert abs(submitted - time.time()) < 600  # seconds since the epoch: the page counts the age
    finally:
        slurm_cluster.cancel_quietly(job)


def test_tensorboard_for_a_job_without_a_run_directory_says_where_to_start_it(client, held_job):
    client, keys = client
    answer = client.post(f"/job/slurm/{held_job}/tensorboard", data={"csrf": keys.csrf}, headers={"origin": HOST})
    assert answer.status_code == 200
    assert f"job {held_job} has no run directory visible from this machine" in answer.text
    assert "hpctrain tensorboard --on-cluster --scheduler slurm RUN_DIR" in answer.text


def test_the_cluster_page_says_whether_a_job_fits(client):
    """The form's job against the real cluster through the scheduler's own check (2 nodes of 2 CPUs here): one that
    fits says so; too many nodes, too many CPUs and a bad value each get the CLI's line naming the fix."""
    client, _ = client

    def said(query: str) -> str:
        page = client.get("/cluster?" + query)
        assert page.status_code == 200, page.text
        found = re.search(r'<div class="fit-answer (fits|error)" id="fit-slurm">(.*?)</div>', page.text, re.S)
        assert found, page.text
        return found.group(1) + ": " + " ".join(found.group(2).split())

    assert said("nodes=1&gpus_per_node=0&cpus_per_task=1&mem=100M").startswith('fits: <p class="line">fits:')
    assert said("nodes=5").startswith("error") and "--nodes 5: partition debug has only 2 node(s)" in said("nodes=5")
    assert "999 CPUs per node: no node in partition debug has more than 2" in said("nodes=1&cpus_per_task=999")
    assert "nodes: &#39;x&#39; is not a whole number" in said("nodes=x")
    assert "fit-answer" not in client.get("/cluster").text  # no form sent: no answer


@pytest.mark.k8s
def test_the_console_builds_each_backend_with_its_own_connection_flags(k8s_cluster):
    """`hpctrain web --context NAME --namespace NS --all-users`: the flags each backend declares for where its jobs
    are (as `hpctrain status` takes them) reach that backend; --all-users reaches the jobs table's query."""
    from hpctrain.cli import build_parser
    from hpctrain.web import command

    argv = ["web", "--scheduler", "kubernetes", "--context", k8s_cluster.context, "--namespace", "team-x"]
    args = build_parser(only="web").parse_args([*argv, "--all-users"])
    found = command.schedulers(args.scheduler, args)
    assert found["kubernetes"].context == k8s_cluster.context and found["kubernetes"].namespace == "team-x"
    app = create_app(found, Secrets(token="t"), all_users=args.all_users)
    assert app.state.console.board.all_users is True
    plain = build_parser(only="web").parse_args(argv[:3])
    assert command.schedulers(plain.scheduler, plain)["kubernetes"].context is None
