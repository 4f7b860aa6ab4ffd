"""`hpctrain debug preempt JOB`: send a running job the warning its time limit would send, now, to rehearse
checkpoint, requeue and resume. The scheduler does it (Scheduler.preempt; Slurm's in
hpctrain.schedulers.slurm.services.preempt reads the signal from the job's own batch script).

`hpctrain debug stacks JOB`: every rank of a running job writes its Python stacks (hpctrain.health.stacks).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from hpctrain.engine.scheduling import add_connection_arguments, backend_for
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
    preempt.add_argument(
        "--follow", action="store_true", help="wait until the job has requeued itself (or ended) and say which"
    )
    preempt.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="with --follow: give up waiting after S seconds (default: 600)",
    )
    add_connection_arguments(preempt, role="preempt")
    stacks = actions.add_parser(
        "stacks",
        help="every rank of a running training job writes the Python stacks of all its threads: stuck or just slow?",
        description=(
            "Ask every rank of JOB (an `hpctrain train` run, or a script using hpctrain.training's watch) for the "
            "Python stacks of all its threads. The request is a file in the run directory, which every rank's "
            "watchdog thread checks each second; each answers in RUN/stacks/rank-N.txt, also while its main thread "
            "is blocked in a collective or in I/O. A rank that does not answer is frozen or gone."
        ),
    )
    stacks.add_argument("job", metavar="JOB", help="job id (Slurm) or job name (Kubernetes)")
    stacks.add_argument(
        "--run-dir",
        type=Path,
        help="the run's directory (default: read from the job's batch script "
        "when hpctrain submitted it; on Kubernetes, without it, the request goes through a pod of the job, whose "
        "exec (as `kubectl exec`) reads the answers from the pods' volume)",
    )
    stacks.add_argument(
        "--wait", type=float, default=15.0, metavar="S", help="how long to wait for every rank's answer (default: 15)"
    )
    add_connection_arguments(stacks, role="stacks")


def run(args: argparse.Namespace) -> int:
    if args.action == "preempt":
        from hpctrain.cli.views import progress_to_stdout, tell

        return tell(
            backend_for(args).preempt(
                args.job,
                signal=args.signal,
                steps=args.steps,
                follow=args.follow,
                timeout_s=args.timeout,
                say=progress_to_stdout,
            )
        )
    if args.action == "stacks":
        return _stacks(args)
    raise UserError(f"unknown debug action {args.action!r}: use `hpctrain debug preempt JOB`")  # argparse prevents it


def _stacks(args: argparse.Namespace) -> int:
    from hpctrain.cli.service_lines import services_of
    from hpctrain.health import read_progress, request_stacks
    from hpctrain.health.stacks import STACKS_DIR, answers

    if args.wait <= 0:
        raise UserError("--wait must be above 0 (seconds)")
    services = services_of(args)
    run_dir = args.run_dir or services.run_dir(args.job)
    if run_dir is None:  # the run directory lies where only the job sees it: ask from inside the job
        remote = services.stacks(args.job, args.wait)
        for rank, text in sorted(remote.answers.items()):
            print(f"== rank {rank}, from {remote.where}'s RUN/{STACKS_DIR}/rank-{rank}.txt ==\n{text}")
        return _silent(remote.ranks, set(remote.answers), args.wait)
    ranks = read_progress(run_dir)
    if not ranks:
        raise UserError(
            f"{run_dir} has no progress records (RUN/progress/): the run has not started training, "
            "or it is not an hpctrain run"
        )
    token = request_stacks(run_dir)  # answers name it: no clock (this machine's or the file server's) is compared
    deadline = time.monotonic() + args.wait
    while len(got := answers(run_dir, token)) < ranks[0].world_size and time.monotonic() < deadline:
        time.sleep(0.5)
    answered = {int(path.stem.split("-")[1]) for path in got}
    for path in got:
        print(path)
    return _silent(ranks, answered, args.wait)


def _silent(ranks: list[Any], answered: set[int], wait_s: float) -> int:
    """Name the ranks that did not answer; exit status 1 when none did."""
    silent = [r.where() for r in ranks if r.rank not in answered]
    if silent:
        print(
            f"no answer within {wait_s:g} s from: {', '.join(silent)} (frozen, stopped or gone, or a script "
            "without hpctrain's health watch, which answers: hpctrain.training.script_watch.health_watch; "
            "`hpctrain status` and its log say more)"
        )
    return 0 if answered else 1
