"""What hpctrain's own collectives cost each rank does not grow with the world (issue 32): counted, not timed.

Real torch.distributed (gloo on CPU) at 2 and 4 processes, run once for the module, whose rendezvous store counts
every request on its way (a `torch.distributed.Store` around the FileStore), and which count their open sockets
(/proc/self/fd). Measured in each rank:

- the stop vote's side group (made at the first vote, as on a GPU job) and three votes: a ring all-reduce needs two
  peers a rank, so at most one listening socket plus two connections and, to find the two peers, one store request
  to publish the rank's address plus two (wait, get) a peer. A full mesh, as gloo makes a group by default, opens
  N - 1 connections and makes 2 N + 1 requests a rank (N² in all);
- the roll call after a failed collective, with the last rank gone: each rank counts itself in and polls the count
  (O(1) requests a poll); only the first to answer then checks each rank's key, once. Before, every rank checked
  every rank's key every 0.2 s: N² requests a poll.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain import compat
from training_helpers import clean_environ

WORKER = r"""
import collections, datetime, json, os, sys
from types import SimpleNamespace
import torch.distributed as dist
from hpctrain.distributed.failures import announce, missing_ranks
from hpctrain.training import StopReason, agree

class CountingStore(dist.Store):  # every request to the rendezvous store, counted by kind on its way
    def __init__(self, inner):
        super().__init__()
        self.inner, self.requests = inner, collections.Counter()
    def _count(self, method, *args):
        self.requests[method] += 1
        return getattr(self.inner, method)(*args)
    def set(self, key, value): return self._count("set", key, value)
    def get(self, key): return self._count("get", key)
    def add(self, key, value): return self._count("add", key, value)
    def check(self, keys): return self._count("check", keys)
    def compare_set(self, key, expected, desired): return self._count("compare_set", key, expected, desired)
    def delete_key(self, key): return self._count("delete_key", key)
    def wait(self, keys, timeout=None): return self._count("wait", keys, *([timeout] if timeout else []))
    def num_keys(self): return self.inner.num_keys()
    def set_timeout(self, timeout): return self.inner.set_timeout(timeout)

def sockets():  # this process's open sockets (an fd may close between the listing and the look)
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count

def cuda_only(store, rank, size, timeout):  # gloo's transport known to torch for CUDA tensors only, as NCCL:
    return dist.ProcessGroupGloo(store, rank, size, timeout)  # the vote must make its own gloo group

dist.Backend.register_backend("cudaonly", cuda_only, devices=["cuda"])
folder, rank, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = CountingStore(dist.FileStore(os.path.join(folder, "store"), size))
dist.init_process_group("cudaonly", store=store, rank=rank, world_size=size, timeout=datetime.timedelta(seconds=60))
env = SimpleNamespace(rank=rank, world_size=size, is_distributed=True)
announce(env)
before = sockets(), sum(store.requests.values())
reasons = [agree(StopReason.CANCELLED if rank == size - 1 and vote == 1 else StopReason.NONE).label
           for vote in range(3)]
result = {"vote_sockets": sockets() - before[0], "vote_requests": sum(store.requests.values()) - before[1],
          "reasons": reasons}
if rank < size - 1:  # the last rank is the one gone: it takes no part in the roll call
    before = collections.Counter(store.requests)
    result["missing"] = {str(r): bool(host) for r, host in missing_ranks(env, 1.0).items()}
    result["roll_call"] = dict(store.requests - before)
print(json.dumps(result), flush=True)
os._exit(0)  # no shutdown handshake: the last rank is "gone"
"""

SIZES = (2, 4)


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict]]:
    """Each size's ranks' counts, in rank order."""
    script = tmp_path_factory.mktemp("ranks") / "worker.py"
    script.write_text(WORKER)
    by_size = {}
    for size in SIZES:
        folder = tmp_path_factory.mktemp(f"world{size}")
        procs = [subprocess.Popen([sys.executable, str(script), str(folder), str(rank), str(size)],
                                  env=clean_environ(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for rank in range(size)]
        results = []
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                raise
            assert proc.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
        by_size[size] = results
    return by_size


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
def test_the_roll_call_costs_each_rank_o1_requests_a_poll_and_one_rank_a_look_at_each(counted) -> None:
    for size, results in counted.items():
        survivors = results[:-1]
        assert all(r["missing"] == {str(size - 1): True} for r in survivors), survivors  # named, with its host
        checks = [r["roll_call"].get("check", 0) for r in survivors]
        # One rank looks at each rank's key once (and at the missing one's host); the others read its verdict.
        assert sum(checks) <= size + 1, (size, checks)
        assert all(r["roll_call"].get("get", 0) <= 2 for r in survivors), survivors
