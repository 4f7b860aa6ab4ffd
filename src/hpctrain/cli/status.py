"""`hpctrain status [JOB] [--json]`: jobs with state, pending reason, nodes, elapsed time and restarts.

The chosen scheduler returns them in its own terms (Scheduler.status_view) and hpctrain.cli.views prints them.
Slurm: without JOB, your jobs that the controller knows (squeue); with JOB, that job in full (squeue, or sacct
where the cluster keeps accounting), including its exit status and output files. Kubernetes: without JOB, the
namespace's PyTorchJobs (or TrainJobs); with JOB, its conditions, each replica's pod phase, node and restarts, and
why it waits (scheduler events).
"""

from __future__ import annotations

import argparse

from hpctrain.engine.scheduling import add_connection_arguments, backend_for


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", nargs="?", metavar="JOB", help="a job id (default: all your jobs)")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")
    add_connection_arguments(parser, role="status")


def run(args: argparse.Namespace) -> int:
    from hpctrain.cli.views import show

    show(backend_for(args).status_view(args.job, all_users=args.all_users), as_json=args.json)
    return 0
