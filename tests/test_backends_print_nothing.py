"""The backends return data and the CLI prints it (issues 30 and 40): nothing under hpctrain/schedulers/ writes to
the terminal. An AST walk of every module there finds each use of `print` (a call, or `print` handed on as a
default `say`), each use of sys.stdout/sys.stderr and each import of rich (whose Console writes to stdout); Python
held in a string for another process (the batch script's torchrun shim, the interpreter probe) is text here, not a
call, and passes.

Then the engine as a second face (the web console) calls it, on real jobs of the local Slurm cluster, with the
process's stdout and stderr captured at the file descriptors (capfd: subprocesses such as sbatch included): a job
from submit through status and logs to cancel, `dev start`'s JupyterLab session and `tensorboard --on-cluster`,
each through the Scheduler and Services interfaces from the registry. Nothing reaches the terminal; what they
say comes back as data (job ids, states, log lines, Outcomes, Steps, a ServiceAccess)."""

from __future__ import annotations

import ast
import sys
import time
from pathlib import Path

import pytest

import hpctrain.schedulers
from hpctrain.jobs import JobSpec
from hpctrain.jobs.spec import Resources
from hpctrain.schedulers import base, get_scheduler
from hpctrain.schedulers.service_api import Placement, ServiceAccess, Step
from hpctrain.servers.common import http_get
from hpctrain.servers.sessions import DevConfig, connection
from slurm_fixtures import slurm_cluster  # noqa: F401  (the shared session fixture)

SCHEDULERS = Path(hpctrain.schedulers.__file__).parent


