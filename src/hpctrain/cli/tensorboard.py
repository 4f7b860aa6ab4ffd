"""`hpctrain tensorboard RUN_DIR... [--port N] [--on-cluster]`: watch runs in TensorBoard.

Here: TensorBoard's own server on 127.0.0.1 (until Ctrl-C). With --on-cluster: a small CPU job (Slurm) or pod
(Kubernetes) reading the shared folder; it prints the tunnel or port-forward command, and `hpctrain cancel JOB`
stops it.
"""

from __future__ import annotations

import argparse
import signal

from hpctrain.cli.dev import add_scheduler_arguments, add_service_job_arguments, core_of, k8s_options, scheduler_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (their tb/ folders are read)")
    parser.add_argument("--port", type=int, help="port here (default: a free one)")
    parser.add_argument("--on-cluster", action="store_true", help="run TensorBoard as a small CPU job or pod on the cluster")
    parser.add_argument("--time", default="08:00:00", help="--on-cluster: time limit (default: 08:00:00)")
    cluster = parser.add_argument_group("--on-cluster (its environment must have tensorboard installed; "
                                        "on Kubernetes, a --volume holds the runs)")
    add_service_job_arguments(cluster, "Slurm: seconds to wait for TensorBoard to answer (default: 600)")
    add_scheduler_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from hpctrain import tbserver

    if not args.on_cluster:
        spec = tbserver.logdir_spec(args.run_dirs)
        stopped: list[int] = []

        def stop(signum: int, frame: object) -> None:
            stopped.append(signum)
            raise KeyboardInterrupt

        for signum in (signal.SIGTERM, signal.SIGHUP):  # a kill or a closed terminal stops the server too
            signal.signal(signum, stop)
        proc, url = tbserver.serve_local(spec, args.port)
        print(f"TensorBoard at {url} ({len(args.run_dirs)} run(s)); Ctrl-C stops it", flush=True)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            proc.wait(timeout=30)
            return 128 + stopped[0] if stopped else 0
    if scheduler_of(args) == "kubernetes":
        return _kubernetes(args)
    from hpctrain.cli.dev import environment_from_args
    from hpctrain.services.common import login_host

    tb = tbserver.ClusterTensorBoard(spec=tbserver.logdir_spec(args.run_dirs), environment=environment_from_args(args),
                                     time=args.time, partition=args.partition, account=args.account)
    job_id, endpoint = tbserver.start_slurm(tb, args.wait)
    local = args.port or endpoint.port
    print(f"\nTensorBoard is up on {endpoint.node}:{endpoint.port} (job {job_id}). On your machine, open the tunnel:")
    print(f"  {endpoint.tunnel_command(args.login_host or login_host(), local)}")
    print(f"then open:\n  http://localhost:{local}/")
    print(f"Stop it with: hpctrain cancel {job_id}")
    return 0


def _kubernetes(args: argparse.Namespace) -> int:
    from hpctrain import tbserver
    from hpctrain.services import kubernetes as k8s

    spec = tbserver.logdir_spec(args.run_dirs, check_exists=False)
    options = k8s_options(args, image=args.image, volumes=tuple(args.volume))
    pod = tbserver.service_pod(spec, args.time)
    k8s.create(core_of(args), k8s.render_pod(pod, options))
    local = args.port or tbserver.POD_PORT
    print(f"TensorBoard pod {pod.name} created in namespace {options.namespace}. On your machine:")
    print(f"  {k8s.port_forward_command(options.namespace, pod.name, local, tbserver.POD_PORT)}")
    print(f"then open:\n  http://localhost:{local}/")
    print(f"Stop it with: hpctrain cancel {pod.name} --scheduler kubernetes --namespace {options.namespace}")
    return 0
