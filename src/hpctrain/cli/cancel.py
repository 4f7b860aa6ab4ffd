"""`hpctrain cancel JOB [--signal SIG]`: cancel the job and say what became of it (Scheduler.cancel_and_wait;
its progress on stderr, the outcome on stdout).

Kubernetes: the job object is deleted (foreground); its pods get SIGTERM and their grace period (--signal-grace
at submit) to write a checkpoint before SIGKILL. A service pod of hpctrain's (a dev session, a TensorBoard started
with --on-cluster) is deleted with its Secret (the scheduler's services: Services.stop).

Slurm, plain cancel: Slurm sends SIGTERM to the job's processes (hpctrain's training loop checkpoints and exits), then
SIGKILL after the cluster's KillWait. With --signal: only that signal is sent and the job goes on running unless
the signal ends it.
"""

from __future__ import annotations

import argparse

from hpctrain.engine.scheduling import add_connection_arguments, backend_for
from hpctrain.safetext import for_terminal


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="job id")
    parser.add_argument(
        "--wait",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds to wait for the job to end before returning (default: 30; Kubernetes: exit status 1 when the "
        "job is still terminating then; 0: do not wait)",
    )
    add_connection_arguments(parser, role="cancel")


def run(args: argparse.Namespace) -> int:
    backend = backend_for(args)
    stopped = backend.services().stop(args.job)
    if stopped is not None:  # a dev session or cluster TensorBoard that is no job of the scheduler
        print(for_terminal(stopped))
        return 0
    from hpctrain.cli.views import progress_to_stderr, tell

    return tell(
        backend.cancel_and_wait(
            args.job, wait_s=args.wait, signal=args.signal, full=args.full, say=progress_to_stderr("cancel")
        )
    )
