"""The stop vote (`hpctrain.training.agree`) on a default group that cannot all-reduce CPU tensors, as NCCL on GPUs.

NCCL cannot run here (no GPU). What runs for real: two processes whose default group is a real torch.distributed
group over gloo's transport, registered under a backend name that declares only the "cuda" device
(`Backend.register_backend(..., devices=["cuda"])`), so torch refuses a CPU tensor on it with the very error NCCL
gives ("No backend type associated with device type cpu"). The vote must not send a CPU tensor there: the library
makes its own gloo side group and votes on it. What does not run: a vote over a real NCCL group; for that case
(a caller passing an NCCL group explicitly) only the device choice is checked, as the pure function
`device_type_for`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from hpctrain import compat
from hpctrain.distributed.collectives import device_type_for
from training_helpers import clean_environ

WORKER = r"""
import datetime, json, sys
import torch.distributed as dist
from hpctrain.training import StopReason, agree, vote_group

def cuda_only(store, rank, size, timeout):  # gloo's transport, but torch knows it only for CUDA tensors, as NCCL
    return dist.ProcessGroupGloo(store, rank, size, timeout)

dist.Backend.register_backend("cudaonly", cuda_only, devices=["cuda"])
rank = int(sys.argv[2])
dist.init_process_group("cudaonly", init_method=sys.argv[1], rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
first = agree(StopReason.PREEMPTED if rank == 1 else StopReason.NONE)
second = agree(StopReason.NONE)
group = vote_group()
print(json.dumps({"default": dist.get_backend(), "vote_group": dist.get_backend(group),
                  "same_group_again": group is vote_group(), "first": first.label, "second": second.label}))
dist.destroy_process_group()
"""


def workers(tmp_path: Path, source: str, size: int = 2) -> list[dict]:
    """Run `source` as the ranks of a `size`-process group (argv: init method, rank, size); each one's last stdout
    line as JSON, in rank order."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "worker.py"
    script.write_text(source)
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [subprocess.Popen([sys.executable, str(script), init, str(rank), str(size)], env=clean_environ(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(size)]
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


@pytest.mark.slow
def test_the_vote_works_when_the_default_group_takes_only_gpu_tensors(tmp_path: Path) -> None:
    # Before the fix a worker failed: "No backend type associated with device type cpu".
    for result in workers(tmp_path, WORKER):
        assert result == {"default": "cudaonly", "vote_group": "gloo", "same_group_again": True,
                          "first": "preempted", "second": "none"}


@pytest.mark.parametrize(
    ("backend", "device_type"),
    [
        ("gloo", "cpu"),
        ("nccl", "cuda"),  # an NCCL group passed to agree() explicitly: the vote's tensor goes to the GPU
        ("NCCL", "cuda"),
        ("cpu:gloo,cuda:nccl", "cpu"),  # torch's default for init_process_group() without a backend
        ("cuda:nccl", "cuda"),
        ("xccl", "xpu"),
        ("mpi", "cpu"),
        ("someone-elses-backend", "cpu"),
    ],
)
def test_vote_device_follows_the_groups_backend(backend: str, device_type: str) -> None:
    capability = {"gloo": ["cpu", "cuda"], "nccl": ["cuda"], "xccl": ["xpu"], "mpi": ["cpu", "cuda"]}
    assert device_type_for(backend, capability) == device_type


def test_the_installed_torch_table_says_nccl_takes_only_gpu_tensors() -> None:
    """The table agree() reads from torch itself: NCCL must map to the GPU there, gloo to the CPU."""
    assert device_type_for("nccl", dist.Backend.backend_capability) == "cuda"
    assert device_type_for("gloo", dist.Backend.backend_capability) == "cpu"


CADENCE_WORKER = r"""
import datetime, json, sys, time
import torch.distributed as dist
from hpctrain.training import StopReason
from hpctrain.training.stopping import StepVote

rank = int(sys.argv[2])
dist.init_process_group("gloo", init_method=sys.argv[1], rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
StepVote.PERIOD_S = 0.3  # 15 of rank 1's 20 ms steps: a loaded machine (slower steps) still leaves several
vote, voted, stopped = StepVote(), [], None
for step in range(1, 400):
    time.sleep(0.004 if rank == 0 else 0.02)  # rank 1 is five times slower: the slowest pace sets the cadence
    local = StopReason.PREEMPTED if rank == 1 and step >= 50 else StopReason.NONE
    reason = vote.after_step(local, settle=step % 40 == 0)  # step 40: an epoch's last step
    if vote._since == 0:
        voted.append([step, vote.every])
    if reason is not StopReason.NONE:
        stopped = [step, reason.label]
        break
print(json.dumps({"voted": voted, "stopped": stopped}))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_step_vote_ranks_vote_at_the_same_steps_and_stop_together_within_the_period(tmp_path: Path) -> None:
    results = workers(tmp_path, CADENCE_WORKER)
    assert results[0] == results[1], "the ranks voted at different steps or stopped apart"
    voted, (stop_step, label) = results[0]["voted"], results[0]["stopped"]
    assert label == "preempted"
    steps = [step for step, _ in voted]
    assert 40 in steps, "the epoch's last step always votes"
    assert steps[0] == 1 and len(steps) < stop_step / 2, f"voted at {steps}: not fewer than every step"
    every_before_stop = [every for step, every in voted if step < stop_step][-1]
    assert 2 <= every_before_stop <= 15, voted  # 0.3 s of 20 ms steps; a loaded machine gives fewer
    assert 50 <= stop_step < 50 + every_before_stop, f"the signal at step 50 stopped the ranks at {stop_step}"


COUNTING_WORKER = r"""
import collections, datetime, json, os, sys
import torch.distributed as dist
from hpctrain.training import StopReason, agree

class CountingStore(dist.Store):  # every request the ranks make to the rendezvous store, counted on the way
    def __init__(self, inner):
        super().__init__()
        self.inner, self.requests = inner, 0
    def _count(self, method, *args):
        self.requests += 1
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

def cuda_only(store, rank, size, timeout):  # as in WORKER: the vote must make its own gloo group
    return dist.ProcessGroupGloo(store, rank, size, timeout)

dist.Backend.register_backend("cudaonly", cuda_only, devices=["cuda"])
rank, size = int(sys.argv[2]), int(sys.argv[3])
store = CountingStore(dist.FileStore(sys.argv[1].removeprefix("file://"), size))
dist.init_process_group("cudaonly", store=store, rank=rank, world_size=size, timeout=datetime.timedelta(seconds=60))
before = sockets(), store.requests
reasons = [agree(StopReason.CANCELLED if rank == size - 1 and vote == 1 else StopReason.NONE).label
           for vote in range(3)]
print(json.dumps({"sockets": sockets() - before[0], "store_requests": store.requests - before[1],
                  "reasons": reasons}))
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.skipif(not compat.gloo_connects_lazily(), reason="torch < 2.8 makes every gloo group a full mesh")
def test_the_vote_groups_sockets_and_store_requests_per_rank_do_not_grow_with_the_world(tmp_path: Path) -> None:
    """Counted, not timed: what the vote's side group (made at the first vote) and three votes cost each rank, at 2
    and 4 ranks. A ring all-reduce needs 2 peers a rank: at most one listening socket plus 2 connections, and one
    store request to publish the rank's address plus 2 (wait, get) per peer to read one. A full mesh, as before,
    opens N - 1 connections and makes 2 N + 1 requests a rank (4 sockets and 9 requests at 4 ranks): N² in all."""
    for size in (2, 4):
        results = workers(tmp_path / str(size), COUNTING_WORKER, size)
        assert [r["reasons"] for r in results] == [["none", "cancelled", "none"]] * size
        for rank, result in enumerate(results):
            assert result["sockets"] <= 1 + min(2, size - 1), (size, rank, result)
            assert result["store_requests"] <= 1 + 2 * min(2, size - 1), (size, rank, result)
