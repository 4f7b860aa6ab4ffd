"""`hpctrain status [JOB] [--json]`: jobs with state, pending reason, nodes, elapsed time and restarts.

Slurm: without JOB, your jobs that the controller knows (squeue); with JOB, that job in full (scontrol, or sacct
where the cluster keeps accounting), including its exit status and output files.
Kubernetes: without JOB, the namespace's PyTorchJobs (or TrainJobs); with JOB, its conditions, each replica's pod
phase, node and restarts, and why it waits (scheduler events).
"""

from __future__ import annotations

import argparse
import json

from hpctrain.cli.scheduling import add_connection_arguments, backend_for


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", nargs="?", metavar="JOB", help="a job id (default: all your jobs)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")
    parser.add_argument("--all-users", action="store_true", help="Slurm: everyone's jobs, not only yours")
    add_connection_arguments(parser)


def run(args: argparse.Namespace) -> int:
    backend = backend_for(args, {"all_users": "--all-users"})
    if backend is not None:
        return _run_backend(args, backend)
    return _run_slurm(args)


def _run_backend(args: argparse.Namespace, backend) -> int:
    from dataclasses import asdict

    if args.job is None:
        jobs = backend.list_jobs()
        if args.json:
            print(json.dumps([asdict(j) for j in jobs], indent=2))
        elif not jobs:
            print(f"no jobs in namespace {backend.options.namespace}")
        else:
            rows = [("JOB", "STATE", "REPLICAS", "CREATED")] + [(j.job_id, j.state, str(j.replicas), j.created or "") for j in jobs]
            _print_rows(rows)
        return 0
    status = backend.status(args.job)
    if args.json:
        print(json.dumps({**asdict(status), "finished": status.finished}, indent=2))
        return 0
    exit_code = "" if status.exit_code is None else f", exit status {status.exit_code}"
    restarts = f", {status.restarts} restart(s)" if status.restarts else ""
    print(f"{status.job_id}: {status.state}{exit_code}{restarts}")
    if status.message:
        print(f"message: {status.message}")
    if status.replicas:
        rows = [("REPLICA", "PHASE", "NODE", "RESTARTS", "EXIT", "REASON")] + [
            (r.name, r.phase, r.node or "-", str(r.restarts), "-" if r.exit_code is None else str(r.exit_code), r.reason or "")
            for r in status.replicas]
        _print_rows(rows)
    for reason in status.pending_reasons:
        print(f"waiting: {reason}")
    return 0


def _print_rows(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


def _run_slurm(args: argparse.Namespace) -> int:
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
