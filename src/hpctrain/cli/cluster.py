"""`hpctrain cluster [--json]`: what the cluster has and what is in use, as the chosen scheduler shows it
(Scheduler.cluster_view, printed by hpctrain.cli.views).

Slurm: per-node state, CPUs, memory, GPUs and shards (per GPU) in use, and the partitions.
Kubernetes: per node, allocatable against requested CPU, memory and GPUs; the namespace's quota use.
"""

from __future__ import annotations

import argparse

from hpctrain.engine.scheduling import add_connection_arguments, backend_for


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    add_connection_arguments(parser, role="cluster")


def run(args: argparse.Namespace) -> int:
    from hpctrain.cli.views import show

    show(backend_for(args).cluster_view(partition=args.partition), as_json=args.json)
    return 0
