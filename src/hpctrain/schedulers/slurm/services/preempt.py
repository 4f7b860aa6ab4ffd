"""`hpctrain debug preempt JOB` on Slurm: send a running job the warning its time limit would send, now.

A job learns of its time limit only from the signal it asked for (`#SBATCH --signal=B:USR1@120` in scripts that
hpctrain renders). Rehearsing recovery therefore means delivering that same signal to that same process: with `B:`
the batch shell (`scancel --signal=USR1 --batch JOB`), whose trap forwards it to the training processes and later
requeues the job; without `B:` every job step. The signal is read from the job's own batch script
(`scontrol write batch_script JOB -`), so a rehearsal cannot drift from what the time limit would do.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import UserError
from hpctrain.schedulers.base import Outcome
from hpctrain.schedulers.slurm.commands import command_error, poll_until, slurm
from hpctrain.schedulers.slurm.queries.job_states import JobInfo, check_job_id, get_job
from hpctrain.schedulers.slurm.queries.run_dir import parse_run_dir
from hpctrain.stops import SIGNALS_FILE

_SIGNAL_OPTION_RE = re.compile(r"^(?:(?P<flags>[RB]+):)?(?P<sig>(?:SIG)?[A-Z][A-Z0-9]*|\d{1,2})(?:@(?P<secs>\d+))?$")
# Seconds a job must have been running before its batch shell is warned (see preempt()).
SETTLE_S = 5
_SIGNAL_NAME_RE = re.compile(r"^(?:SIG)?[A-Z][A-Z0-9]*$|^\d{1,2}$")


@dataclass(frozen=True)
class TimeLimitWarning:
    """The signal a job asked Slurm for before its time limit, and who receives it."""

    signal: str  # as scancel takes it: USR1, TERM, 10
    batch_shell: bool  # True: only the batch shell (`B:`); False: every job step
    seconds_before: int | None = None  # the @TIME part; None when unknown or not given

    @property
    def target(self) -> str:
        return "its batch shell" if self.batch_shell else "its job steps"


def parse_signal_option(value: str) -> TimeLimitWarning | None:
    """sbatch's `--signal=[{R|B}:]SIG[@TIME]` value, or None when it is not one."""
    match = _SIGNAL_OPTION_RE.match(value.strip().upper())
    if match is None:
        return None
    sig = match["sig"].removeprefix("SIG")
    secs = match["secs"]
    # sbatch's default is 60 s before the limit when @TIME is left out.
    return TimeLimitWarning(
        signal=sig, batch_shell="B" in (match["flags"] or ""), seconds_before=int(secs) if secs else 60
    )


def warning_from_script(script: str) -> TimeLimitWarning | None:
    """The --signal of a batch script's #SBATCH lines (the last one wins, as with sbatch), or None.

    sbatch reads #SBATCH lines only up to the first command, so neither do we."""
    found: TimeLimitWarning | None = None
    for number, line in enumerate(script.splitlines()):
        stripped = line.strip()
        if number == 0 and stripped.startswith("#!"):
            continue
        if stripped and not stripped.startswith("#"):
            break  # the first command: sbatch stops looking here
        if not stripped.startswith("#SBATCH"):
            continue
        try:
            words = shlex.split(stripped[len("#SBATCH") :], comments=True)
        except ValueError:
            words = stripped[len("#SBATCH") :].split()
        for i, word in enumerate(words):
            if word.startswith("--signal="):
                value: str | None = word.split("=", 1)[1]
            elif word == "--signal" and i + 1 < len(words):
                value = words[i + 1]
            else:
                continue
            parsed = parse_signal_option(value)
            if parsed is not None:
                found = parsed
    return found


def scancel_argv(job_id: str, warning: TimeLimitWarning) -> list[str]:
    argv = ["scancel", f"--signal={warning.signal}"]
    if warning.batch_shell:
        argv.append("--batch")  # only the batch shell, exactly as `--signal=B:...` delivers it
    return argv + [job_id]


def _job_warning(job_id: str, signal: str | None, steps: bool) -> tuple[TimeLimitWarning, str]:
    """The warning to send: the --signal option given here, else the one in the job's batch script; and that
    script ("" when not read)."""
    if signal is not None:
        sig = signal.strip().upper()
        if not _SIGNAL_NAME_RE.match(sig):
            raise UserError(f"--signal {signal!r}: give a signal name or number, e.g. --signal USR1")
        return TimeLimitWarning(signal=sig.removeprefix("SIG"), batch_shell=not steps), ""
    if steps:
        raise UserError(
            "--steps only says where a --signal you name goes; add --signal SIG, or leave both out "
            "to send what the job's script asks for"
        )
    result = slurm(["scontrol", "write", "batch_script", job_id, "-"], check=False)
    if result.returncode != 0:
        why = " ".join((result.stderr or result.stdout or "").split()) or f"exit status {result.returncode}"
        raise UserError(
            f"cannot read job {job_id}'s batch script to find its warning signal ({why}); name the "
            f"signal yourself: hpctrain debug preempt {job_id} --signal USR1"
        )
    warning = warning_from_script(result.stdout)
    if warning is None:
        raise UserError(
            f"job {job_id}'s batch script has no `#SBATCH --signal` line, so its time limit would end it without a "
            "warning: there is nothing to rehearse. Submit it with a warning (hpctrain submit --signal-grace 120, "
            f"the default; or #SBATCH --signal=B:USR1@120). If it got --signal on sbatch's command line, name it: "
            f"hpctrain debug preempt {job_id} --signal USR1 [--steps]"
        )
    return warning, result.stdout


