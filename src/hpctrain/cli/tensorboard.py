"""`hpctrain tensorboard RUN_DIR... [--port N] [--on-cluster]`: watch runs in TensorBoard.

Here: TensorBoard's own server on 127.0.0.1 (until Ctrl-C). With --on-cluster: a small CPU job (Slurm) or pod
(Kubernetes) reading the shared folder, started by the chosen scheduler's services (Scheduler.services()); it prints
the tunnel or port-forward command, and `hpctrain cancel JOB` stops it.
"""

from __future__ import annotations

import argparse
import signal

from hpctrain.cli.service_lines import (
    access_lines,
    add_placement_arguments,
    placement_from_args,
    services_of,
    show_step,
)
from hpctrain.engine.scheduling import add_connection_arguments, chosen_scheduler_help


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (their tb/ folders are read)")
    parser.add_argument("--port", type=int, help="port here (default: a free one)")
    parser.add_argument(
        "--on-cluster", action="store_true", help="run TensorBoard as a small CPU job or pod on the cluster"
    )
    parser.add_argument("--time", default="08:00:00", help="--on-cluster: time limit (default: 08:00:00)")
    cluster = parser.add_argument_group(
        "--on-cluster (its environment must have tensorboard installed; on Kubernetes, a --volume holds the runs)"
    )
    add_placement_arguments(cluster, wait_help="Slurm: seconds to wait for TensorBoard to answer (default: 600)")
    add_connection_arguments(
        parser, role="tensorboard", scheduler_help=chosen_scheduler_help("--on-cluster: where TensorBoard runs")
    )


def run(args: argparse.Namespace) -> int:
    if args.on_cluster:
        services = services_of(args)
        placement = placement_from_args(args, "tensorboard")
        access = services.tensorboard(args.run_dirs, args.time, placement, args.wait, args.port, show_step)
        print("\n".join(access_lines(access)))
        return 0
    from hpctrain.servers import tensorboard as tbserver

    spec = tbserver.logdir_spec(args.run_dirs)
    stopped: list[int] = []

    def stop(signum: int, frame: object) -> None:
        stopped.append(signum)
        raise KeyboardInterrupt

    for signum in (signal.SIGTERM, signal.SIGHUP):  # a kill or a closed terminal stops the server too
        signal.signal(signum, stop)
    proc = None
    try:  # a signal at any point from here on stops the server (which also dies with this process) and says how
        proc, url = tbserver.serve_local(spec, args.port)
        print(f"TensorBoard at {url} ({len(args.run_dirs)} run(s)); Ctrl-C stops it", flush=True)
        return proc.wait()
    except KeyboardInterrupt:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        return 128 + stopped[0] if stopped else 0
