"""The preflight verdict: from every rank's few seconds of matrix multiplication (and whether its checks ran at
all), which nodes are far slower than the others or broken. Pure: the measuring is
hpctrain.training.preflight_measure's.

A rank is slow when its GEMM rate is below SLOW_SHARE of the median rank's; a node is named when one of its ranks
is slow or failed. Half the median is far outside what the same hardware shows (a few percent), and well inside
what a thermally throttled GPU, a GPU that fell back to a low clock, or a CPU node shared with another job show.

Links. The all-reduce's bandwidth is one figure for the whole job (all ranks take part in one collective), recorded
for comparison between runs, never blamed on a node. To find a node with a bad link, the first rank of each node
(its leader) exchanges a buffer with the next node's leader, around a ring (`link_pairs`): every node has two
measured links (one with two nodes). A link's rate is the slower of its two ends' figures. A node is named when
*all* its links run below SLOW_SHARE of the fastest link in the job: one slow link between two good nodes blames
neither, and with two nodes (one link) nothing can be told apart, so nothing is blamed. The fastest link, not the
median, is the yardstick: in a ring of three, one bad node makes two of the three links slow.
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from hpctrain.readback import BadRunFile, bounds, parse_record, read_json

PREFLIGHT_FILE = "preflight.json"
BAD_NODES_FILE = "bad_nodes"
# Read back at most this much: a check is a few hundred bytes a rank, a bad node's name a line.
MAX_PREFLIGHT_BYTES = 16 << 20
MAX_BAD_NODES_BYTES = 1 << 20
# The node a process runs on, as its scheduler names it, where the host name is something else: a Kubernetes pod's
# host name is the pod's, so hpctrain's pods get their node's name (spec.nodeName) in this variable.
NODE_NAME_ENV = "HPCTRAIN_NODE_NAME"
SLOW_SHARE = 0.5


@dataclass(frozen=True)
class RankCheck:
    rank: int = field(metadata=bounds(0, None))
    node: str = field(metadata=bounds(1, 255))
    gemm_gflops: float | None = field(metadata=bounds(0, None))  # None: the GEMM failed (see error)
    error: str | None = field(default=None, metadata=bounds(multiline=True))
    # a node's leader: peer node -> GB/s of their exchange
    links: dict[str, float] = field(default_factory=dict)

    def check(self) -> str | None:
        """For `parse_record` (a record read back): what the types alone do not say."""
        if any(rate < 0 for rate in self.links.values()):
            return "a link's rate is negative"
        return None


@dataclass(frozen=True)
class _Recorded:
    """What `read_verdict` needs of RUN/preflight.json (the rest is recomputed by `judge`)."""

    checks: list[dict[str, Any]] = field(metadata=bounds(1, None))
    allreduce_gbps: float | None = field(default=None, metadata=bounds(0, None))
    check_id: str | None = None  # the `hpctrain check --preflight` that asked for it (CHECK_ID_ENV), if one did


@dataclass(frozen=True)
class Verdict:
    checks: list[RankCheck]
    median_gflops: float | None
    allreduce_gbps: float | None
    bad: dict[str, list[str]] = field(default_factory=dict)  # node -> why
    links: dict[str, float] = field(default_factory=dict)  # "NODE-NODE" -> GB/s (the slower end's figure)

    @property
    def bad_nodes(self) -> list[str]:
        return sorted(self.bad)

    def lines(self) -> list[str]:
        if not self.bad:
            rate = f"{self.median_gflops:,.1f} GFLOP/s median GEMM" if self.median_gflops else "no GEMM rate"
            bandwidth = f", all-reduce {self.allreduce_gbps:.2f} GB/s" if self.allreduce_gbps else ""
            if self.links:
                low, high = min(self.links.values()), max(self.links.values())
                bandwidth += f", {len(self.links)} node link(s) {low:.2f}-{high:.2f} GB/s"
            return [
                f"preflight: {len(self.checks)} rank(s) on {len({c.node for c in self.checks})} node(s) passed "
                f"({rate}{bandwidth})"
            ]
        return [f"preflight: node {node} is sick: {'; '.join(why)}" for node, why in sorted(self.bad.items())] + [
            f"preflight: submit away from them with --exclude-nodes {','.join(self.bad_nodes)}"
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "checks": [asdict(c) for c in self.checks],
            "median_gflops": self.median_gflops,
            "allreduce_gbps": self.allreduce_gbps,
            "links_gbps": self.links,
            "slow_share": SLOW_SHARE,
            "bad_nodes": self.bad,
        }


def judge(checks: list[RankCheck], allreduce_gbps: float | None) -> Verdict:
    rates = [c.gemm_gflops for c in checks if c.gemm_gflops is not None]
    typical = median(rates) if rates else None
    bad: dict[str, list[str]] = {}
    for c in sorted(checks, key=lambda c: c.rank):
        if c.gemm_gflops is None:
            bad.setdefault(c.node, []).append(f"rank {c.rank}'s check failed: {c.error or 'no result'}")
        elif typical and c.gemm_gflops < SLOW_SHARE * typical:
            bad.setdefault(c.node, []).append(
                f"rank {c.rank}'s GEMM runs at {c.gemm_gflops:,.1f} GFLOP/s, {c.gemm_gflops / typical:.0%} of the "
                f"median rank's {typical:,.1f} (below {SLOW_SHARE:.0%})"
            )
    links = _links(checks)
    fastest = max(links.values(), default=0.0)
    by_node: dict[str, dict[tuple[str, str], float]] = {}  # node -> its own links: one pass, not one per node
    for pair, rate in links.items():
        for end in pair:
            by_node.setdefault(end, {})[pair] = rate
    for node in sorted({c.node for c in checks}):
        own = by_node.get(node, {})
        if len(links) > 1 and own and all(rate < SLOW_SHARE * fastest for rate in own.values()):
            peers = ", ".join(
                f"{'-'.join(n for n in pair if n != node)} {rate:.2f}" for pair, rate in sorted(own.items())
            )
            bad.setdefault(node, []).append(
                f"its links run at {peers} GB/s, below {SLOW_SHARE:.0%} of the fastest link's {fastest:.2f}"
            )
    return Verdict(checks, typical, allreduce_gbps, bad, {"-".join(pair): rate for pair, rate in links.items()})


def read_verdict(path: Path, within: Path | None = None, check_id: str | None = None) -> Verdict:
    """The verdict recorded in a preflight.json (`judge` applied again to its checks). BadRunFile (one line naming
    the file and what is wrong) for a file that is not one, or, given `check_id`, for another check's record;
    FileNotFoundError when there is none."""
    recorded = parse_record(_Recorded, read_json(path, MAX_PREFLIGHT_BYTES, within), path)
    if check_id is not None and recorded.check_id != check_id:
        raise BadRunFile(path, "an earlier run's, not this check's (its check id differs)")
    checks = [parse_record(RankCheck, check, f"{path}, check {i + 1}") for i, check in enumerate(recorded.checks)]
    if len({c.rank for c in checks}) != len(checks):
        raise BadRunFile(path, "names a rank twice")
    return judge(checks, recorded.allreduce_gbps)


def _links(checks: list[RankCheck]) -> dict[tuple[str, str], float]:
    """Each measured link between two nodes, by its sorted pair of names: the slower of its two ends' figures."""
    links: dict[tuple[str, str], float] = {}
    for c in checks:
        for peer, rate in c.links.items():
            a, b = sorted((c.node, peer))
            links[(a, b)] = min(rate, links.get((a, b), rate))
    return links


