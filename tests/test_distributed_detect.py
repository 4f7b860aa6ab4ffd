"""detect(), kubeflow_node_plan() and pick_device() over plain environment dicts (no os.environ patching)."""

from __future__ import annotations

import logging

import pytest
import torch

from hpctrain.distributed import (
    DistEnv,
    NodePlan,
    detect,
    kubeflow_node_plan,
    pick_device,
    resolve_device,
    slurm_port,
)
from hpctrain.errors import UserError

# What `env` shows in a Slurm batch script of `sbatch -N2 -n4` (recorded on the local cluster): no SLURM_STEP_ID.
BATCH_SHELL = {
    "SLURM_JOB_ID": "42",
    "SLURM_PROCID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_NNODES": "2",
    "SLURM_JOB_NODELIST": "gpu-a[01-02]",
    "SLURM_TASKS_PER_NODE": "2(x2)",
}


def srun_task(rank: int, *, ntasks: int = 4, per_node: str = "2(x2)", nodes: int = 2, **extra: str) -> dict[str, str]:
    """What srun -N{nodes} -n{ntasks} gives task `rank` (block distribution), as seen on the local cluster."""
    counts = []
    for part in per_node.split(","):
        count, _, repeat = part.partition("(x")
        counts += [int(count)] * int(repeat.rstrip(")") or 1)
    node, first = 0, 0
    while rank >= first + counts[node]:
        first += counts[node]
        node += 1
    env = dict(BATCH_SHELL)
    env.update(
        SLURM_NTASKS=str(ntasks),
        SLURM_NNODES=str(nodes),
        SLURM_TASKS_PER_NODE=per_node,
        SLURM_STEP_ID="0",
        SLURM_STEPID="0",
        SLURM_PROCID=str(rank),
        SLURM_LOCALID=str(rank - first),
        SLURM_NODEID=str(node),
        SLURM_STEP_NUM_TASKS=str(ntasks),
        SLURM_STEP_NUM_NODES=str(nodes),
        SLURM_STEP_TASKS_PER_NODE=per_node,
        SLURM_STEP_NODELIST="gpu-a[01-02]" if nodes == 2 else f"gpu-a[01-{nodes:02d}]",
    )
    env.update(extra)
    return env


def torchrun_worker(rank: int, *, nproc: int = 2, nnodes: int = 1, node: int = 0, **extra: str) -> dict[str, str]:
    env = {
        "TORCHELASTIC_RUN_ID": "abc",
        "RANK": str(rank),
        "WORLD_SIZE": str(nproc * nnodes),
        "LOCAL_RANK": str(rank % nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": str(node),
        "GROUP_WORLD_SIZE": str(nnodes),
        "MASTER_ADDR": "10.1.2.3",
        "MASTER_PORT": "29500",
    }
    env.update(extra)
    return env


KUBEFLOW_POD = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "RANK": "2", "WORLD_SIZE": "3"}

