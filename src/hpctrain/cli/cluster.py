"""`hpctrain cluster [--json]`: what the cluster has and what is in use.

Slurm: per-node state, CPUs, memory, GPUs and shards (per GPU) in use, and the partitions.
Kubernetes: per node, allocatable against requested CPU, memory and GPUs; the namespace's quota use.
"""

from __future__ import annotations

import argparse
import json

from hpctrain.cli.scheduling import add_connection_arguments, backend_for


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    parser.add_argument("--partition", "-p", metavar="NAME", help="Slurm: only the nodes of this partition")
    add_connection_arguments(parser)


def run(args: argparse.Namespace) -> int:
    backend = backend_for(args, {"partition": "--partition"})
    if backend is None:
        return _run_slurm(args)
    from dataclasses import asdict

    view = backend.cluster()
    if args.json:
        print(json.dumps(asdict(view), indent=2))
        return 0
    if not view.nodes:
        print("no nodes: the cluster has no node registered, so no pod can run until one joins (a node registers "
              "when its kubelet starts); ask the cluster admin")
        for line in view.quota:
            print(f"quota: {line}")
        return 0
    gib = 2**30
    rows = [("NODE", "CPU REQ/ALLOC", "MEMORY REQ/ALLOC", "GPU REQ/ALLOC", "SCHEDULABLE")] + [
        (n.name, f"{n.cpu_requested:g}/{n.cpu_allocatable:g}",
         f"{n.memory_requested / gib:.1f}/{n.memory_allocatable / gib:.1f}Gi",
         f"{n.gpus_requested}/{n.gpus_allocatable}", "yes" if n.schedulable else "no")
        for n in view.nodes]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    for line in view.quota:
        print(f"quota: {line}")
    return 0


def _run_slurm(args: argparse.Namespace) -> int:
    from hpctrain.schedulers.slurm.query import ClusterInfo, query_cluster
    from hpctrain.errors import UserError

    info = query_cluster()
    if args.partition:
        part = info.partition(args.partition)
        if part is None:
            names = ", ".join(p.name for p in info.partitions)
            raise UserError(f"--partition {args.partition}: no such partition; choose one of: {names}")
        info = ClusterInfo(partitions=(part,), nodes=tuple(info.nodes_in(part)))
    if args.json:
        print(json.dumps(info.to_dict(), indent=2))
        return 0
    from hpctrain.schedulers.slurm.display import console, nodes_table, partitions_table

    out = console()
    out.print(nodes_table(info))
    out.print(partitions_table(info))
    return 0
