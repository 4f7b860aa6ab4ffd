"""`hpctrain submit`: describe a job (flags and/or a job file), check it, render it, and queue it on the chosen
scheduler.

    hpctrain submit [job options] train mnist [train options]     # a built-in recipe
    hpctrain submit [job options] -- python my_train.py --lr 0.1   # any command
    hpctrain submit --scheduler NAME [its options] train mnist

The work is the engine's (hpctrain.engine.submission: build, preview, check, submit; the web console's job form
calls the same); this module says what it returns, then `wait`s for --wait/--follow. What differs per scheduler is
the backend's: its BackendInfo adds its flags, reads its job-file section, completes the job's defaults; its
methods say what is said. The job options are shared with `hpctrain check` (engine.job_options).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

from hpctrain.engine import submission
from hpctrain.engine.job_options import add_job_arguments
from hpctrain.errors import UserError, redact
from hpctrain.safetext import for_terminal
from hpctrain.schedulers import base


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_job_arguments(parser)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the job here (not against the cluster), print the sbatch command and script "
        "(Slurm) or the manifest (Kubernetes); submit nothing",
    )
    parser.add_argument("--wait", action="store_true", help="block until the job ends; exit with its exit status")
    parser.add_argument(
        "--follow",
        action="store_true",
        help="--wait, and print the job's output as it grows "
        "(Slurm: its --output file, from the first attempt on; `hpctrain logs -f JOB` does the same "
        "for a job already queued)",
    )
    parser.add_argument("--no-check", action="store_true", help="skip the checks against the live cluster")


def report_problems(command: str, problems: list[str]) -> None:
    for line in problems:
        print(f"hpctrain {command}: {for_terminal(redact(line))}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    job = submission.build(submission.job_flags(vars(args)), dry_run=args.dry_run)
    sched = job.backend()
    rendered = submission.preview(job, sched)  # pure; what it cannot express fails here, before anything is sent
    if args.dry_run:
        # The script or manifest is shown whatever the checks say (it is what the user asked to read); the exit
        # status is a real submit's verdict on everything that can be checked without the cluster. What is made
        # once before the first submit (an image, a venv) is only noted.
        problems = submission.check(job, live=False, backend=sched, rendered=rendered)
        sys.stdout.write(redact(rendered.preview or rendered.text))  # the files keep the values: they are 0600
        said = [p.line for p in problems if not p.prerequisite]
        notes = [f"note: {p.line} (a real submit refuses until then)" for p in problems if p.prerequisite]
        blocks = any(p.blocking and not p.prerequisite for p in problems)
        verdict = ["a real submit would refuse this job (exit status 2)"] if blocks else []
        report_problems("submit", said + verdict + notes + [sched.dry_run_note])
        return 2 if verdict else 0
    problems = submission.check(job, live=not args.no_check, backend=sched, rendered=rendered)
    # Warnings, and what the job will do at its time limit; notes on checks that could not run are `check`'s to say.
    report_problems(
        "submit", [p.line for p in problems if p.kind == submission.WARNING or p.line.startswith(base.TIME_LIMIT_NOTE)]
    )
    if blocking := [p for p in problems if p.blocking]:
        hint = (
            " (fix the above, or pass --no-check to skip the cluster checks)"
            if any(p.live for p in blocking)
            else " (fix the above)"
        )
        report_problems("submit", [p.line for p in blocking] + ["nothing was submitted" + hint])
        return 2
    submitted = submission.submit(job, problems, backend=sched, rendered=rendered)
    print(submitted.job_id, flush=True)
    report_problems("submit", list(submitted.said))
    if not (args.wait or args.follow):
        return 0
    return wait(sched, submitted.job_id, "submit", follow=args.follow)


def wait(sched: Any, job_id: str, command: str, follow: bool = False, poll_s: float = 2.0) -> int:
    """Poll `status` until the job ends, saying each change on stderr; with `follow`, copy the job's output to
    stdout meanwhile (where the backend can follow a queued job). The job's exit status: its own, else the last
    non-zero one a replica showed while it ran (a Kubernetes job's pods may be deleted as it fails); 1 when it did not
    succeed and none is known, said so."""
    follower = None
    if follow:
        note = sched.follow_note(job_id)
        if note:
            report_problems(command, [note])
        else:
            follower = threading.Thread(target=_copy_output, args=(sched, job_id, command), daemon=True)
            follower.start()
    last: tuple[str, int] | None = None
    seen: int | None = None  # the last non-zero exit code a replica showed: its pods may go with the job's end
    quiet_s = _quiet_s()
    since, noted = time.monotonic(), None  # when the state last changed; what was said of a long wait
    while True:
        try:
            status = sched.status(job_id)
        except base.JobNotFound:
            if last is None:
                raise
            print(f"hpctrain {command}: job {job_id} is gone (deleted before it ended)", file=sys.stderr)
            return 1
        seen = next((r.exit_code for r in status.replicas if r.exit_code), seen)
        if (status.shown_state, status.restarts) != last:
            said = for_terminal(f"job {job_id} {sched.progress(status)}")
            print(f"hpctrain {command}: {said}", file=sys.stderr, flush=True)
            last = (status.shown_state, status.restarts)
            since, noted = time.monotonic(), None
        elif status.state == base.PENDING and time.monotonic() - since >= quiet_s:
            said = status.pending_reasons + ((f"the scheduler says: {status.message}",) if status.message else ())
            if said != noted:  # what it has seen, once, and again when that changes
                print(
                    f"hpctrain {command}: job {job_id} is still {status.shown_state} after "
                    f"{time.monotonic() - since:.0f} s: {'; '.join(said) or 'the scheduler gives no reason'}; "
                    "still waiting (Ctrl-C stops waiting; the job stays queued until cancelled)",
                    file=sys.stderr,
                    flush=True,
                )
                noted = said
        if status.finished:
            break
        time.sleep(poll_s)
    if follower is not None:
        follower.join()  # the follower reads the rest once it sees the job ended
    if status.last_lines:
        print(f"hpctrain {command}: the last lines of the failed replica(s):", file=sys.stderr)
        for line in status.last_lines:
            print(f"  {line}", file=sys.stderr)
    code = status.exit_code
    if not code and status.state != base.SUCCEEDED:
        code = seen or code
    if code is None and status.state != base.SUCCEEDED:
        print(
            f"hpctrain {command}: job {job_id} ended {status.shown_state}; hpctrain could not learn its exit status "
            "(its processes' records are gone and the scheduler kept none): exiting with 1",
            file=sys.stderr,
        )
        return 1
    code = code or (0 if status.state == base.SUCCEEDED else 1)
    print(f"hpctrain {command}: job {job_id} ended {status.shown_state} with exit status {code}", file=sys.stderr)
    return code


QUIET_ENV = "HPCTRAIN_WAIT_NOTE_S"
DEFAULT_QUIET_S = 60.0


def _quiet_s() -> float:
    """How long a job may wait without a change before `--wait` says what it has seen ($HPCTRAIN_WAIT_NOTE_S)."""
    import math

    text = os.environ.get(QUIET_ENV)
    if not text:
        return DEFAULT_QUIET_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 86400:
        raise UserError(f"{QUIET_ENV}={text[:40]!r} must be a number of seconds above 0 and at most 86400")
    return value


def _copy_output(sched: Any, job_id: str, command: str) -> None:
    try:
        for line in sched.logs(job_id, follow=True):
            print(line, flush=True)
    except UserError as err:
        report_problems(command, [f"warning: {err}"])
