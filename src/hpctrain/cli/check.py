"""`hpctrain check [job options]`: validate a job against the live cluster and submit nothing.

Takes the same options as `hpctrain submit` (Slurm or `--scheduler kubernetes`); prints one line per problem
(each naming the fix) and exits 2, or says that the job fits and exits 0. Warnings (lines starting with
`warning:`) and notes (`note:`, a check that could not run here) do not fail the check.
"""

from __future__ import annotations

import argparse

from hpctrain.cli.scheduling import get_backend
from hpctrain.cli.submit import add_job_arguments, report_problems, report_warnings, submission_from_args
from hpctrain.schedulers.base import blocking


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_job_arguments(parser)


def run(args: argparse.Namespace) -> int:
    submission = submission_from_args(args)
    job = submission.job
    report_warnings("check", job)
    sched = get_backend(args, submission.scheduler, submission.options)
    rendered = sched.render(job)  # what the scheduler cannot express fails here, one line
    problems = sched.local_check(job, submission.recipe) + sched.check(job)
    report_problems("check", problems)
    if blocking(problems):
        return 2
    print(f"ok: {sched.summary(job, rendered)}")
    return 0
