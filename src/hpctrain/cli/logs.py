"""`hpctrain logs JOB [-f] [--err | --replica NAME]`: print a job's output, or follow it until the job ends.

The chosen scheduler's log follower (Scheduler.logs). Slurm: the job's output file (--err: its stderr file).
Kubernetes: one replica's container log through the API server (default: rank 0, master-0; --replica worker-1
for another).
"""

from __future__ import annotations

import argparse

from hpctrain.engine.scheduling import add_connection_arguments, backend_for
from hpctrain.cli.views import progress_to_stderr


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="job id")
    parser.add_argument("-f", "--follow", action="store_true", help="keep printing new output until the job ends")
    add_connection_arguments(parser, role="logs")


def run(args: argparse.Namespace) -> int:
    backend = backend_for(args)
    lines = backend.logs(
        args.job,
        follow=args.follow,
        replica=args.replica,
        stream=args.stream or "stdout",  # a backend that keeps streams apart declares the flag
        say=progress_to_stderr("logs"),
    )
    for line in lines:
        print(line, flush=args.follow)
    return 0
