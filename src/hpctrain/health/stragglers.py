"""Which rank holds the others up, and whether its time goes to input or to compute: a pure reading of the ranks'
progress records (health.progress).

Every rank of a data-parallel step waits for the slowest in the gradient all-reduce, so all step times are equal.
What differs is each rank's *own* time per step, spent before it can wait for anyone: waiting for its input and
running its forward pass. A rank is a straggler when its own time is at least STRAGGLER_FACTOR times the median of
the other ranks' and the difference is a noticeable share of the step (NOISE_SHARE), so that microsecond jitter on
a fast step never names anyone.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

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
        return (f"rank {self.rank} on {self.host} is a straggler: {self.own_s * 1000:.1f} ms per step of its own "
                f"(mostly {what}) against {self.others_s * 1000:.1f} ms on the other ranks; every rank waits for "
                f"it ({self.share:.0%} of each {self.step_s * 1000:.1f} ms step)")

    def as_dict(self) -> dict[str, object]:
        return {"rank": self.rank, "host": self.host, "cause": self.cause, "own_s": self.own_s,
                "others_s": self.others_s, "step_s": self.step_s}


def find_stragglers(records: list[RankProgress], now: float | None = None) -> list[Straggler]:
    # (rank, host, input s, forward s, step s) of the ranks with fresh timings
    timed = [(r.rank, r.host, r.data_s, r.compute_s, r.step_s) for r in records
             if r.data_s is not None and r.compute_s is not None and r.step_s and r.age_s(now) <= STALE_S]
    if len(timed) < 2:
        return []
    step = median(t[4] for t in timed)
    found = []
    for rank, host, data_s, compute_s, _ in timed:
        others = [t for t in timed if t[0] != rank]
        typical = median(t[2] + t[3] for t in others)
        own = data_s + compute_s
        if own >= STRAGGLER_FACTOR * typical and own - typical >= NOISE_SHARE * step:
            extra_data = data_s - median(t[2] for t in others)
            extra_compute = compute_s - median(t[3] for t in others)
            cause = "input" if extra_data >= extra_compute else "compute"
            found.append(Straggler(rank, host, cause, own, typical, min(1.0, (own - typical) / step), step))
    return found