# (name, environ, init_method, expected DistEnv fields)
CASES = [
    ("nothing", {}, None, dict(launcher="none", rank=0, world_size=1, init_method=None, master_addr=None)),
    ("batch shell is not rank 0 of 4", BATCH_SHELL, None, dict(launcher="none", world_size=1)),
    (
        "srun task",
        srun_task(3),
        None,
        dict(
            launcher="slurm",
            rank=3,
            world_size=4,
            local_rank=1,
            local_world_size=2,
            node_rank=1,
            num_nodes=2,
            master_addr="gpu-a01",
            master_port=slurm_port(42, 0),
            init_method="env://",
        ),
    ),
    (
        "srun with MASTER_ADDR/PORT from the batch script",
        srun_task(0, MASTER_ADDR="ib-gpu-a01", MASTER_PORT="31000"),
        None,
        dict(launcher="slurm", rank=0, master_addr="ib-gpu-a01", master_port=31000),
    ),
    (
        "srun uneven tasks per node",
        srun_task(6, ntasks=7, per_node="2(x3),1", nodes=4),
        None,
        dict(launcher="slurm", rank=6, world_size=7, node_rank=3, num_nodes=4, local_rank=0, local_world_size=1),
    ),
    (
        "srun single task is not distributed",
        srun_task(0, ntasks=1, per_node="1", nodes=1),
        None,
        dict(launcher="slurm", world_size=1, init_method=None),
    ),
    (
        "single task of a 4-task job needs no rendezvous",
        srun_task(
            0,
            ntasks=1,
            per_node="1",
            nodes=1,
            SLURM_NTASKS="4",
            SLURM_STEP_ID="interactive",
            SLURM_STEP_NODELIST="gpu-a[01-",
        ),  # nothing about the rendezvous is needed or parsed
        None,
        dict(launcher="slurm", world_size=1, init_method=None, master_port=None),
    ),
    (
        "srun without step counts falls back to the job's",
        {k: v for k, v in srun_task(1).items() if not k.startswith("SLURM_STEP_") or k == "SLURM_STEP_ID"},
        None,
        dict(launcher="slurm", rank=1, world_size=4, local_world_size=2, master_addr="gpu-a01"),
    ),
    (
        "torchrun standalone",
        torchrun_worker(1),
        None,
        dict(
            launcher="torchrun",
            rank=1,
            world_size=2,
            local_rank=1,
            local_world_size=2,
            node_rank=0,
            num_nodes=1,
            master_addr="10.1.2.3",
            master_port=29500,
            init_method="env://",
        ),
    ),
    (
        "torchrun inside Slurm counts as torchrun",
        {**srun_task(1, ntasks=2, per_node="1(x2)"), **torchrun_worker(5, nproc=4, nnodes=2, node=1)},
        None,
        dict(launcher="torchrun", rank=5, world_size=8, local_rank=1, local_world_size=4, node_rank=1, num_nodes=2),
    ),
    (
        "exported torchrun variables without an agent",
        {k: v for k, v in torchrun_worker(1).items() if not k.startswith(("TORCHELASTIC", "GROUP"))},
        None,
        dict(launcher="torchrun", rank=1, node_rank=0, num_nodes=1),
    ),
    (
        "hpctrain's local spawner",
        {**torchrun_worker(1), "HPCTRAIN_LAUNCHER": "spawn"},
        None,
        dict(launcher="spawn", rank=1, world_size=2, local_rank=1),
    ),
    (
        "kubeflow pod",
        KUBEFLOW_POD,
        None,
        dict(
            launcher="kubeflow",
            rank=2,
            world_size=3,
            local_rank=0,
            local_world_size=1,
            node_rank=2,
            num_nodes=3,
            master_addr="job-master-0",
            master_port=23456,
            init_method="env://",
        ),
    ),
    (
        "kubeflow nprocPerNode auto keeps one process per pod",
        {**KUBEFLOW_POD, "PET_NPROC_PER_NODE": "auto"},
        None,
        dict(launcher="kubeflow", rank=2, world_size=3),
    ),
    ("explicit env", KUBEFLOW_POD, "env", dict(launcher="explicit", rank=2, world_size=3, init_method="env://")),
    (
        "explicit env with local ranks",
        torchrun_worker(1),
        "env://",
        dict(launcher="explicit", rank=1, local_world_size=2),
    ),
    (
        "forced slurm ignores torchrun variables",
        {**srun_task(2), **torchrun_worker(0)},
        "slurm",
        dict(launcher="slurm", rank=2, world_size=4),
    ),
    (
        "tcp override keeps Slurm's ranks",
        srun_task(3),
        "tcp://head.example:4000",
        dict(
            launcher="slurm",
            rank=3,
            world_size=4,
            master_addr="head.example",
            master_port=4000,
            init_method="tcp://head.example:4000",
        ),
    ),
    (
        "file override keeps torchrun's ranks",
        {k: v for k, v in torchrun_worker(1).items() if not k.startswith("MASTER")},
        "file:///shared/rdzv",
        dict(launcher="torchrun", rank=1, world_size=2, master_addr=None, init_method="file:///shared/rdzv"),
    ),
    (
        "override on a world of one needs no rendezvous",
        srun_task(0, ntasks=1, per_node="1", nodes=1),
        "tcp://head:4000",
        dict(world_size=1, init_method=None),
    ),
    ("auto is the default", torchrun_worker(0), "auto", dict(launcher="torchrun", rank=0)),
    (
        "torchrun variables set per srun task",
        {
            **srun_task(3),
            "RANK": "3",
            "LOCAL_RANK": "1",
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "gpu-a01",
            "MASTER_PORT": "29500",
        },
        None,
        dict(launcher="torchrun", rank=3, node_rank=1, num_nodes=2),
    ),
]


