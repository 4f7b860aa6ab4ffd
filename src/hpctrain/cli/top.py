"""`hpctrain top JOB [--watch]`: GPU utilization and memory, CPU load and the run's images/s, per node."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hpctrain.cli.dev import add_scheduler_arguments, scheduler_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB", help="job id (Slurm) or job name (Kubernetes)")
    parser.add_argument("--run-dir", type=Path, help="the run's directory, for step and images/s (default: read "
                                                     "from the job's batch script when hpctrain submitted it)")
    parser.add_argument("--watch", action="store_true", help="refresh until the job ends or Ctrl-C")
    parser.add_argument("--interval", type=float, default=5.0, metavar="S", help="--watch: seconds between samples")
    parser.add_argument("--count", type=int, metavar="N", help="--watch: stop after N samples")
    add_scheduler_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from hpctrain import top
    from hpctrain.errors import UserError

    if args.interval <= 0 or (args.count is not None and args.count < 1):
        raise UserError("--interval must be above 0 and --count at least 1")
    kubernetes = scheduler_of(args) == "kubernetes"
    run_dir = args.run_dir
    shown = 0
    while True:
        if kubernetes:
            samples, label = _sample_kubernetes(args), f"job {args.job}"
        else:
            info, samples = top.sample_slurm(args.job)
            label = f"job {info.job_id}"
            if run_dir is None and shown == 0:
                run_dir = top.run_dir_of(info.job_id, info.work_dir)
        lines = top.report(samples, top.latest_metrics(run_dir), label)
        if args.watch and sys.stdout.isatty():
            print("\033[H\033[J", end="")
        if args.watch:
            print(f"{label} at {time.strftime('%H:%M:%S')}")
        print("\n".join(lines), flush=True)
        shown += 1
        if not args.watch or (args.count is not None and shown >= args.count):
            return 0
        time.sleep(args.interval)
        if args.watch:
            print()


def _sample_kubernetes(args: argparse.Namespace):
    from hpctrain import top
    from hpctrain.schedulers.kubernetes.options import KubernetesOptions
    from hpctrain.schedulers.kubernetes.scheduler import KubernetesScheduler

    from hpctrain.errors import UserError

    from hpctrain.schedulers.base import JobNotFound
    from hpctrain.schedulers.kubernetes.kubeconfig import default_namespace

    namespace = args.namespace or default_namespace(args.context)
    for api in ("pytorchjob", "trainjob"):  # a job name is one job in its namespace, of either kind
        sched = KubernetesScheduler(KubernetesOptions(namespace=namespace, api=api), context=args.context)
        try:
            sched.get_object(args.job)
        except JobNotFound:
            continue
        return top.sample_pods(sched.core, sched.pods_of(args.job))
    raise UserError(f"no PyTorchJob or TrainJob named {args.job!r} in namespace {sched.namespace}: check the name "
                    "and --namespace (hpctrain status lists the jobs)")
