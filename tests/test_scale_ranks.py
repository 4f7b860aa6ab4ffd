"""What hpctrain's own collectives cost each rank does not grow with the world (issue 32): counted, not timed.

Real torch.distributed (gloo on CPU) at 2 and 4 processes, run once for the module by benchmarks/scale_ranks.py
(which prints the same counts at more sizes, with their growth): a rendezvous store that counts every request on
its way (a `torch.distributed.Store` around the FileStore), and each process's open sockets (/proc/self/fd).
Measured in each rank:

- the stop vote's side group (made at the first vote, as on a GPU job) and three votes: a ring all-reduce needs two
  peers a rank, so at most one listening socket plus two connections and, to find the two peers, one store request
  to publish the rank's address plus two (wait, get) a peer. A full mesh, as gloo makes a group by default, opens
  N - 1 connections and makes 2 N + 1 requests a rank (N² in all);
- the roll call after a failed collective, with the last rank gone: each rank counts itself in and polls the count
  (O(1) requests a poll); only the first to answer then checks each rank's key, once. Before, every rank checked
  every rank's key every 0.2 s: N² requests a poll;
- a checkpoint's save: the bytes its collectives bring each rank (before: every rank's RNG state, 14.6 KB a rank),
  the size of rank 0's file (before: the same 14.6 KB a rank in it), and what a resumed rank opens for its part.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain import compat
from training_helpers import clean_environ

ROOT = Path(__file__).resolve().parents[1]
SIZES = (2, 4)
# On one pytest-xdist worker (scripts/test.sh runs --dist loadgroup): a module-scoped fixture runs once per worker
# that runs one of the module's tests, and this one is about 20 CPU s.
pytestmark = pytest.mark.xdist_group("scale-ranks")


@pytest.fixture(scope="module")
def counted() -> dict[int, list[dict]]:
    """Each size's ranks' counts, in rank order, from benchmarks/scale_ranks.py (which holds the worker)."""
    result = subprocess.run(
        [sys.executable, "benchmarks/scale_ranks.py", "--sizes", ",".join(map(str, SIZES)), "--json"],
        cwd=ROOT,
        env=clean_environ(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    return {int(size): ranks for size, ranks in json.loads(result.stdout.strip().splitlines()[-1]).items()}


@pytest.mark.slow
@pytest.mark.skipif(not compat.gloo_connects_lazily(), reason="torch < 2.8 makes every gloo group a full mesh")
def test_the_vote_groups_sockets_and_store_requests_per_rank_do_not_grow_with_the_world(counted) -> None:
    for size, results in counted.items():
        assert [r["reasons"] for r in results] == [["none", "cancelled", "none"]] * size
        peers = min(2, size - 1)
        for rank, result in enumerate(results):
            assert result["vote_sockets"] <= 1 + peers, (size, rank, result)
            assert result["vote_requests"] <= 1 + 2 * peers, (size, rank, result)


@pytest.mark.slow
@pytest.mark.floor  # torch 2.2 binds no Store.check: there the roll call never answered before
def test_the_roll_call_costs_each_rank_o1_requests_a_poll_and_one_rank_a_look_at_each(counted) -> None:
    for size, results in counted.items():
        survivors = results[:-1]
        assert all(r["missing"] == {str(size - 1): True} for r in survivors), survivors  # named, with its host
        checks = [r["roll_call"].get("check", 0) for r in survivors]
        # One rank looks at each rank's key once (and at the missing one's host); the others read its verdict.
        assert sum(checks) <= size + 1, (size, checks)
        assert all(r["roll_call"].get("get", 0) <= 2 for r in survivors), survivors


@pytest.mark.slow
def test_a_checkpoint_brings_each_rank_the_same_few_bytes_and_a_resume_reads_its_own_part(counted) -> None:
    received = {size: {r["checkpoint_received"] for r in results} for size, results in counted.items()}
    assert received[2] == received[4] and max(received[4]) < 1024, received
    assert len({results[0]["checkpoint_bytes"] for results in counted.values()}) == 1, "the file grew with the world"
    for size, results in counted.items():
        for rank, result in enumerate(results):
            assert result["resume_opened"] == [f"rank-{rank}.pt"], result  # its own part: one file
            assert result["resumed"] == [size, float(rank), sum(range(size)) / size], result
