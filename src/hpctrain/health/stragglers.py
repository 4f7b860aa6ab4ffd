"""Which rank holds the others up, and whether its time goes to input or to compute: a pure reading of the ranks'
progress records (health.progress).

Every rank of a data-parallel step waits for the slowest in the gradient all-reduce, so all step times are equal.
What differs is each rank's *own* time per step, spent before it can wait for anyone: waiting for its input and
running its forward pass. A rank is a straggler when its own time is at least STRAGGLER_FACTOR times the median of
the other ranks' and the difference is a noticeable share of the step (NOISE_SHARE), so that microsecond jitter on
a fast step never names anyone.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from statistics import StatisticsError, median

from hpctrain.health.progress import RankProgress

STRAGGLER_FACTOR = 1.5
NOISE_SHARE = 0.05
STALE_S = 60.0
"""Records older than this are not compared (a rank that stopped writing is a matter for the hang watchdog)."""


@dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    cause: str  # "input" or "compute"
    own_s: float  # its input + forward seconds per step
    others_s: float  # the median of the other ranks' own time
    share: float  # of the step time, its extra own time
    step_s: float  # the step time every rank sees

    def describe(self) -> str:
        what = "waiting for input" if self.cause == "input" else "computing (forward pass)"
        return (
            f"rank {self.rank} on {self.host} is a straggler: {self.own_s * 1000:.1f} ms per step of its own "
            f"(mostly {what}) against {self.others_s * 1000:.1f} ms on the other ranks; every rank waits for "
            f"it ({self.share:.0%} of each {self.step_s * 1000:.1f} ms step)"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "rank": self.rank,
            "host": self.host,
            "cause": self.cause,
            "own_s": self.own_s,
            "others_s": self.others_s,
            "step_s": self.step_s,
        }


def find_stragglers(records: list[RankProgress], now: float | None = None) -> list[Straggler]:
    """The stragglers among `records`: O(N log N) in the number of ranks (rank 0 runs this while the others wait,
    and `status`/`top` on every view), since each rank's "median of the others" is read off the sorted values of
    all ranks rather than recomputed from a list of the others."""
    # (rank, host, input s, forward s, step s) of the ranks with fresh timings
    timed = [
        (r.rank, r.host, r.data_s, r.compute_s, r.step_s)
        for r in records
        if r.data_s is not None and r.compute_s is not None and r.step_s and r.age_s(now) <= STALE_S
    ]
    if len(timed) < 2:
        return []
    step = median(t[4] for t in timed)
    by_rank: dict[int, list[int]] = {}  # rank -> its positions in timed (one each, unless a list repeats a rank)
    for i, t in enumerate(timed):
        by_rank.setdefault(t[0], []).append(i)
    owns = [t[2] + t[3] for t in timed]
    datas, computes = [t[2] for t in timed], [t[3] for t in timed]
    sorted_owns, sorted_datas, sorted_computes = sorted(owns), sorted(datas), sorted(computes)
    found = []
    for i, (rank, host, data_s, compute_s, _) in enumerate(timed):
        same = by_rank[rank]
        typical = _median_without(sorted_owns, [owns[j] for j in same])
        own = owns[i]
        if own >= STRAGGLER_FACTOR * typical and own - typical >= NOISE_SHARE * step:
            extra_data = data_s - _median_without(sorted_datas, [datas[j] for j in same])
            extra_compute = compute_s - _median_without(sorted_computes, [computes[j] for j in same])
            cause = "input" if extra_data >= extra_compute else "compute"
            found.append(Straggler(rank, host, cause, own, typical, min(1.0, (own - typical) / step), step))
    return found


def _median_without(ordered: list[float], left_out: list[float]) -> float:
    """statistics.median of the sorted `ordered` less one occurrence of each value in `left_out` (values taken from
    it), the same figure to the bit, in O(k log n) for k left out instead of the O(n log n) of a fresh list."""
    kept = len(ordered) - len(left_out)
    if kept <= 0:
        raise StatisticsError("no median for empty data")
    # the positions left out: equal values take consecutive positions from the first of their run
    positions: list[int] = []
    taken: dict[float, int] = {}
    for value in sorted(left_out):
        positions.append(bisect_left(ordered, value) + taken.get(value, 0))
        taken[value] = taken.get(value, 0) + 1

    def at(k: int) -> float:  # the k-th (from 0) of the values kept, in order
        for position in positions:  # ascending
            if position <= k:
                k += 1
        return ordered[k]

    if kept % 2:
        return at(kept // 2)
    return (at(kept // 2 - 1) + at(kept // 2)) / 2
