"""`hpctrain check [job options]`: validate a job against the live cluster and submit nothing.

Takes the same options as `hpctrain submit`; prints one line per problem (each naming the fix) and exits 2, or
says that the job fits and exits 0.
"""

from __future__ import annotations

import argparse

from hpctrain.cli.submit import add_job_arguments, cluster_check, job_from_args, local_check, report_problems, report_warnings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_job_arguments(parser)


def run(args: argparse.Namespace) -> int:
    job = job_from_args(args)
    report_warnings("check", job)
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
