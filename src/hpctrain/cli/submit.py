"""`hpctrain submit`: describe a job (flags and/or a job file), check it, render it, and queue it on the chosen
scheduler.

    hpctrain submit [job options] train mnist [train options]     # a built-in recipe
    hpctrain submit [job options] -- python my_train.py --lr 0.1   # any command
    hpctrain submit --scheduler NAME [its options] train mnist

One path for every scheduler, through hpctrain.schedulers.base.Scheduler: render, local_check (+ check), submit,
record, then `wait` for --wait/--follow. What differs per scheduler is the backend's: its BackendInfo adds its
flags, reads its job-file section, completes the job's defaults; its methods say what is said. The job options are
shared with `hpctrain check` (job_options.py: add_job_arguments / submission_from_args).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

from hpctrain.cli.job_options import Submission, add_job_arguments, submission_from_args
from hpctrain.cli.scheduling import get_backend
from hpctrain.errors import UserError, redact
from hpctrain.safetext import for_terminal
from hpctrain.jobs.spec import JobSpec
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


def dry_run_notes(job: JobSpec, problems: list[str]) -> tuple[list[str], list[str]]:
    """Split a --dry-run's problems into those that make it exit 2 and notes: the image or venv made once before the
    first submit (an example's placeholder, or not pulled yet) and, while a venv is missing, the programs that only
    it would provide. A real submit and `hpctrain check` still refuse both."""
    noted = [p for p in problems if isinstance(p, base.Prerequisite)]  # the backend's verdict, by its type
    notes = [f"note: {p} (a real submit refuses until then)" for p in noted]
    return [p for p in problems if p not in noted], notes


def job_warnings(job: JobSpec, recipe: Any = None) -> list[str]:
    """What is allowed but most likely not meant: a built-in recipe's --synthetic epoch on CPUs (hours)."""
    r = job.resources
    if recipe is None or r.gpus_per_node or r.shards_per_node:
        return []
    from hpctrain.recipes import synthetic_cpu_warning

    processes = r.nodes * r.nproc_per_node  # a single-process launcher asks for 1 x 1
    warning = synthetic_cpu_warning(recipe, processes * r.cpus_per_task)
    return [warning] if warning else []


def report_problems(command: str, problems: list[str]) -> None:
    for line in problems:
        print(f"hpctrain {command}: {for_terminal(redact(line))}", file=sys.stderr)


def report_warnings(command: str, job: JobSpec, recipe: Any = None) -> None:
    for line in job_warnings(job, recipe):
        print(f"hpctrain {command}: warning: {redact(line)}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    submission = submission_from_args(args, dry_run=args.dry_run)
    job = submission.job
    sched = get_backend(args, submission.scheduler, submission.options)
    rendered = sched.render(job)  # pure; what it cannot express fails here, before anything is sent
    report_warnings("submit", job, submission.recipe)
    from hpctrain.recipes import check_data  # run by the backend where it sees the data (it may not import it)

    problems = sched.local_check(job, submission.recipe, check_data=check_data)
    if args.dry_run:
        # The script or manifest is shown whatever the checks say (it is what the user asked to read); the exit
        # status is a real submit's verdict on everything that can be checked without the cluster.
        sys.stdout.write(redact(rendered.preview or rendered.text))  # the files keep the values: they are 0600
        problems, notes = dry_run_notes(job, problems)
        verdict = ["a real submit would refuse this job (exit status 2)"] if base.blocking(problems) else []
        report_problems("submit", problems + verdict + notes + [sched.dry_run_note])
        return 2 if verdict else 0
    cluster = [] if args.no_check else sched.check(job)
    # Warnings, and what the job will do at its time limit; notes on checks that could not run are `check`'s to say.
    report_problems(
        "submit", [p for p in problems + cluster if p.startswith((base.WARNING_PREFIX, base.TIME_LIMIT_NOTE))]
    )
    if blocking := base.blocking(problems + cluster):
        hint = (
            " (fix the above, or pass --no-check to skip the cluster checks)"
            if base.blocking(cluster)
            else " (fix the above)"
        )
        report_problems("submit", blocking + ["nothing was submitted" + hint])
        return 2
    job_id = sched.submit(job, rendered)
    said = sched.record(job, rendered, job_id, _description(submission))
    print(job_id, flush=True)
    report_problems("submit", said)
    if not (args.wait or args.follow):
        return 0
    return wait(sched, job_id, "submit", follow=args.follow)


def _description(submission: Submission) -> dict[str, Any]:
    """job.yaml: the job as a job file (resubmit with --job-file), with the backend's options in its section."""
    description = submission.job.to_dict()
    if submission.job.is_recipe:
        del description["run_dir"]  # derived from the recipe's options; a job file must not repeat it
    description["scheduler"] = submission.scheduler
    if submission.options:
        description[submission.scheduler] = {
            k: list(v) if isinstance(v, tuple) else v for k, v in submission.options.items()
        }
    return description


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
