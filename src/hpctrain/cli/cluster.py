"""`hpctrain cluster [--json]`: per-node state, CPUs, memory, GPUs and shards (per GPU) in use, and the partitions."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of tables")
    parser.add_argument("--partition", "-p", metavar="NAME", help="only the nodes of this partition")


def run(args: argparse.Namespace) -> int:
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
