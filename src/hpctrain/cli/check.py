"""`hpctrain check [job options]`: validate a job against the live cluster and submit nothing.

Takes the same options as `hpctrain submit` (any scheduler); prints one line per problem
(each naming the fix) and exits 2, or says that the job fits and exits 0. Warnings (lines starting with
`warning:`) and notes (`note:`, a check that could not run here) do not fail the check.

`--preflight` then does submit something: the training's preflight (hpctrain.training.preflight_measure) as a short job
of
its own, with the job's nodes and resources, training nothing; it waits for it and says which nodes are sick.
"""

from __future__ import annotations

import argparse
import secrets
from pathlib import Path
from typing import Any

from hpctrain.engine import submission
from hpctrain.engine.job_options import add_job_arguments
from hpctrain.cli.owned import owned_job
from hpctrain.cli.submit import report_problems, wait
from hpctrain.errors import UserError
from hpctrain.health.preflight import CHECK_ID_ENV, PREFLIGHT_FILE, read_verdict
from hpctrain.readback import BadRunFile
from hpctrain.safetext import for_terminal
from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers import backend_info

PREFLIGHT_TIME = 15 * 60  # seconds
"""The preflight job's time limit (minutes): start-up, a few seconds of checks, and the queue's own slack."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_job_arguments(parser)
    parser.add_argument(
        "--preflight",
        action="store_true",
        help="then run the training's preflight as a short job of its own on the job's nodes and "
        "resources, without training (every rank's GEMM rate and the job's all-reduce, as `train "
        "--preflight`), wait for it, and exit 2 when a node is sick",
    )


def run(args: argparse.Namespace) -> int:
    job = submission.build(submission.job_flags(vars(args)), command_optional=not args.preflight)
    report_problems("check", submission.here_warnings())  # said even where the backend cannot be made here
    sched = job.backend()
    rendered = submission.preview(job, sched)  # what the scheduler cannot express fails here, one line
    problems = submission.check(job, backend=sched, rendered=rendered)
    report_problems("check", [p.line for p in problems])
    if any(p.blocking for p in problems):
        return 2
    if job.submission.resources_only:
        print(
            f"ok: {sched.summary(job.spec, rendered)} (the resources only: add `-- COMMAND ...` or `train WORKLOAD "
            "...` to check the program too)"
        )
        return 0
    print(f"ok: {sched.summary(job.spec, rendered)}")
    if not args.preflight:
        return 0
    # The probe runs once: the backend's options that would start it again are off (Slurm: hang restarts).
    from hpctrain.engine.scheduling import get_backend

    probe = {**job.submission.options, **backend_info(job.scheduler).probe_options}
    return _preflight(get_backend(args, job.scheduler, probe), job.spec, job.scheduler)


def _preflight(sched: Any, job: JobSpec, scheduler: str) -> int:
    if not job.is_recipe:
        raise UserError(
            "--preflight runs the training's own check: give `train WORKLOAD [train options]` as the "
            "command, as the job itself would run it"
        )
    run_dir = f"{job.run_dir}-preflight" if job.run_dir else None
    check_id = secrets.token_hex(8)  # this check's: a record without it is an earlier one's
    probe = job.replace(
        name=f"{job.name}-preflight",
        command=(*job.command, "--preflight-only"),
        time_limit_s=PREFLIGHT_TIME,
        signal_grace=0,
        run_dir=run_dir,
        env=(*job.env, (CHECK_ID_ENV, check_id)),
    )
    rendered = sched.render(probe)
    with owned_job(sched, "check") as owned:  # the probe is this command's: interrupted, it is cancelled
        job_id = owned.submit(lambda: sched.submit(probe, rendered))
        print(f"preflight: job {job_id} checks the nodes it gets", flush=True)
        status = wait(sched, job_id, "check")
    here = backend_info(scheduler).local_run_dir(run_dir.replace("%j", job_id)) if run_dir else None
    record = here / PREFLIGHT_FILE if here is not None else None
    if record is None or not record.is_file():
        shown = Path(run_dir.replace("%j", job_id)) / PREFLIGHT_FILE if run_dir else None
        where = f" ({shown} on the job's file system)" if shown is not None else ""
        print(f"preflight: job {job_id} ended with exit status {status}{where}")
        return 0 if status == 0 else 2
    try:
        verdict = read_verdict(record, check_id=check_id)
    except BadRunFile as err:  # damaged, or an earlier check's record
        print(
            f"preflight: job {job_id} ended with exit status {status}, and its record {record} is unusable: "
            f"{err.reason}; no verdict (see the job's output)",
            flush=True,
        )
        return 2
    # the verdict names the nodes the job got, as they call themselves
    print("\n".join(map(for_terminal, verdict.lines())) + f"\npreflight: the figures are in {record}", flush=True)
    return 2 if verdict.bad or status != 0 else 0
