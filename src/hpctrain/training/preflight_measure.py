"""`--preflight`: before the first step, every rank runs a few seconds of matrix multiplication on its device, all
ranks one all-reduce that measures the job's bandwidth, and each node's first rank exchanges a buffer with its
neighbour nodes' (a ring: which node has a bad link); the results are gathered and judged the same way on every
rank (hpctrain.health.preflight), so all agree without another vote. Rank 0 writes RUN/preflight.json and,
when a node is sick, RUN/bad_nodes, which the Slurm batch script reads to requeue the job without those nodes.

On by default for GPU jobs on several nodes: that is where a bad node hides among good ones after a long queue wait,
and where comparing nodes means something (a single node cannot be compared with itself). Not for CPU jobs: CPU
nodes are often shared, and a rank whose cores another job keeps busy runs its GEMM at a fraction of the others'
rate without anything being wrong with the node (seen on our own test machine: a 2-node CPU job excluded a node
that way, and could then no longer be scheduled). Ask for it with --preflight where CPU nodes are dedicated.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict

import torch

from hpctrain.distributed import all_gather_object, all_reduce
from hpctrain.distributed.collectives import collective_device, exchange
from hpctrain.distributed.failures import collective
from hpctrain.fsutil import write_atomic
from hpctrain.health.preflight import (
    BAD_NODES_FILE,
    CHECK_ID_ENV,
    PREFLIGHT_FILE,
    RankCheck,
    Verdict,
    judge,
    link_pairs,
    node_name,
)
from hpctrain.training.run import Run
from hpctrain.training.stopping import StopReason, write_termination_message

GEMM_S = 2.0
"""Seconds of GEMM per rank (after a warm-up)."""
ALLREDUCE_BYTES = {"cpu": 8 << 20, "cuda": 64 << 20}
ALLREDUCE_REPEATS = 5


def wanted(run: Run) -> bool:
    """--preflight / --no-preflight, else on for a GPU job on several nodes."""
    chosen = run.cfg.preflight
    if chosen is None:
        chosen = run.env.num_nodes > 1 and run.device.type == "cuda"
    return run.cfg.preflight_only or bool(chosen)


def gemm_gflops(device: torch.device, seconds: float = GEMM_S) -> float:
    """This device's rate of square matrix products (bf16 on a GPU, fp32 on the CPU), in GFLOP/s."""
    n, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (512, torch.float32)
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    out = torch.empty_like(a)
    torch.matmul(a, b, out=out)  # warm-up: kernels chosen, memory touched
    _sync(device)
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(10 if device.type == "cuda" else 1):
            torch.matmul(a, b, out=out)
            count += 1
        _sync(device)
    return 2.0 * n**3 * count / (time.perf_counter() - started) / 1e9


def allreduce_gbps(run: Run) -> float | None:
    """The job's all-reduce rate (bytes reduced per second, per rank), None for one process."""
    if not run.env.is_distributed:
        return None
    tensor = _buffer()
    return tensor.nbytes / _seconds_per_repeat(lambda: all_reduce(tensor), tensor.device) / 1e9


def link_gbps(nodes: list[str], rank: int) -> dict[str, float]:
    """This rank's exchanges with the leaders of its neighbour nodes (`link_pairs`): per peer node, the bytes sent
    and received per second, in GB/s; {} for a rank that leads no node or a job on one node."""
    rates: dict[str, float] = {}
    pairs = [pair for round_ in link_pairs(nodes) for pair in round_ if rank in pair]
    if not pairs:
        return rates
    tensor = _buffer()
    received = torch.empty_like(tensor)
    for a, b in pairs:
        peer = b if rank == a else a
        with collective(f"the preflight's link test with rank {peer} on {nodes[peer]}"):
            seconds = _seconds_per_repeat(lambda: exchange(tensor, received, peer, first=rank == a), tensor.device)
        rates[nodes[peer]] = 2 * tensor.nbytes / seconds / 1e9
    return rates


def _buffer() -> torch.Tensor:
    """The all-reduce's and link test's buffer on the collectives' device (ALLREDUCE_BYTES)."""
    device = collective_device()
    size = ALLREDUCE_BYTES.get(device.type, ALLREDUCE_BYTES["cpu"])
    return torch.ones(size // 4, dtype=torch.float32, device=device)


def _seconds_per_repeat(op: Callable[[], None], device: torch.device) -> float:
    """`op`'s time, the mean of ALLREDUCE_REPEATS runs after one warm-up run (which makes the connections)."""
    op()
    _sync(device)
    started = time.perf_counter()
    for _ in range(ALLREDUCE_REPEATS):
        op()
    _sync(device)
    return (time.perf_counter() - started) / ALLREDUCE_REPEATS


def run_preflight(run: Run) -> Verdict:
    """Measure, gather, judge; rank 0 records it and says it. Every rank calls it (collectives inside)."""
    error, rate = None, None
    try:
        rate = gemm_gflops(run.device)
    except Exception as err:  # a broken device is the finding, not a crash of the check
        error = f"{type(err).__name__}: {err}"[:300]
    with collective("the preflight's all-reduce"):
        bandwidth = allreduce_gbps(run)
    node = node_name()
    if run.env.is_distributed:
        with collective("the preflight's exchange of node names"):
            nodes = all_gather_object(node)
        links = link_gbps(nodes, run.env.rank)
    else:
        links = {}
    mine = asdict(RankCheck(run.env.rank, node, rate, error, links))
    with collective("the preflight's exchange of results"):
        checks = [RankCheck(**c) for c in all_gather_object(mine)]
    verdict = judge(checks, bandwidth)
    if verdict.bad:  # every pod's own status says it (Kubernetes), whichever node is the sick one
        write_termination_message(f"{StopReason.SICK_NODE.label}: {','.join(verdict.bad_nodes)}")
    if run.is_main:
        record = {**verdict.as_dict(), "check_id": os.environ.get(CHECK_ID_ENV)}  # the check that asked, if any
        write_atomic(run.run_dir / PREFLIGHT_FILE, (json.dumps(record, indent=2) + "\n").encode())
        if verdict.bad:
            write_atomic(run.run_dir / BAD_NODES_FILE, "".join(f"{node}\n" for node in verdict.bad_nodes).encode())
        else:
            (run.run_dir / BAD_NODES_FILE).unlink(missing_ok=True)  # an earlier attempt's finding is not this one's
        for line in verdict.lines():
            run.say(line)
    return verdict


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