def terminal_writes(source: str, filename: str = "<source>") -> list[str]:
    """`file:line: what` for each way `source` writes to the terminal itself."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        what = None
        if isinstance(node, ast.Name) and node.id == "print":  # called, or handed on (`say=print`)
            what = "print"
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in ("stdout", "stderr", "__stdout__", "__stderr__")
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        ):
            what = f"sys.{node.attr}"
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module == "sys"
            and any(a.name in ("stdout", "stderr", "__stdout__", "__stderr__") for a in node.names)
        ):
            what = "from sys import stdout/stderr"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(m == "rich" or m.startswith("rich.") for m in modules):
                what = "rich (its Console prints)"
        if what:
            found.append(f"{filename}:{node.lineno}: {what}")
    return found


def test_no_module_under_schedulers_writes_to_the_terminal() -> None:
    # programs/ holds programs a job runs (the batch script's torchrun shim): what they print is the job's log.
    modules = sorted(p for p in SCHEDULERS.rglob("*.py") if "programs" not in p.relative_to(SCHEDULERS).parts)
    assert len(modules) > 20  # the walk sees the backends' packages
    found = [hit for path in modules for hit in terminal_writes(path.read_text(), str(path.relative_to(SCHEDULERS)))]
    assert found == [], (
        "a backend returns data (hpctrain.schedulers.base: View, Outcome) and the CLI prints it "
        "(hpctrain.cli.views); these write to the terminal themselves:\n" + "\n".join(found)
    )


PACKAGE = SCHEDULERS.parent
# The faces print; the channel's own module flushes the streams before os._exit. Nothing else writes to them.
FACES = ("cli", "web")
CHANNEL = "channel.py"


def test_no_module_below_the_faces_writes_to_the_terminal() -> None:
    """Issue 40 item 3: everything under hpctrain/ outside cli/ and web/ says what it says through the logging
    channel (hpctrain.channel); a face decides where it goes (hpctrain.cli.terminal), a library user sees nothing."""
    modules = sorted(
        p
        for p in PACKAGE.rglob("*.py")
        if p.relative_to(PACKAGE).parts[0] not in FACES
        and "programs" not in p.relative_to(PACKAGE).parts
        and p.relative_to(PACKAGE).as_posix() != CHANNEL
    )
    assert len(modules) > 150  # the walk sees the whole package
    assert PACKAGE / "training" / "loop.py" in modules and PACKAGE / "data" / "download.py" in modules
    found = [hit for path in modules for hit in terminal_writes(path.read_text(), str(path.relative_to(PACKAGE)))]
    assert found == [], (
        "below the faces, log to logging.getLogger(__name__) (hpctrain.channel: INFO, NOTE, WARNING, ERROR) and "
        "let the face print; these write to the terminal themselves:\n" + "\n".join(found)
    )


def test_the_training_loop_writes_through_its_run_only() -> None:
    """The loop tells its user everything through Run (say, warn, error: hpctrain.training.run), one channel, not
    through Run and bare prints besides."""
    import hpctrain.training.loop

    loop = Path(hpctrain.training.loop.__file__)
    assert terminal_writes(loop.read_text(), loop.name) == []


def test_the_walk_finds_each_way_of_writing_and_passes_python_in_a_string() -> None:
    writes = {
        "print('x')": "print",
        "def start(wait_s, say=print):\n    say('x')": "print",
        "def start(wait_s, say: Callable[[str], None] = print): pass": "print",
        "import sys\nsys.stdout.write('x')": "sys.stdout",
        "import sys\nprint_it(file=sys.stderr)": "sys.stderr",
        "from sys import stderr": "from sys import stdout/stderr",
        "from rich.console import Console": "rich (its Console prints)",
        "import rich": "rich (its Console prints)",
        "def f():\n    if True:\n        print(1, flush=True)": "print",
    }
    for source, what in writes.items():
        assert [hit.split(": ", 1)[1] for hit in terminal_writes(source)] == [what], source
    assert terminal_writes("SHIM = '''\nimport sys\nprint('hpctrain: planned', file=sys.stderr)\n'''") == []
    assert terminal_writes("def say(line): pass\nsay('x')\nlines.print_it()") == []


# ---- the engine, called as a face calls it, on the local Slurm cluster ---------------------------------------------

DEADLINE_S = 400  # other tests may hold the nodes; a bound on waiting, never asserted on


def venv() -> str | None:
    """The virtual environment running the tests (it has jupyterlab and tensorboard), for the service jobs."""
    return sys.prefix if sys.prefix != sys.base_prefix else None


def wait_status(sched, job_id: str, done) -> base.JobStatus:
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        status = sched.status(job_id)
        if done(status):
            return status
        time.sleep(0.5)
    pytest.fail(f"job {job_id} never got there: {status}")


def nothing_printed(capfd) -> None:
    out, err = capfd.readouterr()
    assert (out, err) == ("", ""), f"the engine wrote to the terminal:\nstdout: {out!r}\nstderr: {err!r}"


@pytest.mark.slurm
def test_a_job_from_submit_to_cancel_prints_nothing_and_returns_it_all(
    slurm_cluster, tmp_path: Path, monkeypatch, capfd
) -> None:
    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    sched = get_scheduler("slurm", launcher="single", output=str(tmp_path / "out-%j.txt"), python=sys.executable)
    job = JobSpec(
        command=("sh", "-c", "echo started; sleep 300"), name="quiet-engine", run_dir=str(tmp_path / "run-%j")
    )
    rendered = sched.render(job)
    assert base.blocking(sched.check(job)) == []
    job_id = sched.submit(job, rendered)
    heard: list[str] = []
    try:
        said = sched.record(job, rendered, job_id, {"command": list(job.command)})
        assert any(job_id in line for line in said), said
        assert job_id in [j.job_id for j in sched.list_jobs()]
        assert wait_status(sched, job_id, lambda s: s.state == base.RUNNING).job_id == job_id
        record = sched.status_view(job_id).json_records()
        assert job_id in str(record) and "RUNNING" in str(record), record
        followed = iter(sched.logs(job_id, follow=True, say=heard.append))
        assert "started" in followed  # reads up to the line
        outcome = sched.cancel_and_wait(job_id, wait_s=60, say=heard.append)
        assert outcome.exit_code == 0 and any(job_id in line for line in outcome.lines), outcome
        list(followed)  # ends once the job has ended
        assert any("ended" in line for line in heard), heard
        assert wait_status(sched, job_id, lambda s: s.finished).state == base.CANCELLED
    finally:
        slurm_cluster.cancel_quietly(job_id)
    nothing_printed(capfd)


@pytest.mark.slurm
def test_tensorboard_on_the_cluster_prints_nothing_and_returns_its_steps_and_access(
    slurm_cluster, tmp_path: Path, monkeypatch, capfd
) -> None:
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    run = tmp_path / "shared" / "mnist"
    (run / "tb").mkdir(parents=True)
    capfd.readouterr()
    sched = get_scheduler("slurm")
    steps: list[Step] = []
    access = None
    try:
        access = sched.services().tensorboard(
            [str(run)], "00:10:00", Placement(options={"venv": venv()}), 500, None, steps.append
        )
        assert isinstance(access, ServiceAccess) and access.endpoint is not None
        assert steps[0] == Step(
            "submitted", f"tensorboard: job {access.job} submitted; waiting for it to answer (up to 500 s)", access.job
        )
        assert Step("state", "RUNNING", access.job) in steps[1:], steps
        assert http_get(f"http://{access.endpoint.node}:{access.endpoint.port}/")[0] == 200
        assert access.forward.startswith(f"ssh -N -L {access.endpoint.port}:{access.endpoint.node}:")
        assert access.stop == f"hpctrain cancel {access.job}"
        outcome = sched.cancel_and_wait(access.job, wait_s=60)
        assert outcome.exit_code == 0, outcome
    finally:
        if access is not None:
            slurm_cluster.cancel_quietly(access.job)
    nothing_printed(capfd)


@pytest.mark.slurm
def test_dev_start_prints_nothing_and_returns_its_steps_and_how_to_reach_it(
    slurm_cluster, tmp_path: Path, monkeypatch, capfd
) -> None:
    monkeypatch.setenv("HPCTRAIN_HOME", str(tmp_path / "home"))
    capfd.readouterr()
    services = get_scheduler("slurm").services()
    placement = Placement(options={"venv": venv()})
    cfg = DevConfig(name="quiet", resources=Resources(cpus_per_task=1), time="10:00")
    steps: list[Step] = []
    job_id = None
    try:
        lines = services.dev_start(cfg, placement, 500, None, steps.append)
        state_dir, conn = connection("quiet")
        job_id = str(conn["job_id"])
        assert steps[0].kind == "submitted" and steps[0].job == job_id, steps
        assert Step("state", "RUNNING", job_id) in steps[1:], steps
        assert any(conn["tunnel"] in line for line in lines) and any(conn["url"] in line for line in lines), lines
        assert "cancelled" in services.dev_stop(state_dir, conn)
    finally:
        if job_id:
            slurm_cluster.cancel_quietly(job_id)
    nothing_printed(capfd)
