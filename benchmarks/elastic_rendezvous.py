"""Rendezvous store traffic per membership change of an elastic job (issue 42), counted at 4 to 32 agents and
fitted, as the scale harness does (benchmarks/scale_ranks.py: counts, not times; the fit is the exponent of the
growth between the smallest and the largest size), then carried to 1,000 nodes.

What is counted is torch's own c10d rendezvous, the one `torchrun --nnodes=MIN:MAX --rdzv-backend=c10d` runs
(DynamicRendezvousHandler over C10dRendezvousBackend, built by torch's create_handler with the parameters torchrun
gives it): N agents, one per node, each a thread of this process with its own TCPStore client, wrapped so that
every request it sends is counted with its bytes. A first round forms with all N; then one agent dies (its
heartbeats stop, as when its node is lost) and the other N-1 call next_rendezvous() again, as their torchrun does
when it restarts the worker group; the figures are what the survivors sent from then until the new round of N-1
formed. An agent's timer-thread heartbeats stop while it is in next_rendezvous (its keep-alives then go with its join
loop's requests, counted here); between changes each agent writes one every keep_alive_interval (5 s by default),
whether or not anything changes.

hpctrain's own part of a change is small beside it and counted by benchmarks/scale_ranks.py: the roll call after
the failed collective (O(1) store requests per rank), one file (RUN/peer_lost.json) created once by the first
survivor, and the next group's start-up exchange of names (one all_gather, not the store).

    python benchmarks/elastic_rendezvous.py                  # 4, 8, 16, 32 agents
    python benchmarks/elastic_rendezvous.py --sizes 4,8 --json
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import threading
import time
from typing import Any

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

HEARTBEAT_THREAD = "RendezvousKeepAliveTimer"
KEEP_ALIVE_S = 1  # torch's default is 5 s; shorter here only to make the dead agent's expiry quick
TARGET = 1000


def _size(value: Any) -> int:
    return len(value) if isinstance(value, bytes | str) else 0


class CountingStore(dist.Store):
    """Every request of one agent, counted (rendezvous or heartbeat, by the thread it came from) with its bytes."""

    def __init__(self, inner: dist.Store) -> None:
        super().__init__()
        self.inner = inner
        self.requests: collections.Counter[str] = collections.Counter()
        self.bytes: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()
        self.counting = False

    def _count(self, method: str, args: tuple[Any, ...], sent: int) -> Any:
        result = getattr(self.inner, method)(*args)
        if self.counting:
            kind = "heartbeat" if threading.current_thread().name.startswith(HEARTBEAT_THREAD) else "rendezvous"
            with self.lock:
                self.requests[kind] += 1
                self.bytes[kind] += sent + _size(result)
        return result

    def set(self, key, value):
        return self._count("set", (key, value), _size(key) + _size(value))

    def get(self, key):
        return self._count("get", (key,), _size(key))

    def add(self, key, value):
        return self._count("add", (key, value), _size(key))

    def compare_set(self, key, expected, desired):
        return self._count("compare_set", (key, expected, desired), _size(key) + _size(expected) + _size(desired))

    def check(self, keys):
        return self._count("check", (keys,), sum(map(_size, keys)))

    def wait(self, keys, timeout=None):
        args = (keys,) if timeout is None else (keys, timeout)
        return self._count("wait", args, sum(map(_size, keys)))

    def delete_key(self, key):
        return self._count("delete_key", (key,), _size(key))

    def num_keys(self):
        return self._count("num_keys", (), 0)


def one_change(n: int) -> dict[str, Any]:
    """A round of `n` agents, one lost, the new round of n-1: what the survivors sent meanwhile."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    run_id = f"elastic-{n}-{time.monotonic_ns()}"
    stores, handlers = [], []
    for i in range(n):
        store = CountingStore(dist.TCPStore("127.0.0.1", server.port, is_master=False))
        params = RendezvousParameters(
            backend="c10d",
            endpoint=f"127.0.0.1:{server.port}",
            run_id=run_id,
            min_nodes=1,
            max_nodes=n,
            local_addr="127.0.0.1",  # one host: the agents differ by their local ids
            join_timeout=300,
            last_call_timeout=1,
            keep_alive_interval=KEEP_ALIVE_S,
            keep_alive_max_attempt=2,
        )
        stores.append(store)
        handlers.append(create_handler(store, C10dRendezvousBackend(store, run_id), params))

    def rendezvous(agents: list[int], worlds: dict[int, int]) -> None:
        def join(i: int) -> None:
            worlds[i] = handlers[i].next_rendezvous().world_size

        threads = [threading.Thread(target=join, args=(i,)) for i in agents]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    first: dict[int, int] = {}
    rendezvous(list(range(n)), first)
    assert set(first.values()) == {n}, first
    lost = n - 1
    handlers[lost]._stop_heartbeats()  # the node is gone: its agent says nothing more
    survivors = list(range(n - 1))
    for i in survivors:
        stores[i].counting = True
    started = time.monotonic()
    second: dict[int, int] = {}
    rendezvous(survivors, second)
    seconds = time.monotonic() - started
    for i in survivors:
        stores[i].counting = False
    assert set(second.values()) == {n - 1}, second
    for h in handlers[:-1]:
        h._stop_heartbeats()
    per = [s.requests["rendezvous"] for s in stores[:-1]]
    beats = sum(s.requests["heartbeat"] for s in stores[:-1])
    return {
        "agents": n,
        "rendezvous_requests": sum(per),
        "rendezvous_requests_max_agent": max(per),
        "rendezvous_bytes": sum(s.bytes["rendezvous"] for s in stores[:-1]),
        "timer_heartbeats": beats,
        "seconds": round(seconds, 1),
    }


def exponent(small: dict[str, Any], large: dict[str, Any], key: str) -> float:
    return math.log(large[key] / small[key]) / math.log(large["agents"] / small["agents"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4,8,16,32", help="agent counts (default: 4,8,16,32)")
    parser.add_argument("--json", action="store_true", help="the figures as one JSON object")
    args = parser.parse_args()
    rows = [one_change(int(n)) for n in args.sizes.split(",")]
    keys = ("rendezvous_requests", "rendezvous_requests_max_agent", "rendezvous_bytes")
    small, large = rows[0], rows[-1]
    fits = {key: round(exponent(small, large, key), 2) for key in keys}
    at_target = {key: round(large[key] * (TARGET / large["agents"]) ** fits[key]) for key in keys}
    if args.json:
        print(json.dumps({"rows": rows, "fit": fits, f"at_{TARGET}": at_target}))
        return
    print("| agents | store requests, all survivors | most by one agent | bytes, all survivors |")
    print("|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['agents']} | {r['rendezvous_requests']} | {r['rendezvous_requests_max_agent']} | "
            f"{r['rendezvous_bytes']:,} |"
        )
    print(
        f"| fit (exponent, {small['agents']}→{large['agents']}) | {fits[keys[0]]} | {fits[keys[1]]} | {fits[keys[2]]} |"
    )
    print(f"| carried to {TARGET} | {at_target[keys[0]]:,} | {at_target[keys[1]]:,} | {at_target[keys[2]]:,} |")


if __name__ == "__main__":
    main()
