"""`hpctrain debug preempt JOB`: send a running job the warning its time limit would send, now, to rehearse
checkpoint, requeue and resume. The scheduler does it (Scheduler.preempt; Slurm's in
hpctrain.schedulers.slurm.preempt reads the signal from the job's own batch script).
"""

from __future__ import annotations

import argparse

from hpctrain.cli.scheduling import add_connection_arguments, backend_for
from hpctrain.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    preempt = actions.add_parser(
        "preempt",
        help="send a running job its time-limit warning now, to rehearse checkpoint, requeue and resume",
        description=(
            "Send JOB the warning signal its time limit would send (read from the job's #SBATCH --signal line, "
            "e.g. USR1 to the batch shell for jobs from `hpctrain submit`). hpctrain jobs checkpoint at the next "
            "step, requeue themselves and resume. Slurm then holds the requeued job (reason BeginTime) for a "
            "couple of minutes before the next attempt starts."
        ),
    )
    preempt.add_argument("job", metavar="JOB", help="job id of a running job")
    preempt.add_argument("--signal", "-s", metavar="SIG",
                         help="send this signal instead of the one the job's script asks for (e.g. USR1); "
                              "needed when the job got its --signal on sbatch's command line")
    preempt.add_argument("--steps", action="store_true",
                         help="with --signal: deliver it to the job steps instead of the batch shell "
                              "(like --signal=USR1@TIME without B:)")
    preempt.add_argument("--follow", action="store_true",
                         help="wait until the job has requeued itself (or ended) and say which")
    preempt.add_argument("--timeout", type=float, default=600.0, metavar="S",
                         help="with --follow: give up waiting after S seconds (default: 600)")
    add_connection_arguments(preempt)


def run(args: argparse.Namespace) -> int:
    if args.action == "preempt":
        return backend_for(args).preempt(args.job, signal=args.signal, steps=args.steps, follow=args.follow,
                                         timeout_s=args.timeout)
    raise UserError(f"unknown debug action {args.action!r}: use `hpctrain debug preempt JOB`")  # argparse prevents it
