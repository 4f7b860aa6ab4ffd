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

from hpctrain.distributed.collectives import device_type_for
from training_helpers import clean_environ

WORKER = r"""
import datetime, json, os, sys
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
# Leave as hpctrain's own workers do (launch/processes.py): torch's teardown of a process group's C++ threads was
# seen to abort (SIGABRT, "terminate called without an active exception") on a loaded machine after the work.
sys.stdout.flush()
os._exit(0)
"""


def two_workers(tmp_path: Path, source: str) -> list[dict]:
    """Run `source` as ranks 0 and 1 of a two-process group (argv: init method, rank); each one's last stdout line
    as JSON, in rank order."""
    script = tmp_path / "worker.py"
    script.write_text(source)
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), init, str(rank)],
            env=clean_environ(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
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
    for result in two_workers(tmp_path, WORKER):
        assert result == {
            "default": "cudaonly",
            "vote_group": "gloo",
            "same_group_again": True,
            "first": "preempted",
            "second": "none",
        }


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
import datetime, json, os, sys, time
import torch.distributed as dist
from hpctrain.training import StopReason
from hpctrain.training.stopping import StepVote

rank = int(sys.argv[2])
dist.init_process_group("gloo", init_method=sys.argv[1], rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
StepVote.PERIOD_S = 0.3  # 15 of rank 1's 20 ms steps: a loaded machine (slower steps) still leaves several
StepVote.MAX_SHARE = 1.0  # the period alone sets the cadence here (the votes' share has a test of its own)
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
# Leave as hpctrain's own workers do (launch/processes.py): torch's teardown of a process group's C++ threads was
# seen to abort (SIGABRT, "terminate called without an active exception") on a loaded machine after the work.
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.slow
def test_step_vote_ranks_vote_at_the_same_steps_and_stop_together_within_the_period(tmp_path: Path) -> None:
    results = two_workers(tmp_path, CADENCE_WORKER)
    assert results[0] == results[1], "the ranks voted at different steps or stopped apart"
    voted, (stop_step, label) = results[0]["voted"], results[0]["stopped"]
    assert label == "preempted"
    steps = [step for step, _ in voted]
    assert 40 in steps, "the epoch's last step always votes"
    assert steps[0] == 1 and len(steps) < stop_step / 2, f"voted at {steps}: not fewer than every step"
    every_before_stop = [every for step, every in voted if step < stop_step][-1]
    assert 2 <= every_before_stop <= 15, voted  # 0.3 s of 20 ms steps; a loaded machine gives fewer
    assert 50 <= stop_step < 50 + every_before_stop, f"the signal at step 50 stopped the ranks at {stop_step}"


def test_step_vote_keeps_its_own_cost_under_its_share_however_long_a_vote_takes(tmp_path: Path, monkeypatch) -> None:
    """A vote that takes long (gloo's ring over thousands of ranks) spaces the next ones out: with 1 ms steps, a
    0.6 ms vote comes every 50 ms of steps (PERIOD_S), a 100 ms one every 5 s (MAX_SHARE of the time). The clock
    is the test's: one process, a real gloo group of one, its all-reduce made as slow as the test says."""
    import time

    import hpctrain.distributed as distributed
    from hpctrain.training.stopping import StepVote, StopReason

    clock = [0.0]
    vote_s = [0.0]
    real_all_reduce = distributed.all_reduce

    def slow_all_reduce(tensor, op="sum", group=None):
        clock[0] += vote_s[0]
        return real_all_reduce(tensor, op=op, group=group)

    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(distributed, "all_reduce", slow_all_reduce)
    dist.init_process_group("gloo", init_method=(tmp_path / "store").as_uri(), rank=0, world_size=1)
    try:
        spacing = {}
        for seconds in (0.0006, 0.1):
            vote_s[0], vote, every = seconds, StepVote(), []
            for _ in range(20_000):
                clock[0] += 0.001
                vote.after_step(StopReason.NONE)
                if vote._since == 0:
                    every.append(vote.every)
            spacing[seconds] = every[-1]
            assert vote.after_step(StopReason.PREEMPTED, settle=True) is StopReason.PREEMPTED
    finally:
        dist.destroy_process_group()
    assert 48 <= spacing[0.0006] <= 50, spacing  # PERIOD_S of 1 ms steps (the clock's sums round down by one)
    assert 4900 <= spacing[0.1] <= 5000, spacing  # 0.1 s / MAX_SHARE = 5 s of steps: the votes take 2% of the time
