"""`hpctrain check [job options]`: validate a job against the live cluster and submit nothing.

Takes the same options as `hpctrain submit` (Slurm or `--scheduler kubernetes`); prints one line per problem
(each naming the fix) and exits 2, or says that the job fits and exits 0. Warnings (lines starting with
`warning:`) do not fail the check.
"""

from __future__ import annotations

import argparse

from hpctrain.cli.submit import (
    add_job_arguments,
    cluster_check,
    local_check,
    report_problems,
    report_warnings,
    submission_from_args,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_job_arguments(parser)


def run(args: argparse.Namespace) -> int:
    submission = submission_from_args(args)
    job = submission.job
    report_warnings("check", job)
    if submission.scheduler != "slurm":
        return _check_backend(args, submission)
    problems = local_check(job) + cluster_check(job)
    if problems:
        report_problems("check", problems)
        return 2
    r = job.resources
    print(
        f"ok: {job.name}: {r.nodes} node(s) x {r.nproc_per_node} process(es), launcher {job.launcher}"
        + (f", partition {job.partition}" if job.partition else "")
        + (f", gres {r.gres}" if r.gres else "")
        + (f", time {job.time}" if job.time else "")
    )
    return 0


def _check_backend(args: argparse.Namespace, submission) -> int:
    from hpctrain.cli.scheduling import get_backend
    from hpctrain.schedulers.base import blocking

    job = submission.job
    sched = get_backend(args, submission.scheduler, submission.kubernetes)
    rendered = sched.render(job)  # what the scheduler cannot express fails here, one line
    problems = (sched.local_check(job) if hasattr(sched, "local_check") else []) + sched.check(job)
    report_problems("check", problems)
    if blocking(problems):
        return 2
    r = job.resources
    kind = rendered.payload.get("kind", "job") if isinstance(rendered.payload, dict) else "job"
    namespace = rendered.payload.get("metadata", {}).get("namespace") if isinstance(rendered.payload, dict) else None
    print(
        f"ok: {job.name}: {kind}, {r.nodes} pod(s) x {r.nproc_per_node} process(es)"
        + (f", namespace {namespace}" if namespace else "")
        + (f", {r.gpus_per_node} GPU(s) per pod" if r.gpus_per_node else "")
        + (f", time {job.time}" if job.time else "")
    )
    return 0
