"""A job's page beyond its status view: what its run directory holds and how to reach the job.

    run_dir(scheduler, job)    where this machine sees the job's run directory (Services.run_dir), or None
    run_parts(run_dir)         the job description it was submitted with (job.yaml), its attempts with how each
                               started and ended (provenance.json), the hang report when the last attempt hung
    metrics(run_dir)           loss, accuracy and images/s over steps from metrics.jsonl, at most MAX_POINTS each
    access(scheduler, job)     the shell command beside it and the logs it keeps (Scheduler.access)

Everything is read through the engine's readers (hpctrain.readback, hpctrain.training.provenance and .metrics,
hpctrain.health): bounded, never through a link, each record checked; a file that is not what it should be is its
one line on the page. Every string goes through hpctrain.web.safeview before a template or the page's script sees
it; numbers are finite floats or left out.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

from hpctrain.engine import submission
from hpctrain.errors import UserError
from hpctrain.health.hang import MAX_REPORT_BYTES, report_path
from hpctrain.readback import BadRunFile, read_text
from hpctrain.schedulers.base import Scheduler, Table
from hpctrain.stops import STOP_REASON_FILE
from hpctrain.training.metrics import read_metrics
from hpctrain.training.provenance import ATTEMPT_COLUMNS, attempt_rows, read_attempts
from hpctrain.web.safeview import line, table

JOB_FILE = "job.yaml"  # what `submit` records beside the rendered script (Scheduler.record)
MAX_DESCRIPTION_BYTES = 256 << 10
MAX_ATTEMPTS_SHOWN = 200  # the newest; a job requeued more often says how many were left out
MAX_POINTS = 400  # per series: a long metrics.jsonl is thinned to this many points, its last one always kept
SERIES = (
    ("train_loss", "train loss"),
    ("test_loss", "test loss"),
    ("test_accuracy", "test accuracy"),
    ("images_per_s", "images/s"),
)


def run_dir(scheduler: Scheduler, job_id: str) -> Path | None:
    """The job's run directory as this machine sees it; None when the backend cannot tell or the job was not
    submitted by hpctrain (or it is not a directory here)."""
    found = scheduler.services().run_dir(job_id)
    return found if found is not None and found.is_dir() else None


def run_parts(directory: Path) -> dict[str, Any]:
    """The job description (text), the attempts (a table), the hang report (text, or None), and the lines that say
    what could not be read."""
    problems: list[str] = []
    description = None
    try:
        description = read_text(directory / JOB_FILE, MAX_DESCRIPTION_BYTES, within=directory)
    except FileNotFoundError:
        problems.append(f"no {JOB_FILE} in {directory}: the job was not submitted by `hpctrain submit`")
    except (BadRunFile, OSError) as err:
        problems.append(str(err))
    attempts: list[dict[str, Any]] = []
    try:
        attempts = read_attempts(directory)
    except (BadRunFile, OSError) as err:
        problems.append(str(err))
    rows = attempt_rows(attempts)
    if len(rows) > MAX_ATTEMPTS_SHOWN:
        problems.append(f"{len(rows) - MAX_ATTEMPTS_SHOWN} earlier attempts not shown")
        rows = rows[-MAX_ATTEMPTS_SHOWN:]
    return {
        "run_dir": line(str(directory)),
        "resume": None if description is None else resume_command(directory, description, attempts),
        "description": None if description is None else _text(description),
        "attempts": table(Table(ATTEMPT_COLUMNS, rows)) if rows else None,
        "hang_report": _hang_report(directory, problems),
        "problems": [line(p) for p in problems],
    }


def resume_command(directory: Path, description: str, attempts: list[dict[str, Any]]) -> str | None:
    """The CLI's way to continue this run directory in a new job, exactly: its job file with the run directory
    given and, for a built-in recipe, its recorded options with `--resume` (the newest valid checkpoint; add a
    larger --epochs to train further), run where the job was submitted from (relative paths in it are from there).
    None when job.yaml holds no command. The resume button submits the same job from that directory
    (engine.submission.resume)."""
    flags = submission.resume_flags(directory, description)
    if flags is None:
        return None
    # A built-in recipe's train command; a program of one's own resumes from its run directory itself.
    rest = flags["job_command"] if "job_command" in flags else ["--run-dir", flags["run_dir"]]
    words = ["hpctrain", "submit", "--job-file", str(directory / JOB_FILE), *rest]
    where = submission.first_directory(attempts)
    return line((f"cd {shlex.quote(where)} && " if where else "") + shlex.join(words))


def _text(text: str) -> list[str]:
    """A multi-line text from a file, a visible-safe line each (a <pre> of them on the page)."""
    return [line(t) for t in text.splitlines()]


def _hang_report(directory: Path, problems: list[str]) -> list[str] | None:
    """The hang report (its culprit and each rank's stack) when the run's last attempt ended hung."""
    try:
        if read_text(directory / STOP_REASON_FILE, 4096, within=directory).strip() != "hung":
            return None
        return _text(read_text(report_path(directory), MAX_REPORT_BYTES, within=directory))
    except FileNotFoundError:
        return None
    except (BadRunFile, OSError) as err:
        problems.append(str(err))
        return None


def metrics(directory: Path | None) -> dict[str, Any]:
    """{"series": [{"key", "label", "points": [[step, value], ...]}], "records": N, "skipped": [lines]}: each series'
    finite values over the steps, thinned evenly to MAX_POINTS (the last kept)."""
    if directory is None:
        return {"series": [], "records": 0, "skipped": []}
    skipped: list[str] = []

    def bad(err: BadRunFile) -> None:
        if len(skipped) < 5:  # a few say what is wrong; a file of bad lines is not copied to the page
            skipped.append(line(str(err)))

    try:
        records = read_metrics(directory, on_bad=bad)
    except (BadRunFile, OSError) as err:
        raise UserError(str(err)) from None
    series = []
    for key, label in SERIES:
        points = [
            [float(r["step"]), float(r[key])]
            for r in records
            if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
        ]
        series.append({"key": key, "label": label, "points": thin(points, MAX_POINTS)})
    return {"series": series, "records": len(records), "skipped": skipped}


def thin(points: list[Any], most: int) -> list[Any]:
    """At most `most` of `points`, evenly spaced, the first and the last kept."""
    if len(points) <= most:
        return points
    stride = (len(points) - 1) / (most - 1)
    return [points[round(i * stride)] for i in range(most)]


def access(scheduler: Scheduler, job_id: str) -> dict[str, Any]:
    """The shell command beside the job and the logs it keeps, as the backend says them."""
    found = scheduler.access(job_id)
    return {
        "shell": line(found.shell),
        "replicas": [line(r) for r in found.replicas],
        "streams": [s for s in found.streams if s in ("stdout", "stderr")],
    }
