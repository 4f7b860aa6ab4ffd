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
        "--wait", type=float, default=30.0, metavar="S",
        help="seconds to wait for the job to end before returning (default: 30; Kubernetes: exit status 1 when the "
             "job is still terminating then; 0: do not wait)"
    )
    add_connection_arguments(parser)


def run(args: argparse.Namespace) -> int:
    backend = backend_for(args, {"signal": "--signal", "full": "--full"})
    if backend is None:
        return _run_slurm(args)
    from hpctrain.services import kubernetes as service_pods

    pod = service_pods.find(backend.core, backend.namespace, args.job)
    if pod is not None:  # a dev session or cluster TensorBoard: a pod and its Secret, no job object
        service_pods.delete(backend.core, backend.namespace, args.job)
        kind = pod.metadata.labels.get(service_pods.SERVICE_LABEL)
        print(f"{kind} pod {backend.namespace}/{args.job} and its secret deleted")
        return 0
    return _cancel_backend(args, backend)


def _cancel_backend(args: argparse.Namespace, backend) -> int:
    """Delete the job, then say what happens while waiting: its pods stopping, then the object gone. A job still
    there when --wait runs out is reported as still terminating, with exit status 1."""
    import sys

    from hpctrain.schedulers.base import JobNotFound

    before = backend.status(args.job)
    if before.finished:
        print(f"job {before.job_id} already ended ({before.state}); nothing to cancel")
        return 0
    backend.cancel(before.job_id)
    pods = len(before.replicas)
    wait = max(0.0, args.wait)
    if wait == 0:
        print(f"job {before.job_id}: deletion requested ({_pods(pods)} stopping; see `{backend.command('status', before.job_id)}`)")
        return 0

    def say(text: str) -> None:
        print(f"hpctrain cancel: {text}", file=sys.stderr, flush=True)

    say(f"deleting job {before.job_id} ({before.state}); " + (
        f"its {_pods(pods)} get SIGTERM and their grace period to checkpoint; waiting up to {wait:g} s" if pods else
        f"it has no pods; waiting up to {wait:g} s for the API server to remove it"))
    deadline = time.monotonic() + wait
    left = pods
    while True:
        try:
            now = backend.status(before.job_id)
        except JobNotFound:
            print(f"job {before.job_id}: {before.state} -> deleted" + (" (its pods are gone)" if pods else ""))
            return 0
        if len(now.replicas) != left:
            left = len(now.replicas)
            say(f"{_pods(left)} still stopping" if left else "its pods are gone; waiting for the job object to go")
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if left:
        why = (f"{_pods(left)} still stopping (within their grace period, or stuck on a node that does not answer)")
    else:
        why = ("it has no pods left, but the object remains: a foreground deletion ends when Kubernetes' garbage "
               "collector (part of kube-controller-manager) removes it; if that does not happen, ask the cluster admin")
    print(f"job {before.job_id}: still terminating after {wait:g} s: {why}; `{backend.command('status', before.job_id)}` "
          "shows when it is gone")
    return 1


def _pods(count: int) -> str:
    return f"{count} pod{'s' if count != 1 else ''}" if count else "no pods"


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
