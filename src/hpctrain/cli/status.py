"""`hpctrain status [JOB] [--json]`: jobs with state, pending reason, nodes, elapsed time and restarts.

Without JOB: your jobs that the controller knows (squeue). With JOB: that job in full (scontrol, or sacct where
the cluster keeps accounting), including its exit status and output files.
"""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", nargs="?", metavar="JOB", help="a job id (default: all your jobs)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")
    parser.add_argument("--all-users", action="store_true", help="everyone's jobs, not only yours")


def run(args: argparse.Namespace) -> int:
    from hpctrain.schedulers.slurm.display import console, jobs_table
    from hpctrain.schedulers.slurm.jobs import get_job, list_jobs
    from hpctrain.schedulers.slurm.records import format_duration
    from hpctrain.errors import UserError

    if args.job is None:
        jobs = list_jobs(all_users=args.all_users)
        if args.json:
            print(json.dumps([j.to_dict() for j in jobs], indent=2))
        elif not jobs:
            print("no jobs (Slurm forgets ended jobs after a few minutes; `hpctrain logs JOB` still finds their output)")
        else:
            console().print(jobs_table(jobs))
        return 0

    job = get_job(args.job)
    if job is None:
        from pathlib import Path

        records = sorted(str(p) for p in Path.cwd().glob(f"runs/*-{args.job}/job.yaml"))
        seen = f"; its submission record is {records[0]}" if records else ""
        raise UserError(
            f"job {args.job} not found: Slurm forgets ended jobs after a few minutes and accounting (sacct) does not "
            f"know it either{seen}; `hpctrain logs {args.job}` still looks for its output"
        )
    if args.json:
        print(json.dumps(job.to_dict(), indent=2))
        return 0
    out = console()
    out.print(jobs_table([job]))
    details = [
        ("partition", job.partition),
        ("exit status", None if job.exit_code is None else str(job.exit_code)),
        ("time limit", format_duration(job.time_limit_s) if job.source == "scontrol" else None),
        ("submitted", job.submit_time),
        ("started", job.start_time),
        ("ended", job.end_time),
        ("stdout", job.stdout),
        ("stderr", job.stderr if job.stderr != job.stdout else None),
    ]
    for key, value in details:
        if value:
            out.print(f"{key + ':':12} {value}", highlight=False, soft_wrap=True)
    return 0