def link_pairs(nodes: list[str]) -> list[list[tuple[int, int]]]:
    """The link test's rounds of rank pairs, from each rank's node (by rank): the lowest rank of each node leads
    it; leaders pair with the next node's leader around a ring (one pair for two nodes), and no rank is in two
    pairs of one round (at most three rounds). Every rank computes the same rounds, so the pairs meet in order."""
    leaders: dict[str, int] = {}
    for rank, node in enumerate(nodes):
        leaders.setdefault(node, rank)
    ring = list(leaders.values())
    edges = [(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring) if len(ring) > 2 else len(ring) - 1)]
    rounds: list[list[tuple[int, int]]] = []
    while edges:
        busy: set[int] = set()
        this, edges_left = [], []
        for a, b in edges:
            if a in busy or b in busy:
                edges_left.append((a, b))
            else:
                this.append((a, b))
                busy |= {a, b}
        rounds.append(this)
        edges = edges_left
    return rounds


def node_name() -> str:
    """The node as its scheduler names it, what --exclude-nodes takes: Slurm's SLURMD_NODENAME, a Kubernetes pod's
    node (HPCTRAIN_NODE_NAME, which hpctrain's pods get from spec.nodeName), else the host name. Every report that
    names where a rank runs (preflight, hang, stragglers, `top`) uses it: a pod's own host name is no node."""
    return os.environ.get("SLURMD_NODENAME") or os.environ.get(NODE_NAME_ENV) or socket.gethostname()


CHECK_ID_ENV = "HPCTRAIN_PREFLIGHT_ID"
"""`hpctrain check --preflight` gives its preflight job a fresh id in this variable; rank 0 writes it into
preflight.json as `check_id`, and the check believes only a record with its own id (the run directory may hold an
earlier check's record, from another job of the same name)."""
