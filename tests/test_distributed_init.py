"""Real torch.distributed (gloo on CPU): two processes meet via env:// and file:// and all-reduce.

Plus the fail-fast paths of init_process_group, each of which would otherwise hang or die obscurely.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import warm_start
from hpctrain.distributed import DistEnv, destroy_process_group, detect, init_process_group
from hpctrain.errors import UserError

WORKER = r"""
import dataclasses, json, sys
import torch
import torch.distributed as dist
from hpctrain.distributed import all_gather_object, all_reduce_mean, barrier, destroy_process_group, setup

env, device = setup(device="cpu", timeout_s=60, init_method=sys.argv[1] if len(sys.argv) > 1 else None)
mean = all_reduce_mean(torch.tensor([float(env.rank + 1)])).item()
ranks = all_gather_object(env.rank)
barrier()
print(json.dumps({"env": dataclasses.asdict(env), "mean": mean, "ranks": ranks, "backend": dist.get_backend()}))
destroy_process_group()
"""

# Variables of launchers that may surround the test run itself; the workers must see only what we set.
LAUNCHER_PREFIXES = ("SLURM_", "PET_", "TORCHELASTIC_", "HPCTRAIN_LAUNCHER")
LAUNCHER_VARS = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
}


def clean_environ(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith(LAUNCHER_PREFIXES)}
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_workers(tmp_path: Path, environs: list[dict[str, str]], *args: str) -> list[dict]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = [
        warm_start.popen(list(args), None, clean_environ(**e), False, clean_environ(), ("path", str(script)))
        for e in environs
    ]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:  # a rank left waiting for one that failed
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def on_a_free_port(meet: Callable[[int], list[dict]]) -> list[dict]:
    """meet(port) with a port that was free a moment ago; again with another if a program took it meanwhile (the
    kernel hands the same ephemeral ports to outgoing connections: on the busy CI machine one did, once)."""
    for attempt in range(3):
        try:
            return meet(free_port())
        except AssertionError as err:
            if "address already in use" not in str(err).lower() or attempt == 2:
                raise
    raise AssertionError("unreachable")


def check_world(results: list[dict], launcher: str, init_method: str) -> None:
    assert [r["env"]["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["backend"] == "gloo"
        assert r["mean"] == pytest.approx(1.5)  # (1 + 2) / 2: both ranks contributed
        assert r["ranks"] == [0, 1]
        assert r["env"]["launcher"] == launcher
        assert r["env"]["world_size"] == 2
        assert r["env"]["init_method"] == init_method


@pytest.mark.floor
@pytest.mark.slow
@pytest.mark.parametrize("style", ["torchrun", "kubeflow"])
def test_two_processes_meet_via_env(tmp_path: Path, style: str) -> None:
    def meet(port: int) -> list[dict]:
        environs = []
        for rank in range(2):
            e = {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            if style == "torchrun":
                e.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
            environs.append(e)
        return run_workers(tmp_path, environs)

    check_world(on_a_free_port(meet), style, "env://")


@pytest.mark.slow
def test_two_processes_meet_via_file(tmp_path: Path) -> None:
    url = (tmp_path / "rendezvous").as_uri()
    environs = [
        {"RANK": str(rank), "WORLD_SIZE": "2"} for rank in range(2)
    ]  # no MASTER_*: the file is the meeting point
    check_world(run_workers(tmp_path, environs, url), "kubeflow", url)


@pytest.mark.slow
def test_two_processes_meet_via_tcp_override(tmp_path: Path) -> None:
    environs = [{"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2"} for r in range(2)]
    urls: list[str] = []

    def meet(port: int) -> list[dict]:
        urls.append(f"tcp://127.0.0.1:{port}")
        return run_workers(tmp_path, environs, urls[-1])

    check_world(on_a_free_port(meet), "torchrun", urls[-1])


def env_for(rank: int, addr: str, port: int) -> DistEnv:
    return DistEnv("explicit", rank, 2, rank, 2, 0, 1, addr, port, "env://")


def test_single_process_needs_no_group() -> None:
    init_process_group(detect({}), torch.device("cpu"))
    assert not torch.distributed.is_initialized()
    destroy_process_group()  # safe without a group


def test_unresolvable_head_host_fails_before_waiting() -> None:
    with pytest.raises(UserError, match=r"cannot resolve the rendezvous host 'no-such-node\.invalid'.*MASTER_ADDR"):
        init_process_group(env_for(0, "no-such-node.invalid", 29500), torch.device("cpu"), timeout_s=30)


def test_port_in_use_names_master_port() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UserError, match="already in use.*set MASTER_PORT"):
            init_process_group(env_for(0, "127.0.0.1", port), torch.device("cpu"), timeout_s=30)
    assert not torch.distributed.is_initialized()


def test_missing_peer_times_out_with_advice() -> None:
    # Rank 1 alone: nobody hosts the rendezvous. It must give up at the timeout, not hang.
    with pytest.raises(UserError, match="gave up after 2 s waiting for all 2 processes"):
        init_process_group(env_for(1, "127.0.0.1", free_port()), torch.device("cpu"), timeout_s=2)


def test_file_rendezvous_in_missing_directory(tmp_path: Path) -> None:
    url = (tmp_path / "not-here" / "rdzv").as_uri()
    env = DistEnv("explicit", 0, 2, 0, 1, 0, 2, None, None, url)
    with pytest.raises(UserError, match="does not exist here.*filesystem every rank sees"):
        init_process_group(env, torch.device("cpu"), timeout_s=5)


def test_existing_group_is_reused_or_refused(tmp_path: Path) -> None:
    from hpctrain.distributed import all_reduce_mean

    assert all_reduce_mean(torch.tensor([3.0])).item() == 3.0  # no group: identity
    url = (tmp_path / "one").as_uri()
    torch.distributed.init_process_group("gloo", init_method=url, rank=0, world_size=1)
    try:
        same = DistEnv("explicit", 0, 1, 0, 1, 0, 1, None, None, None)
        init_process_group(same, torch.device("cpu"))  # a world of one: nothing to do
        other = DistEnv("explicit", 1, 2, 1, 2, 0, 1, "127.0.0.1", 29500, "env://")
        with pytest.raises(UserError, match="already exists.*destroy_process_group"):
            init_process_group(other, torch.device("cpu"), timeout_s=5)
        assert all_reduce_mean(torch.tensor([3.0])).item() == 3.0
    finally:
        destroy_process_group()
    assert not torch.distributed.is_initialized()
