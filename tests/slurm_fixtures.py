"""The `slurm_cluster` fixture: the local two-node Slurm cluster of scripts/local-slurm.sh, started once per session.

Register in conftest.py with `pytest_plugins = ["slurm_fixtures"]`. The fixture runs `scripts/local-slurm.sh up`
(idempotent: a running cluster is left as it is, so other test sessions sharing it are not disturbed) and fails
with the script's output when the cluster cannot come up. It never stops the cluster.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
import warm_start
from filelock import FileLock

from hpctrain.health.progress import read_progress
from hpctrain.schedulers.kubernetes.queries.replica_logs import KEEP_LOG

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "local-slurm.sh"
T = TypeVar("T")


@dataclass(frozen=True)
class LocalSlurm:
    """The running local cluster: nodes node1 and node2 (each gpu:2, shard:128), partitions debug (default,
    no time limit) and short (30 min)."""

    script: Path
    nodes: tuple[str, ...] = ("node1", "node2")

    def sbatch(self, *args: str, cwd: Path) -> str:
        """Submit with `sbatch --parsable ARGS` in cwd and return the job id."""
        result = subprocess.run(["sbatch", "--parsable", *args], cwd=cwd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            pytest.fail(f"sbatch {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout.strip().split(";")[0]

    def state(self, job_id: str) -> str:
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False
        ).stdout
        for field in out.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "GONE"

    def wait_state(self, job_id: str, states: set[str], timeout_s: float = 600.0) -> str:
        """Wait until the job is in one of `states` (other tests, on another pytest worker too, may hold the nodes
        for a few minutes); fail after timeout."""
        deadline = time.monotonic() + timeout_s
        state = self.state(job_id)
        while state not in states:
            if time.monotonic() > deadline:
                pytest.fail(
                    f"job {job_id} still {state} after {timeout_s:.0f} s (wanted {sorted(states)}); see `squeue`"
                )
            time.sleep(0.5)
            state = self.state(job_id)
        return state

    def cancel_quietly(self, job_id: str) -> None:
        subprocess.run(["scancel", job_id], capture_output=True, check=False)

    def fields(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (empty once the controller forgot the job or when it did not answer)."""
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False
        ).stdout
        return dict(word.split("=", 1) for word in out.split() if "=" in word)

    def warn_soon(self, job_id: str) -> None:
        """Make Slurm's own time-limit warning (`--signal=B:USR1@GRACE`) come now rather than at a moment fixed by
        the submitted limit: the running job's limit becomes its run time plus 90-150 s. Slurm's time-limit pass
        (every 30 s) warns a job when fewer than GRACE + 30 s are left, so with GRACE >= 120 (hpctrain's default)
        the warning arrives within about 30 s, and the job still has a minute or more to checkpoint and requeue.

        A test calls this once the run is under way, so the interruption lands mid-run however fast or slow the
        CPU is; after the requeue, `restore_time_limit` gives the next attempt all the time it needs."""
        run_s = _seconds(self.fields(job_id).get("RunTime", ""))
        if run_s is None:
            pytest.fail(f"job {job_id} has no RunTime: {self.fields(job_id)}")
        minutes = math.ceil((run_s + WARN_MARGIN_S) / 60)
        self._set_time_limit(job_id, minutes)

    def restore_time_limit(self, job_id: str, minutes: int = 30, restarts: int = 1, timeout_s: float = 600.0) -> None:
        """Wait until the job has been requeued `restarts` times and give it back a long limit, so that the next
        attempt runs to its end whatever the CPU's speed. A requeued job waits at least 30 s (BeginTime, the
        credential lifetime) before it starts again: ample time to change its limit first."""
        deadline = time.monotonic() + timeout_s
        while True:
            fields = self.fields(job_id)
            if int(fields.get("Restarts", "0")) >= restarts and fields.get("JobState") in ("PENDING", "RUNNING"):
                break
            if time.monotonic() > deadline:
                pytest.fail(f"job {job_id} was not requeued within {timeout_s:.0f} s: {fields}")
            time.sleep(0.5)
        self._set_time_limit(job_id, minutes)

    def warn_mid_run(self, job_id: str, processes: int) -> None:
        """Slurm's own time-limit warning, landing mid-run on a CPU of any speed: `warn_soon` brings the warning on
        while the job's `processes` training processes are paused (see `interrupt_mid_run`). Call it once training
        is under way (`Job.wait_until_training`)."""
        self.interrupt_mid_run(job_id, processes, signal.SIGUSR1, lambda: self.warn_soon(job_id))

    def interrupt_mid_run(
        self, job_id: str, processes: int, signum: int, interrupt: Callable[[], T], timeout_s: float = 240.0
    ) -> T:
        """Pause (SIGSTOP) the job's `processes` training processes, call `interrupt()` (which makes Slurm send
        `signum` to them), and let them go on once every one holds `signum` pending (or Slurm itself continued
        them, as it does before SIGTERM). The run then stops at its next step boundary, a step or two after the
        moment the test chose, however many steps a second this machine trains. Returns what `interrupt` returned."""
        pids = self.training_pids(job_id, processes)
        with paused(pids):
            result = interrupt()
            wait_delivered(pids, signum, timeout_s, job_id)
        return result

    def training_pids(self, job_id: str, processes: int, timeout_s: float = 600.0) -> list[int]:
        """The pids of the job's `hpctrain train` processes (not srun, torchrun or the batch shell that start them;
        for a warm stand-in, the fork it stands for): the nodes of the local cluster are this host, so they are in
        /proc."""
        deadline = time.monotonic() + timeout_s
        while True:
            pids = [warm_start.worker_pid(pid) for pid, argv in _job_processes(job_id) if is_training(argv)]
            if len(pids) == processes:
                return pids
            if time.monotonic() > deadline:
                pytest.fail(f"job {job_id}: {len(pids)} training process(es) found, expected {processes}")
            time.sleep(0.5)

    def _set_time_limit(self, job_id: str, minutes: int) -> None:
        # scontrol may time out on a busy controller: try a few times.
        for _ in range(5):
            result = subprocess.run(
                ["scontrol", "update", f"JobId={job_id}", f"TimeLimit={minutes}"],
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode == 0:
                return
            time.sleep(1)
        pytest.fail(f"scontrol update JobId={job_id} TimeLimit={minutes} failed: {result.stderr.strip()}")


# How far the time limit is put beyond the job's run time by warn_soon: at least this, at most a minute more.
WARN_MARGIN_S = 90

_RUN_TIME = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$")


def _seconds(run_time: str) -> int | None:
    """Slurm's [D-][HH:]MM:SS as seconds."""
    match = _RUN_TIME.match(run_time)
    if match is None:
        return None
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def _controller_answers() -> bool:
    if shutil.which("scontrol") is None:
        return False
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, check=False, timeout=120)
    return ping.returncode == 0 and "is UP" in ping.stdout


