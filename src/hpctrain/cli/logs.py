"""`hpctrain logs JOB [-f] [--err | --replica NAME]`: print a job's output, or follow it until the job ends.

Slurm: the job's output file (--err: its stderr file). Kubernetes: one replica's container log through the API
server (default: rank 0, master-0; --replica worker-1 for another).
"""

from __future__ import annotations

import argparse
import sys

from hpctrain.cli.scheduling import add_connection_arguments, backend_for


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="job id")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new output until the job ends")
    parser.add_argument("--err", action="store_true", help="Slurm: the job's stderr file instead of its stdout")
    parser.add_argument("--replica", metavar="NAME", help="Kubernetes: the replica whose log to show (master-0, worker-1; default: rank 0)")
    add_connection_arguments(parser)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    backend = backend_for(args, {"err": "--err"})
    if backend is None:
        return _run_slurm(args)
    for line in backend.logs(args.job, follow=args.follow, replica=args.replica):
        print(line, flush=args.follow)
    return 0


def _run_slurm(args: argparse.Namespace) -> int:
    from hpctrain.schedulers.slurm.jobs import check_job_id, get_job
    from hpctrain.schedulers.slurm.output import follow, output_candidates
    from hpctrain.errors import UserError

    job_id = check_job_id(args.job)
    stream = "stderr" if args.err else "stdout"
    info = get_job(job_id)
    candidates = output_candidates(job_id, info, stream)
    path = next((p for p in candidates if p.is_file()), None)
    if args.err and info is not None and info.stderr and info.stderr == info.stdout:
        print(f"hpctrain logs: job {job_id} writes stderr to the same file as stdout", file=sys.stderr)

    if args.follow and info is not None and not info.finished:
        target = path or candidates[0]
        if path is None:
            print(f"hpctrain logs: waiting for {target} (job {job_id} is {info.state})", file=sys.stderr)

        def finished() -> bool:
            now = get_job(job_id)
            return now is None or now.finished

        follow(target, _write, finished)
        last = get_job(job_id)
        state = last.state if last is not None else "gone"
        print(f"hpctrain logs: job {job_id} ended: {state}", file=sys.stderr)
        return 0

    if path is None:
        where = ", ".join(str(p) for p in candidates)
        if info is not None and not info.finished:
            raise UserError(f"job {job_id} is {info.state} and has written no output yet ({where}); use -f to wait for it")
        raise UserError(
            f"no output file for job {job_id} (looked at {where}); run this in the directory you submitted from, "
            f"or pass the job's --output path to `cat`"
        )
    with open(path, encoding="utf-8", errors="replace") as handle:
        for chunk in iter(lambda: handle.read(1 << 16), ""):
            sys.stdout.write(chunk)
    sys.stdout.flush()
    return 0
