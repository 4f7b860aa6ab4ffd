"""An srun task that owns several GPUs starts one worker per GPU (`srun --ntasks-per-node=1 --gpus-per-task=2`).

The environment logic only: there is no GPU here, so the visible-GPU count is passed in as the number torch would
report, and the Slurm variables are those srun sets (see srun_task in test_distributed_detect.py).
"""

from __future__ import annotations

import pytest

from hpctrain.distributed import detect, slurm_node_plan
from hpctrain.errors import UserError
from test_distributed_detect import srun_task

PLAN_TABLE = [
    # (case, environment, visible GPUs, expected (num_nodes, node_rank, nproc_per_node) or None)
    (
        "2 nodes x 1 task, --gpus-per-task=2, node 0",
        srun_task(0, ntasks=2, per_node="1(x2)", SLURM_GPUS_PER_TASK="2"),
        2,
        (2, 0, 2),
    ),
    (
        "2 nodes x 1 task, --gpus-per-task=2, node 1",
        srun_task(1, ntasks=2, per_node="1(x2)", SLURM_GPUS_PER_TASK="2"),
        2,
        (2, 1, 2),
    ),
    ("typed request a100:4", srun_task(1, ntasks=2, per_node="1(x2)", SLURM_GPUS_PER_TASK="a100:4"), 4, (2, 1, 4)),
    (
        "--gpus-per-node=4, one task per node (no per-task count)",
        srun_task(0, ntasks=2, per_node="1(x2)"),
        4,
        (2, 0, 4),
    ),
    ("one GPU per task: nothing to start", srun_task(0, ntasks=2, per_node="1(x2)", SLURM_GPUS_PER_TASK="1"), 1, None),
    ("no GPU (CPU job)", srun_task(0, ntasks=2, per_node="1(x2)"), 0, None),
    ("2 tasks per node, one GPU each", srun_task(0), 2, None),
    ("one task on one node: the local per-GPU plan covers it", srun_task(0, ntasks=1, per_node="1", nodes=1), 2, None),
    (
        "already a worker of our spawner",
        srun_task(
            0,
            ntasks=2,
            per_node="1(x2)",
            HPCTRAIN_LAUNCHER="spawn",
            RANK="0",
            WORLD_SIZE="4",
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="2",
        ),
        2,
        None,
    ),
    ("torchrun under srun", srun_task(0, ntasks=2, per_node="1(x2)", TORCHELASTIC_RUN_ID="x"), 2, None),
    (
        "batch script, not a task",
        {k: v for k, v in srun_task(0, ntasks=2, per_node="1(x2)").items() if not k.startswith("SLURM_STEP")},
        2,
        None,
    ),
]


@pytest.mark.parametrize("case,environ,gpus,expected", PLAN_TABLE, ids=[row[0] for row in PLAN_TABLE])
def test_slurm_task_owning_several_gpus_starts_one_worker_per_gpu(case, environ, gpus, expected):
    plan = slurm_node_plan(environ, gpus)
    assert (None if plan is None else (plan.num_nodes, plan.node_rank, plan.nproc_per_node)) == expected


def test_the_workers_form_one_world_at_the_head_node():
    plans = [
        slurm_node_plan(srun_task(node, ntasks=2, per_node="1(x2)", SLURM_GPUS_PER_TASK="2"), 2) for node in (0, 1)
    ]
    workers = [detect(plan.worker_environ(local)) for plan in plans for local in range(2)]
    assert [w.rank for w in workers] == [0, 1, 2, 3]
    assert {(w.world_size, w.local_world_size, w.num_nodes) for w in workers} == {(4, 2, 2)}
    assert {(w.master_addr, w.master_port) for w in workers} == {("gpu-a01", plans[0].master_port)}
    assert [w.node_rank for w in workers] == [0, 0, 1, 1]


@pytest.mark.parametrize(
    "environ,message",
    [
        (srun_task(0, SLURM_GPUS_PER_TASK="2"), "--ntasks-per-node=4 --gpus-per-task=1"),
        (srun_task(0, ntasks=3, per_node="1,2", SLURM_GPUS_PER_TASK="2"), "uneven layout"),
    ],
)
def test_layouts_that_would_leave_gpus_idle_are_refused(environ, message):
    with pytest.raises(UserError, match=message):
        slurm_node_plan(environ, 2)
