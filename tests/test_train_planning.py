"""How `hpctrain train` decides to start local workers. GPUs cannot exist here: the GPU count is faked, and the
test only checks the plan (which processes would start), not a run on GPUs."""

from __future__ import annotations

import pytest

from hpctrain.cli import train_start
from hpctrain.config import TrainConfig
from hpctrain.errors import UserError


@pytest.fixture
def clean_env(monkeypatch):
    import os

    for key in list(os.environ):
        if key.startswith(("SLURM_", "TORCHELASTIC_", "PET_")) or key in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
        ):
            monkeypatch.delenv(key)


def plan(monkeypatch, gpus, **config):
    monkeypatch.setattr(train_start, "_visible_gpus", lambda: gpus)
    return train_start._spawn_plan(TrainConfig(**config))


def test_one_process_without_gpus_or_nproc(monkeypatch, clean_env):
    assert plan(monkeypatch, 0) is None


def test_auto_with_several_gpus_starts_one_process_per_gpu(monkeypatch, clean_env):
    node = plan(monkeypatch, 4)
    assert (node.nproc_per_node, node.world_size, node.master_addr) == (4, 4, "127.0.0.1")


def test_dataparallel_and_cpu_keep_one_process(monkeypatch, clean_env):
    assert plan(monkeypatch, 4, strategy="dp") is None
    assert plan(monkeypatch, 4, device="cpu") is None


def test_nproc_on_gpus_is_bounded_by_visible_gpus(monkeypatch, clean_env):
    assert plan(monkeypatch, 4, nproc=2).nproc_per_node == 2
    with pytest.raises(UserError, match="exceeds the 4 visible GPU"):
        plan(monkeypatch, 4, nproc=8)


def test_nproc_inside_a_launched_world_is_refused(monkeypatch, clean_env):
    for key, value in {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "x",
    }.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UserError, match="drop --nproc"):
        plan(monkeypatch, 0, nproc=2)


def test_kubeflow_pod_with_several_processes_fans_out(monkeypatch, clean_env):
    for key, value in {
        "MASTER_ADDR": "job-master-0",
        "MASTER_PORT": "23456",
        "RANK": "1",
        "WORLD_SIZE": "8",
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "4",
    }.items():
        monkeypatch.setenv(key, value)
    node = plan(monkeypatch, 4)
    assert (node.num_nodes, node.node_rank, node.nproc_per_node) == (2, 1, 4)
    assert node.worker_environ(3)["RANK"] == "7"
    with pytest.raises(UserError, match="contradicts PET_NPROC_PER_NODE"):
        plan(monkeypatch, 4, nproc=2)


def test_nproc_with_cuda_but_no_gpus_says_none_is_visible(monkeypatch, clean_env):
    with pytest.raises(UserError, match="no GPU is visible here.*drop --device cuda") as caught:
        plan(monkeypatch, 0, nproc=2, device="cuda")
    assert "--nproc 0" not in str(caught.value)
