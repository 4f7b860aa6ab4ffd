"""hpctrain.schedulers.slurm.commands: the one runner of Slurm commands (a deadline, a bound on output, retries of
queries only when Slurm said it was busy, one-line errors) and the one poll loop, without a cluster.

The deadline and the output bound run real processes (`sleep`, `head`, `yes`, a wrapper script that starts a
child). A busy controller cannot be made on demand without stalling the cluster other tests share (that case runs in
test_slurm_unreachable.py); here a stand-in runner answers with Slurm's own words (src/common/slurm_errno.c), on a
stand-in clock, so that the retry schedule is checked without waiting for it.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from hpctrain.errors import UserError
from hpctrain.schedulers.slurm import commands
from hpctrain.schedulers.slurm.commands import SlurmUnavailable, idempotent, poll_until, run_bounded, slurm

TIMED_OUT = "squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation\n"


def one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text and text.strip() == text, text
    return text


def test_the_deadline_kills_the_command_and_what_it_started(tmp_path: Path, monkeypatch) -> None:
    """A client that hangs (here a wrapper whose child sleeps, as a site's sbatch wrapper could) ends at the
    deadline that HPCTRAIN_SLURM_TIMEOUT sets, its child with it."""
    wrapper = tmp_path / "squeue"
    pid_file = tmp_path / "child.pid"
    wrapper.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pid_file}\nwait\n")
    wrapper.chmod(0o755)
    monkeypatch.setenv("HPCTRAIN_SLURM_TIMEOUT", "1")
    with pytest.raises(SlurmUnavailable) as err:
        slurm([str(wrapper), "--noheader"])
    line = one_line(err.value)
    assert "got no answer from the Slurm controller within 1 s" in line
    assert "scontrol ping" in line and "HPCTRAIN_SLURM_TIMEOUT" in line
    child = int(pid_file.read_text())
    for _ in range(100):  # SIGKILL is delivered at once; reaping by init may take a moment
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the wrapper's child {child} outlived the deadline")


def test_sleep_past_the_deadline_and_a_sacct_that_hangs() -> None:
    with pytest.raises(SlurmUnavailable, match="within 0.5 s"):
        slurm(["sleep", "30"], timeout=0.5)
    with pytest.raises(SlurmUnavailable) as err:
        slurm(["sacct", "-j", "1"], run=lambda argv, **kw: run_bounded(["sleep", "30"], **kw), timeout=0.5)
    line = one_line(err.value)
    assert line.startswith("`sacct -j 1` got no answer from Slurm's accounting daemon (slurmdbd) within 0.5 s")
    assert "sacctmgr show cluster" in line


def test_a_bad_timeout_setting_is_one_line_naming_it(monkeypatch) -> None:
    for bad in ("soon", "0", "-5", "nan", "1e9"):
        monkeypatch.setenv("HPCTRAIN_SLURM_TIMEOUT", bad)
        with pytest.raises(UserError) as err:
            slurm(["true"])
        assert one_line(err.value).startswith(f"HPCTRAIN_SLURM_TIMEOUT={bad!r}: give the seconds")
    monkeypatch.setenv("HPCTRAIN_SLURM_TIMEOUT", "")
    assert slurm(["true"]).returncode == 0  # empty: the default


def test_output_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(commands, "MAX_OUTPUT_BYTES", 2**20)
    assert len(slurm(["head", "-c", str(2**20), "/dev/zero"]).stdout) == 2**20
    with pytest.raises(UserError) as err:
        slurm(["head", "-c", str(2**20 + 1), "/dev/zero"])
    assert one_line(err.value).startswith("`head -c 1048577` printed more than 1 MiB, more than hpctrain reads")
    with pytest.raises(UserError, match="printed more than 1 MiB"):
        slurm(["yes"])  # endless: stopped at the bound, not when memory runs out


def test_input_and_output_larger_than_a_pipe() -> None:
    text = "show job 1\n" * 50_000  # 550 kB each way: written and read at once, or the pipes would fill
    assert slurm(["cat"], input=text).stdout == text


class Busy:
    """Stands in for a Slurm client: answers Slurm's words for a busy controller `times` times, then `answer`."""

    def __init__(self, times: int, answer: subprocess.CompletedProcess | None = None, stderr: str = TIMED_OUT):
        self.times, self.answer, self.stderr = times, answer, stderr
        self.calls: list[list[str]] = []
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self, argv, **kw):
        self.calls.append(list(argv))
        assert kw["timeout"] > 0
        if len(self.calls) <= self.times:
            return subprocess.CompletedProcess(argv, 1, b"", self.stderr.encode())
        return self.answer or subprocess.CompletedProcess(argv, 0, b"ok\n", b"")

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def clock(self) -> float:
        return self.now


def busy_slurm(fake: Busy, argv: list[str], timeout: float = 60.0, **kw) -> subprocess.CompletedProcess[str]:
    return slurm(argv, run=fake, timeout=timeout, sleep=fake.sleep, clock=fake.clock, **kw)


def test_a_busy_controller_is_asked_again_for_a_query() -> None:
    fake = Busy(3)
    assert busy_slurm(fake, ["squeue", "--noheader"]).stdout == "ok\n"
    assert (len(fake.calls), fake.slept) == (4, [1.0, 2.0, 4.0])


@pytest.mark.parametrize(
    "stderr",
    [
        "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
        "sinfo: error: slurm_load_partitions: Resource temporarily unavailable",
        "scontrol: error: Zero Bytes were transmitted or received",
    ],
)
def test_each_busy_answer_is_retried(stderr: str) -> None:
    fake = Busy(1, stderr=stderr)
    assert busy_slurm(fake, ["sinfo"]).returncode == 0 and len(fake.calls) == 2