@pytest.mark.parametrize(("environ", "init_method", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_detect(environ: dict[str, str], init_method: str | None, expected: dict) -> None:
    env = detect(environ, init_method)
    assert {key: getattr(env, key) for key in expected} == expected
    assert env.is_distributed == (env.world_size > 1)
    assert env.is_main == (env.rank == 0)


def test_batch_shell_warns_to_use_srun(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        detect(BATCH_SHELL)
    assert "srun" in caplog.text and "4 tasks" in caplog.text


def test_every_srun_task_agrees_on_the_world() -> None:
    envs = [detect(srun_task(rank, ntasks=7, per_node="2(x3),1", nodes=4)) for rank in range(7)]
    assert [e.rank for e in envs] == list(range(7))
    assert {(e.world_size, e.master_addr, e.master_port, e.num_nodes) for e in envs} == {
        (7, "gpu-a01", slurm_port(42, 0), 4)
    }
    assert [(e.node_rank, e.local_rank, e.local_world_size) for e in envs] == [
        (0, 0, 2),
        (0, 1, 2),
        (1, 0, 2),
        (1, 1, 2),
        (2, 0, 2),
        (2, 1, 2),
        (3, 0, 1),
    ]


def test_slurm_ports_spread_jobs_and_steps() -> None:
    ports = {slurm_port(job, step) for job in range(1000, 1100) for step in range(3)}
    assert len(ports) == 300
    assert all(20000 <= p < 32768 for p in ports)  # below Linux's ephemeral range


# (name, environ, init_method, text the message must contain)
ERRORS = [
    ("rank beyond world", torchrun_worker(0, RANK="2"), None, "rank 2 is outside 0..1"),
    ("local rank beyond local world", torchrun_worker(0, LOCAL_RANK="2"), None, "local rank 2 is outside 0..1"),
    ("non-numeric rank", torchrun_worker(0, RANK="one"), None, "RANK='one' is not a whole number"),
    ("negative rank", KUBEFLOW_POD | {"RANK": "-1"}, None, "RANK='-1'"),
    ("bad port", torchrun_worker(0, MASTER_PORT="70000"), None, "MASTER_PORT=70000 is not a TCP port"),
    ("missing MASTER_ADDR", {k: v for k, v in KUBEFLOW_POD.items() if k != "MASTER_ADDR"}, None, "MASTER_ADDR"),
    (
        "missing MASTER_PORT under exported variables",
        {k: v for k, v in torchrun_worker(1).items() if k != "MASTER_PORT"},
        None,
        "MASTER_PORT is not set but this is rank 1 of 2",
    ),
    ("world size alone", {"WORLD_SIZE": "4"}, None, "WORLD_SIZE=4 is set but RANK is not"),
    ("rank alone", {"RANK": "3"}, None, "RANK=3 is set but WORLD_SIZE is not"),
    (
        "local rank without local world size",
        {k: v for k, v in torchrun_worker(1).items() if k != "LOCAL_WORLD_SIZE"},
        None,
        "LOCAL_WORLD_SIZE",
    ),
    ("unknown launcher marker", {"HPCTRAIN_LAUNCHER": "mpi"}, None, "HPCTRAIN_LAUNCHER='mpi' is not understood"),
    (
        "srun copies of a standalone torchrun",
        {**srun_task(1, ntasks=2, per_node="1(x2)"), **torchrun_worker(0, nproc=2, nnodes=1)},
        None,
        "separate worlds",
    ),
    (
        "torchrun variables exported in the batch script",
        {
            **srun_task(3),
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "gpu-a01",
            "MASTER_PORT": "29500",
        },
        None,
        "RANK=0 but this srun task is SLURM_PROCID=3",
    ),
    (
        "slurm counts that disagree",
        srun_task(0, SLURM_STEP_TASKS_PER_NODE="2,1"),
        None,
        "the Slurm variables disagree",
    ),
    (
        "malformed node list",
        srun_task(0, SLURM_STEP_NODELIST="gpu-a[01-"),
        None,
        "SLURM_STEP_NODELIST: invalid Slurm hostlist",
    ),
    (
        "no node list",
        {k: v for k, v in srun_task(0).items() if "NODELIST" not in k},
        None,
        "set MASTER_ADDR",
    ),
    ("forced slurm in the batch shell", BATCH_SHELL, "slurm", "batch script itself"),
    ("forced slurm outside slurm", {}, "slurm", "launch it with `srun python"),
    ("explicit env without variables", {}, "env", "--dist-init-method env needs RANK and WORLD_SIZE"),
    ("unknown init method", {}, "mpi://x", "use env, slurm, tcp://HOST:PORT"),
    ("tcp without port", srun_task(0), "tcp://head", "is not tcp://HOST:PORT"),
    ("tcp with bad port", srun_task(0), "tcp://head:99999", "is not tcp://HOST:PORT"),
    ("tcp without a launcher", {}, "tcp://head:4000", "no launcher told this process its rank"),
    ("file with a host part", srun_task(0), "file://shared/rdzv", "three slashes"),
    (
        "kubeflow pod that should start workers",
        KUBEFLOW_POD | {"PET_NPROC_PER_NODE": "4", "PET_NNODES": "3", "WORLD_SIZE": "12"},
        None,
        "PET_NPROC_PER_NODE=4 asks for 4 processes in this pod",
    ),
]


@pytest.mark.parametrize(("environ", "init_method", "message"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_inconsistent_environments_fail_with_the_fix(environ: dict, init_method: str | None, message: str) -> None:
    with pytest.raises(UserError) as info:
        detect(environ, init_method)
    assert message in str(info.value)


def test_distenv_rejects_impossible_values() -> None:
    with pytest.raises(UserError, match="rank 2 is outside 0..1"):
        DistEnv("explicit", 2, 2, 0, 1, 0, 2, "h", 1, "env://")
    with pytest.raises(UserError, match="only 2 in the whole job"):
        DistEnv("explicit", 0, 2, 0, 4, 0, 1, "h", 1, "env://")
    with pytest.raises(ValueError, match="unknown launcher"):
        DistEnv("mpirun", 0, 1, 0, 1, 0, 1, None, None, None)


# --- Kubeflow PyTorchJob: when must this pod start its own workers? ---

NEW_OPERATOR = {  # training-operator >= 1.7 with nprocPerNode: "4" and 2 replicas, pod 1
    "MASTER_ADDR": "job-master-0",
    "MASTER_PORT": "23456",
    "RANK": "1",
    "WORLD_SIZE": "8",
    "PET_NPROC_PER_NODE": "4",
    "PET_NNODES": "2",
    "PET_NODE_RANK": "1",
}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (NEW_OPERATOR, NodePlan(2, 1, 4, "job-master-0", 23456)),
        (NEW_OPERATOR | {"WORLD_SIZE": "2"}, NodePlan(2, 1, 4, "job-master-0", 23456)),  # counts pods
        (
            {k: v for k, v in NEW_OPERATOR.items() if k not in ("PET_NNODES", "PET_NODE_RANK")},
            NodePlan(2, 1, 4, "job-master-0", 23456),
        ),
        (NEW_OPERATOR | {"PET_NPROC_PER_NODE": "1"}, None),
        (NEW_OPERATOR | {"PET_NPROC_PER_NODE": "auto"}, None),
        (NEW_OPERATOR | {"LOCAL_RANK": "0"}, None),  # already a torchrun worker
        (NEW_OPERATOR | {"HPCTRAIN_LAUNCHER": "spawn"}, None),  # already one of our workers
        (KUBEFLOW_POD, None),
        ({}, None),
    ],
)
def test_kubeflow_node_plan(environ: dict[str, str], expected: NodePlan | None) -> None:
    assert kubeflow_node_plan(environ) == expected


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"PET_NNODES": "1:3"}, "elastic range"),
        ({"WORLD_SIZE": "6"}, "matches neither"),
        ({"PET_NODE_RANK": "2"}, "node rank 2 is outside 0..1"),
        ({"MASTER_PORT": ""}, "MASTER_ADDR/MASTER_PORT"),
    ],
)
def test_kubeflow_node_plan_errors(change: dict[str, str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        kubeflow_node_plan(NEW_OPERATOR | change)


def test_node_plan_workers_detect_as_spawned_ranks() -> None:
    plan = kubeflow_node_plan(NEW_OPERATOR)
    envs = [detect({**NEW_OPERATOR, **plan.worker_environ(i)}) for i in range(plan.nproc_per_node)]
    assert [(e.launcher, e.rank, e.local_rank, e.node_rank) for e in envs] == [("spawn", 4 + i, i, 1) for i in range(4)]
    assert {(e.world_size, e.num_nodes, e.master_addr, e.master_port) for e in envs} == {(8, 2, "job-master-0", 23456)}


# --- Device choice. No GPU on the test machine: the GPU count is passed in (the rule is what is tested). ---

SLURM_4_PER_NODE = detect(srun_task(5, ntasks=8, per_node="4(x2)"))


@pytest.mark.parametrize(
    ("requested", "env", "gpus", "environ", "expected"),
    [
        ("cpu", SLURM_4_PER_NODE, 4, {}, "cpu"),
        ("auto", SLURM_4_PER_NODE, 0, {}, "cpu"),
        ("auto", SLURM_4_PER_NODE, 4, {}, "cuda:1"),
        ("cuda", SLURM_4_PER_NODE, 8, {}, "cuda:1"),
        # srun --gpus-per-task=1: each task sees only its own GPU
        ("cuda", SLURM_4_PER_NODE, 1, {"SLURM_STEP_GPUS": "0,1,2,3", "CUDA_VISIBLE_DEVICES": "1"}, "cuda:0"),
        ("cuda:1", detect({}), 2, {}, "cuda:1"),
        (" CUDA ", detect({}), 1, {}, "cuda:0"),
    ],
)
def test_pick_device(requested: str, env: DistEnv, gpus: int, environ: dict, expected: str) -> None:
    assert pick_device(requested, env, gpus, environ) == torch.device(expected)


@pytest.mark.parametrize(
    ("requested", "env", "gpus", "environ", "cuda_build", "message"),
    [
        (
            "cuda",
            SLURM_4_PER_NODE,
            2,
            {"CUDA_VISIBLE_DEVICES": "0,1"},
            "12.4",
            "4 processes on this node (SLURM_NTASKS_PER_NODE / SLURM_STEP_TASKS_PER_NODE) but 2 GPU(s) visible "
            "(CUDA_VISIBLE_DEVICES=0,1)",
        ),
        ("auto", SLURM_4_PER_NODE, 1, {}, "12.4", "--gpus-per-node=4"),
        ("cuda", detect({}), 0, {}, None, "no CUDA support"),
        ("cuda", detect({}), 0, {"CUDA_VISIBLE_DEVICES": ""}, "12.4", "CUDA_VISIBLE_DEVICES=''"),
        ("cuda", detect({}), 0, {"SLURM_JOB_ID": "7"}, "12.4", "#SBATCH --gpus-per-node"),
        ("cuda:2", detect({}), 2, {}, "12.4", "numbered 0..1"),
        ("cuda:0", SLURM_4_PER_NODE, 4, {}, "12.4", "use --device cuda"),
        ("tpu", detect({}), 0, {}, "12.4", "use auto, cpu, cuda or cuda:N"),
    ],
)
def test_pick_device_errors(requested, env, gpus, environ, cuda_build, message) -> None:
    with pytest.raises(UserError) as info:
        pick_device(requested, env, gpus, environ, cuda_build=cuda_build)
    assert message in str(info.value)
    assert "--device" in str(info.value) or "GPU" in str(info.value)


def test_resolve_device_on_this_machine() -> None:
    single = detect({})
    if torch.cuda.is_available():
        assert resolve_device("auto", single) == torch.device("cuda", 0)
    else:
        assert resolve_device("auto", single) == torch.device("cpu")
        with pytest.raises(UserError, match="--device cpu"):
            resolve_device("cuda", single)


@pytest.mark.parametrize("low,refused", [(None, True), ("1", False), ("2", True)])
def test_an_elastic_group_smaller_than_the_step_is_one_world_down_to_its_min(low, refused) -> None:
    """Two srun tasks of torchrun, one group of 1 node: --standalone's separate worlds, unless the batch script of a
    `--nodes MIN:MAX` job said MIN (HPCTRAIN_ELASTIC_MIN_NODES) and the group has at least MIN nodes (a lost node)."""
    env = {**srun_task(0, ntasks=2, per_node="1(x2)"), **torchrun_worker(0, nproc=1, nnodes=1)}
    if low is not None:
        env["HPCTRAIN_ELASTIC_MIN_NODES"] = low
    if refused:
        with pytest.raises(UserError, match="separate worlds"):
            detect(env)
    else:
        assert detect(env).world_size == 1