def unannounced_program(script: str, job_id: str, work_dir: str | None) -> Path | None:
    """For a user's command that hpctrain's batch script passes the warning on to only once the program said it
    handles it (RUN/handles_signals, left by hpctrain.training.StopRequest): the run directory, when the program
    has not said so. None otherwise."""
    if f'[ -f "$run_dir/{SIGNALS_FILE}" ]' not in script:
        return None
    run_dir = parse_run_dir(script, job_id, work_dir)
    if run_dir is None or (run_dir / SIGNALS_FILE).is_file():
        return None
    return run_dir


def preempt(
    job_id: str,
    signal: str | None = None,
    steps: bool = False,
    follow: bool = False,
    timeout_s: float = 600.0,
    say: Callable[[str], None] | None = None,
) -> Outcome:
    """Send the warning (the job's own, or `signal` to the batch shell, or to the steps with `steps`); with
    `follow`, wait up to `timeout_s` until the job has requeued itself (exit status 0) or ended (1). `say` hears
    what happens meanwhile (the warning sent, each change of state), as it happens."""
    say = say or (lambda line: None)
    job_id = check_job_id(job_id)
    before = get_job(job_id)
    if before is None:
        raise UserError(f"job {job_id} not found: it ended a while ago or the id is wrong (see `hpctrain status`)")
    if before.finished:
        raise UserError(
            f"job {job_id} already ended ({before.state}): only a running job can be warned; "
            "submit it again to rehearse"
        )
    if before.state != "RUNNING":
        reason = f", reason {before.reason}" if before.reason else ""
        raise UserError(
            f"job {job_id} is {before.state}{reason}: the warning goes to a running job's processes; "
            f"wait until `hpctrain status {job_id}` shows RUNNING"
        )
    warning, script = _job_warning(job_id, signal, steps)
    unannounced = unannounced_program(script, job_id, before.work_dir) if warning.batch_shell else None
    if warning.batch_shell and before.elapsed_s is not None and before.elapsed_s < SETTLE_S:
        # A batch shell that has not installed its trap yet dies of USR1 (bash's default action): the job would
        # fail instead of rehearsing. (Scripts should set their traps first; Slurm's own warning seldom comes
        # this early, since the grace period is shorter than the time limit.)
        wait = SETTLE_S - before.elapsed_s
        say(f"job {job_id} started {before.elapsed_s} s ago: waiting {wait} s for its batch script to set up")
        time.sleep(wait)

    argv = scancel_argv(job_id, warning)
    result = slurm(argv, check=False)
    if result.returncode != 0:
        if "invalid job id" in (result.stderr or "").lower():
            raise UserError(f"job {job_id} ended before the warning reached it (see `hpctrain status {job_id}`)")
        raise UserError(command_error(argv, result))
    when = f" {warning.seconds_before} s before its time limit" if warning.seconds_before is not None else ""
    say(f"sent {warning.signal} to job {job_id} ({warning.target}), as Slurm would{when}")
    if unannounced is not None:
        return Outcome(
            (
                f"job {job_id}'s program has not said it handles {warning.signal} (hpctrain.training."
                f"StopRequest leaves {unannounced / SIGNALS_FILE}), so its batch script does not pass the "
                "warning on: it runs until its time limit and is not requeued (nothing would be saved)",
            ),
            1 if follow else 0,
        )
    if not follow:
        return Outcome((f"follow it with `hpctrain status {job_id}` and `hpctrain logs {job_id} -f`",))
    return _follow(job_id, before.restarts, timeout_s, say)


def _follow(job_id: str, restarts: int, timeout_s: float, say: Callable[[str], None]) -> Outcome:
    """Wait until the job requeues itself (its restart count grows) or ends; 0 for a requeue."""
    states: list[str] = []

    def probe() -> JobInfo | None:
        info = get_job(job_id)
        if info is not None and (not states or info.state != states[-1]):
            say(f"job {job_id}: {info.state}" + (f" ({info.reason})" if info.reason else ""))
            states[:] = [info.state]
        return info

    info, _ = poll_until(
        probe, lambda i: i is None or i.restarts > restarts or i.finished, timeout_s=timeout_s, poll_s=1.0
    )
    if info is None:
        return Outcome((f"job {job_id} ended and Slurm no longer lists it; see `hpctrain logs {job_id}`",), 1)
    if info.restarts > restarts:
        held = " Slurm holds a requeued job (BeginTime) for a while before it starts again." if info.pending else ""
        return Outcome(
            (
                f"job {job_id} requeued itself after its program said it stopped with its state saved "
                f"(restart {info.restarts}).{held}",
            )
        )
    if info.finished:
        code = "" if info.exit_code is None else f", exit status {info.exit_code}"
        return Outcome(
            (
                f"job {job_id} ended ({info.state}{code}) without requeueing: it may have finished "
                "already, or its script does not requeue after the warning; "
                f"see `hpctrain logs {job_id}`",
            ),
            1,
        )
    raise UserError(
        f"job {job_id} is still {info.state} and has not requeued after {timeout_s:g} s; see `hpctrain logs {job_id}`"
    )
