"""`hpctrain cancel JOB [--signal SIG]`: cancel the job and say what became of it.

Kubernetes: the job object is deleted (foreground); its pods get SIGTERM and their grace period (--signal-grace
at submit) to write a checkpoint before SIGKILL. A service pod of hpctrain's (a dev session, a TensorBoard started
with --on-cluster) is deleted with its Secret.

Slurm, plain cancel: Slurm sends SIGTERM to the job's processes (hpctrain's training loop checkpoints and exits), then
SIGKILL after the cluster's KillWait. With --signal: only that signal is sent and the job goes on running unless
the signal ends it.
"""

from __future__ import annotations

import argparse
import time

from hpctrain.cli.scheduling import add_connection_arguments, backend_for


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="job id")
    parser.add_argument("--signal", "-s", metavar="SIG", help="Slurm: send this signal (e.g. USR1) instead of cancelling")
    parser.add_argument("--full", action="store_true", help="Slurm, with --signal: signal the batch shell too, not only the job steps")
    parser.add_argument(
        "--wait", type=float, default=30.0, metavar="S", help="seconds to wait for the job to end before returning (default: 30)"
    )
    add_connection_arguments(parser)


def run(args: argparse.Namespace) -> int:
    backend = backend_for(args, {"signal": "--signal", "full": "--full"})
    if backend is None:
        return _run_slurm(args)
    from hpctrain.errors import UserError
    from hpctrain.services import kubernetes as service_pods

    pod = service_pods.find(backend.core, backend.namespace, args.job)
    if pod is not None:  # a dev session or cluster TensorBoard: a pod and its Secret, no job object
        service_pods.delete(backend.core, backend.namespace, args.job)
        kind = pod.metadata.labels.get(service_pods.SERVICE_LABEL)
        print(f"{kind} pod {backend.namespace}/{args.job} and its secret deleted")
        return 0
    before = backend.status(args.job)
    if before.finished:
        print(f"job {before.job_id} already ended ({before.state}); nothing to cancel")
        return 0
    backend.cancel(before.job_id)
    deadline = time.monotonic() + max(0.0, args.wait)
    while time.monotonic() < deadline:
        try:
            backend.status(before.job_id)
        except UserError:  # the job object is gone: its pods are gone too (foreground deletion)
            print(f"job {before.job_id}: {before.state} -> deleted (its pods are gone)")
            return 0
        time.sleep(0.5)
    print(f"job {before.job_id}: cancel requested; its pods are stopping (they have their grace period to checkpoint)")
    return 0


def _run_slurm(args: argparse.Namespace) -> int:
    from hpctrain.schedulers.slurm.jobs import cancel, get_job
    from hpctrain.errors import UserError

    before = get_job(args.job)
    if before is None:
        raise UserError(f"job {args.job} not found: it ended a while ago or the id is wrong (see `hpctrain status`)")
    if before.finished:
        print(f"job {before.job_id} already ended ({before.state}); nothing to cancel")
        return 0
    cancel(before.job_id, signal=args.signal, full=args.full)
    if args.signal:
        target = "its steps and batch shell" if args.full else "its steps"
        print(f"sent {args.signal.upper()} to job {before.job_id} ({target}; it was {before.state})")
        return 0
    deadline = time.monotonic() + max(0.0, args.wait)
    while True:
        after = get_job(before.job_id)
        if after is None or after.finished or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if after is None:
        print(f"job {before.job_id}: {before.state} -> ended (Slurm no longer lists it)")
    elif after.finished:
        print(f"job {before.job_id}: {before.state} -> {after.state}")
    else:
        print(f"job {before.job_id}: cancel requested; it is {after.state} (Slurm is stopping its processes)")
    return 0