def test_retries_stop_at_the_deadline_with_one_line() -> None:
    fake = Busy(1000)
    with pytest.raises(SlurmUnavailable) as err:
        busy_slurm(fake, ["squeue", "--noheader", "--states=all"], timeout=10)
    assert fake.slept == [1.0, 2.0, 4.0]  # the next pause (8 s) would pass the deadline
    line = one_line(err.value)
    assert line.startswith("`squeue --noheader --states=all` could not reach the Slurm controller (squeue: error:")
    assert "asked 4 times within 10 s" in line and "scontrol ping" in line


@pytest.mark.parametrize("argv", [["sbatch", "--parsable"], ["scancel", "12"], ["srun", "--jobid=12", "true"]])
def test_a_command_that_changes_something_is_never_repeated(argv: list[str]) -> None:
    fake = Busy(1)
    with pytest.raises(SlurmUnavailable) as err:
        busy_slurm(fake, argv, check=False)
    assert len(fake.calls) == 1 and fake.slept == []
    if argv[0] == "sbatch":
        assert "the job may have been queued anyway: see `hpctrain status` before submitting again" in one_line(
            err.value
        )


def test_a_refusal_is_not_retried() -> None:
    refused = subprocess.CompletedProcess([], 1, b"", b"slurm_load_jobs error: Invalid job id specified\n")
    fake = Busy(0, answer=refused)
    assert busy_slurm(fake, ["squeue", "--jobs=9"], check=False).returncode == 1
    assert len(fake.calls) == 1
    with pytest.raises(UserError, match="^`squeue --jobs=9` failed: slurm_load_jobs error: Invalid job id specified$"):
        busy_slurm(fake, ["squeue", "--jobs=9"])


def test_which_commands_are_queries() -> None:
    assert idempotent(["squeue", "--noheader"]) and idempotent(["/usr/bin/sinfo", "--version"])
    assert idempotent(["sacct", "-j", "1"])
    assert idempotent(["scontrol", "show", "partition", "-o"]) and idempotent(["scontrol", "-d", "show", "node"])
    assert idempotent(["scontrol", "write", "batch_script", "12", "-"])
    assert idempotent(["scontrol", "-d", "-o"], input="show job 1\nshow hostnames X0\n")
    assert not idempotent(["scontrol", "-d", "-o"], input="show job 1\nrequeue 1\n")
    assert not idempotent(["scontrol", "write", "batch_script", "12"])  # writes a file
    assert not idempotent(["scontrol", "requeue", "12"]) and not idempotent(["scontrol", "update", "JobId=1"])
    for argv in (["sbatch"], ["scancel", "1"], ["srun", "true"]):
        assert not idempotent(argv)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, s: float) -> None:
        self.now += s

    def __call__(self) -> float:
        return self.now


def test_poll_until_rides_out_an_outage_then_gives_up(monkeypatch) -> None:
    monkeypatch.setenv("HPCTRAIN_SLURM_TIMEOUT", "5")
    clock = Clock()
    answers: list[object] = [1, SlurmUnavailable("down"), SlurmUnavailable("down"), 2, 3]

    def probe() -> int:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    assert poll_until(probe, lambda v: v == 3, timeout_s=None, sleep=clock.sleep, clock=clock) == (3, True)
    assert clock.now == 4.0

    def down() -> int:
        raise SlurmUnavailable("still down")

    clock.now = 0.0
    with pytest.raises(SlurmUnavailable, match="still down"):  # one command deadline (5 s) after the last answer
        poll_until(down, lambda v: True, timeout_s=None, sleep=clock.sleep, clock=clock)
    assert clock.now == 5.0


def test_poll_until_ends_at_its_deadline_and_on_other_errors() -> None:
    clock = Clock()
    assert poll_until(lambda: 7, lambda v: False, timeout_s=3, sleep=clock.sleep, clock=clock) == (7, False)
    assert clock.now == 3.0

    def refused() -> int:
        raise UserError("job 9 not found")

    calls = []
    with pytest.raises(UserError, match="not found"):
        poll_until(lambda: calls.append(1) or refused(), lambda v: True, timeout_s=60, sleep=clock.sleep, clock=clock)
    assert calls == [1]


def test_a_missing_client_names_the_fix(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError) as err:
        slurm(["squeue"])
    assert one_line(err.value).startswith("`squeue` was not found: hpctrain needs the Slurm client commands on PATH")
    assert os.environ["PATH"] == str(tmp_path)


def test_every_slurm_command_goes_through_the_runner() -> None:
    """Outside commands.py, hpctrain runs programs only where they are not Slurm's clients: the job's Python
    (interpreter.py), bash asked for `module` (checks.py), and the programs of images, servers and training.
    Under schedulers/slurm nothing else calls subprocess or run_text, and no module anywhere starts a Slurm client
    by its name."""
    import ast

    import hpctrain

    root = Path(hpctrain.__file__).parent
    clients = {"squeue", "sbatch", "scontrol", "sacct", "sinfo", "scancel", "srun"}
    allowed = {
        "schedulers/slurm/commands.py",
        "schedulers/slurm/checks/interpreter.py",
        "schedulers/slurm/checks/live.py",
    }
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root).as_posix()
        if where == "schedulers/slurm/commands.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            runs = name == "run_text" or (owner == "subprocess" and name in {"run", "Popen", "call", "check_output"})
            if runs and where.startswith("schedulers/slurm/") and where not in allowed:
                found.append(f"{where}:{node.lineno}")
            first = node.args[0] if runs and node.args else None
            if runs and isinstance(first, ast.List) and first.elts and isinstance(first.elts[0], ast.Constant):
                if first.elts[0].value in clients:
                    found.append(f"{where}:{node.lineno} ({first.elts[0].value})")
    assert found == []