@pytest.fixture(scope="session")
def slurm_cluster() -> LocalSlurm:
    """Start (or reuse) the local Slurm cluster; fail with the reason when that is impossible."""
    if not SCRIPT.is_file():
        pytest.fail(f"{SCRIPT} is missing")
    # A controller that answers is a running cluster: used as it is. Its nodes' states are not checked here, since a
    # test may have taken one down for a while (test_elastic_slurm), and `up` would resume it under that test.
    if not _controller_answers():
        if os.geteuid() != 0:
            pytest.fail(
                "the local Slurm cluster is not running and starting it needs root: "
                "run `sudo scripts/local-slurm.sh up`"
            )
        up = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, check=False, timeout=900)
        if up.returncode != 0:
            pytest.fail(f"`scripts/local-slurm.sh up` failed (exit {up.returncode}):\n{up.stdout}\n{up.stderr}")
    for tool in ("sbatch", "squeue", "scontrol", "scancel", "sinfo"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not on PATH although the cluster is up: install slurm-client")
    return LocalSlurm(script=SCRIPT)


def _job_processes(job_id: str) -> Iterator[tuple[int, list[str]]]:
    """(pid, argv) of every process on this host that runs in Slurm job `job_id`."""
    wanted = f"SLURM_JOB_ID={job_id}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if wanted not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        yield int(entry.name), argv


# ---- the jobs' `python -m hpctrain` processes, started warm (test harness only)

# The tests that run jobs on the local cluster: their fixtures, directly or through others.
SLURM_FIXTURES = {"slurm_cluster", "slurm"}
# The start-up environments of the jobs' processes, as the submitting test's plus these: srun's ranks (none) and
# torchrun's workers (torchrun sets OMP_NUM_THREADS=1 for two or more a node). A warm process is made for each.
STEP_STARTUPS = ({}, {"OMP_NUM_THREADS": "1"})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    yield
    if item.get_closest_marker("fresh_steps") is not None:
        fresh_job_steps(item)
    elif SLURM_FIXTURES & set(getattr(item, "fixturenames", ())):
        warm_job_steps()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    result = yield
    marker = item.get_closest_marker("fresh_steps")
    if marker is not None:
        check_fresh_steps(Path(os.environ["HPCTRAIN_TEST_STEP_LOG"]), marker.kwargs["processes"])
    return result


def fresh_job_steps(item: pytest.Item) -> None:
    """For a test marked `fresh_steps(processes=N)`: its jobs' processes start as a user's do, each a fresh
    interpreter under slurmstepd (no warm process: Slurm's signals, the step's start-up in the job's environment and
    the moments before the handlers are installed are the real ones), and each records how it started
    (tests/slurm_steps/sitecustomize.py) in a file that `check_fresh_steps` reads once the test has passed."""
    os.environ.pop("HPCTRAIN_TEST_WARM_STEPS", None)
    where = item.funcargs.get("tmp_path") if hasattr(item, "funcargs") else None
    os.environ["HPCTRAIN_TEST_STEP_LOG"] = str(Path(where or tempfile.mkdtemp()) / "step-starts.jsonl")


def check_fresh_steps(log: Path, processes: int) -> None:
    """Fail unless at least `processes` Python processes started in the test's jobs, every one fresh and below a
    slurmstepd."""
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def brief(argv: list[str]) -> str:
        return " ".join(word[:40] for word in argv[:4])

    warm = [brief(r["argv"]) for r in records if r["started"] != "fresh"]
    outside = [(brief(r["argv"]), r["ancestors"]) for r in records if "slurmstepd" not in r["ancestors"]]
    if warm or outside or len(records) < processes:
        pytest.fail(
            f"the job's processes did not all start fresh under slurmstepd: {len(records)} started (at least "
            f"{processes} expected); handed to a warm process: {warm}; not below a slurmstepd: {outside}"
        )


def warm_job_steps() -> None:
    """For the test about to run (conftest's `_environment_restored` takes it back after): the `python -m hpctrain`
    processes of the jobs it submits, srun's ranks and torchrun's workers, run as forks of a warm process that has
    imported torch (tests/slurm_steps/sitecustomize.py hands them to tests/warm_worker.py), not as fresh interpreters
    importing it again: about 4 CPU s each, some 60 in a CI run. sbatch passes the submitting environment on, and
    the nodes of the local cluster are this host, so the warm processes named here are there for the jobs. A job whose
    start-up variables differ from those of every warm process gets fresh interpreters, as before."""
    paths = [warm_start.workers_socket({**os.environ, **startup}) for startup in STEP_STARTUPS]
    if None not in paths:
        os.environ["HPCTRAIN_TEST_WARM_STEPS"] = os.pathsep.join(paths)


def is_training(argv: list[str]) -> bool:
    """`hpctrain train ...` or `python -m hpctrain train ...`, but not a launcher (srun, torchrun) that starts it:
    the batch script's torchrun runs as `python3 -c "$hpctrain_torchrun" ... --no-python hpctrain train ...`, and a
    pod's command under `python3 -c KEEP_LOG DIR ...`."""
    names = [Path(a).name for a in argv]
    if not names or names[0] == "srun" or "torchrun" in names or "torch.distributed.run" in names:
        return False
    if argv[1:3] == ["-c", KEEP_LOG]:  # a Kubernetes pod's keeper of its log (replica_logs.py), which starts it
        return False
    if "--no-python" in argv:
        return False
    return any(a == "train" and i > 0 and names[i - 1] == "hpctrain" for i, a in enumerate(argv))


@contextmanager
def paused(pids: list[int]) -> Iterator[None]:
    """Stop the processes (SIGSTOP) for the block: signals sent to them meanwhile wait, pending, until they go on."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def _delivered(pid: int, bit: int) -> bool:
    """The stopped process holds the signal pending (its own set or its threads'), or is no longer stopped
    (continued by the sender: Slurm sends SIGCONT before SIGTERM), or is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return True
    fields = dict(line.split(":", 1) for line in status if ":" in line)
    pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
    return bool(pending & bit) or not fields["State"].strip().startswith("T")


def wait_delivered(pids: list[int], signum: int, timeout_s: float, job_id: str) -> None:
    """Wait until `signum` has reached every one of the (stopped) processes."""
    bit = 1 << (signum - 1)
    deadline = time.monotonic() + timeout_s
    while not all(_delivered(pid, bit) for pid in pids):
        if time.monotonic() > deadline:
            pytest.fail(
                f"job {job_id}: {signal.Signals(signum).name} did not reach its training processes "
                f"{pids} within {timeout_s:.0f} s"
            )
        time.sleep(0.2)


# ---- jobs the tests submit, and runs shared by the whole session -----------------------------------------------

JOB_DEADLINE_S = (
    800  # requeue holds, other suites sharing the two nodes: generous (under pytest's 900 s), never asserted on
)
_ATTEMPT = re.compile(r"^hpctrain: job \d+ attempt (\d+) on ", re.MULTILINE)


def shared_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object]) -> Path:
    """A run directory made once per test session and shared by every pytest-xdist worker (scripts/test.sh runs
    several): the first to ask makes it under a file lock, the others wait for it and reuse it. Do not modify it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's directory, above the workers' own
    run_dir, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(run_dir, ignore_errors=True)
            make(run_dir)
            done.write_text("")
    return run_dir


def in_queue(job_id: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i"], capture_output=True, text=True).stdout
    return job_id in out.split()


@dataclass
class Job:
    job_id: str
    cwd: Path
    run_dir: Path

    @property
    def log(self) -> str:
        path = self.cwd / f"job-{self.job_id}.out"
        return path.read_text() if path.exists() else "(no log yet)"

    def fail(self, what: str) -> None:
        subprocess.run(["scancel", self.job_id], capture_output=True)
        pytest.fail(f"job {self.job_id}: {what}\n{self.log}")

    def wait_for_log(self, text: str, timeout: float = JOB_DEADLINE_S) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log:
            if time.monotonic() > deadline or not in_queue(self.job_id):
                self.fail(f"{text!r} never appeared in its log")
            time.sleep(0.2)

    def wait_until_training(self, timeout: float = JOB_DEADLINE_S) -> None:
        """Wait until rank 0 has taken its first step (its progress record, written at once on the first step,
        says "training"): the moment to interrupt a run with the whole run still ahead of it. A progress line in the
        log is no such moment: the lines are spaced in time, and the first may come at the first epoch's end, a few
        seconds before the run ends on a fast machine."""
        deadline = time.monotonic() + timeout
        while not any(r.rank == 0 and r.phase == "training" and r.step >= 1 for r in read_progress(self.run_dir)):
            if time.monotonic() > deadline or not in_queue(self.job_id):
                self.fail("rank 0 never wrote a training record")
            time.sleep(0.1)

    def follow(self, timeout: float = JOB_DEADLINE_S) -> None:
        """Wait until the job has left the queue. Each requeued attempt waits in Slurm's BeginTime hold until
        the old attempt's credential expires (30 s on the local cluster): releasing it sooner by hand gets it
        killed ("Job credential revoked")."""
        deadline = time.monotonic() + timeout
        while in_queue(self.job_id):
            if time.monotonic() > deadline:
                self.fail(f"still queued after {timeout} s")
            time.sleep(1)


def attempts(log: str) -> list[str]:
    """The job log split at each attempt's first line (the batch script writes one per attempt)."""
    starts = [m.start() for m in _ATTEMPT.finditer(log)]
    return [log[a:b] for a, b in zip(starts, starts[1:] + [len(log)])]
