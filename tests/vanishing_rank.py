"""Test-only entry point: `hpctrain` with one rank that stops itself (SIGSTOP) right before a chosen collective.

torchrun starts this file in place of `-m hpctrain`; the rank named by HPCTRAIN_TEST_VANISH_RANK wraps one torch
entry point (HPCTRAIN_TEST_VANISH_AT, a name from SITES) and, at its Nth matching call
(HPCTRAIN_TEST_VANISH_CALL, default 1), freezes before taking part: alive, silent, exactly at that collective,
as a rank stuck in a dead NIC or a swapped-out node looks to its peers. The other ranks' collective then times out
there and nowhere else, so a test can name the collective that must be explained, with no race. Nothing of this
ships in hpctrain: it wraps torch's public functions from outside.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def _int64_vote(tensor: torch.Tensor, *_: Any, **__: Any) -> bool:
    """The loop's stop vote (StepVote): the reason and the proposed steps to the next vote."""
    return tensor.dtype == torch.int64 and tensor.numel() == 2


def _float64_of(n: int) -> Callable[..., bool]:
    return lambda tensor, *_, **__: tensor.dtype == torch.float64 and tensor.numel() == n


def _size_exchange(outputs: list[torch.Tensor], tensor: torch.Tensor, *_: Any, **__: Any) -> bool:
    """The first all-gather of hpctrain's `all_gather_object`: every rank's pickle size."""
    return tensor.dtype == torch.int64 and tensor.numel() == 1


# site: (owner, attribute, which calls count, how many of those come before the site's first) — what hpctrain's
# loop calls at each collective.
SITES: dict[str, tuple[Any, str, Callable[..., bool], int]] = {
    "host-names": (dist, "all_gather", _size_exchange, 0),
    "ddp-init": (DistributedDataParallel, "__init__", lambda *_, **__: True, 0),
    "forward": (DistributedDataParallel, "forward", lambda *_, **__: True, 0),
    "backward": (torch.Tensor, "backward", lambda *_, **__: True, 0),
    "stop-vote": (dist, "all_reduce", _int64_vote, 0),
    "loss-average": (dist, "all_reduce", _float64_of(2), 0),
    "evaluation": (dist, "all_reduce", _float64_of(4), 0),
    "checkpoint-vote": (dist, "all_reduce", _float64_of(3), 0),  # each rank's part written, the loss sums
    "checkpoint-barrier": (dist, "barrier", lambda *_, **__: True, 0),
}


def install(site: str, nth: int) -> None:
    owner, name, matches, before = SITES[site]
    original = getattr(owner, name)
    calls = 0

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        if matches(*args, **kwargs):
            calls += 1
            if calls == before + nth:
                print(f"vanishing_rank: rank {os.environ['RANK']} stops before {site} (call {nth})", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def main() -> int:
    if os.environ.get("RANK") == os.environ["HPCTRAIN_TEST_VANISH_RANK"]:
        install(os.environ["HPCTRAIN_TEST_VANISH_AT"], int(os.environ.get("HPCTRAIN_TEST_VANISH_CALL", "1")))
    from hpctrain.cli import main as hpctrain_main

    return hpctrain_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
