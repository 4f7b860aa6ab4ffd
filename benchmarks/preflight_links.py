"""The preflight's link test: how long the node leaders' exchanges take, and the rates they measure.

Every process started by torchrun plays a node of its own (node0, node1, ...), so N local processes give the ring of
N nodes the preflight builds (hpctrain.health.preflight.link_pairs); gloo over loopback on a CPU machine. Rank 0
prints the wall time of the whole test (every round, up to the last pair) and its own links' rates.

    torchrun --standalone --nproc-per-node 3 benchmarks/preflight_links.py
"""

from __future__ import annotations

import time

import torch.distributed as dist

from hpctrain.training.preflight_measure import link_gbps


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    nodes = [f"node{i}" for i in range(world)]
    dist.barrier()
    started = time.perf_counter()
    rates = link_gbps(nodes, rank)
    dist.barrier()
    if rank == 0:
        shown = ", ".join(f"{peer} {rate:.2f} GB/s" for peer, rate in sorted(rates.items()))
        print(f"link test, {world} nodes: {(time.perf_counter() - started) * 1000:.0f} ms; rank 0's links: {shown}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
