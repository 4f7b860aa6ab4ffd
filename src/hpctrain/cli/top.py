"""`hpctrain top JOB [--watch]`: GPU utilization and memory, CPU load and the run's images/s, per node.

The chosen scheduler's services run the probe on the job's nodes; hpctrain.servers.top reads it."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hpctrain.cli.service_lines import services_of
from hpctrain.engine.scheduling import add_connection_arguments, chosen_scheduler_help


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="job id (Slurm) or job name (Kubernetes)")
    parser.add_argument(
        "--run-dir",
        type=Path,
        help="the run's directory, for step and images/s (default: read "
        "from the job's batch script when hpctrain submitted it)",
    )
    parser.add_argument("--watch", action="store_true", help="refresh until the job ends or Ctrl-C")
    parser.add_argument("--interval", type=float, default=5.0, metavar="S", help="--watch: seconds between samples")
    parser.add_argument("--count", type=int, metavar="N", help="--watch: stop after N samples")
    add_connection_arguments(parser, role="top", scheduler_help=chosen_scheduler_help("where JOB runs"))


def run(args: argparse.Namespace) -> int:
    from hpctrain.servers import top
    from hpctrain.errors import UserError
    from hpctrain.health import read_progress
    from hpctrain.safetext import for_terminal

    if args.interval <= 0 or (args.count is not None and args.count < 1):
        raise UserError("--interval must be above 0 and --count at least 1")
    services = services_of(args)
    run_dir = args.run_dir
    shown = 0
    while True:
        try:
            sample = services.top(args.job, find_run_dir=run_dir is None and shown == 0)
        except top.JobNotRunning as ended:
            if not shown:
                raise
            # --watch outlived the job: that is its normal end
            print(f"{for_terminal(str(ended))}; top ends", flush=True)
            return 0
        run_dir = run_dir or sample.run_dir
        ranks = read_progress(run_dir) if run_dir is not None else top.ranks_of(sample.nodes)
        lines = top.report(sample.nodes, top.latest_metrics(run_dir), sample.label, ranks)
        if args.watch and sys.stdout.isatty():
            print("\033[H\033[J", end="")
        if args.watch:
            print(f"{for_terminal(sample.label)} at {time.strftime('%H:%M:%S')}")
        print("\n".join(map(for_terminal, lines)), flush=True)  # node and GPU names are the nodes' words
        shown += 1
        if not args.watch or (args.count is not None and shown >= args.count):
            return 0
        time.sleep(args.interval)
        if args.watch:
            print()
