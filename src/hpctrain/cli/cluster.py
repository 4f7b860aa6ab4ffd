"""`hpctrain cluster [--json]`: what the cluster has and what is in use, as the chosen scheduler shows it
(Scheduler.report_cluster).

Slurm: per-node state, CPUs, memory, GPUs and shards (per GPU) in use, and the partitions.
Kubernetes: per node, allocatable against requested CPU, memory and GPUs; the namespace's quota use.
"""

from __future__ import annotations

import argparse

from hpctrain.cli.scheduling import add_connection_arguments, backend_for


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    parser.add_argument("--partition", "-p", metavar="NAME", help="Slurm: only the nodes of this partition")
    add_connection_arguments(parser)


def run(args: argparse.Namespace) -> int:
    backend_for(args).report_cluster(as_json=args.json, partition=args.partition)
    return 0
