"""srun on the real local Slurm cluster (two slurmd nodes on this host): tasks detect themselves and all-reduce.

Needs root to start the cluster (scripts/local-slurm.sh up); node1 and node2 resolve to 127.0.0.1.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.distributed import slurm_port
from slurm_fixtures import LocalSlurm
from training_helpers import clean_environ

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp_user_script.py"

WORKER = r"""
import dataclasses, json, os
import torch
from hpctrain.distributed import all_reduce_mean, destroy_process_group, setup

env, device = setup(device="cpu", timeout_s=60)
mean = all_reduce_mean(torch.tensor([float(env.rank + 1)])).item()
print(json.dumps({"env": dataclasses.asdict(env), "mean": mean, "job": os.environ["SLURM_JOB_ID"],
                  "node": os.environ["SLURMD_NODENAME"]}), flush=True)
destroy_process_group()
"""

PROBE = r"""
import dataclasses, json, sys
from hpctrain.distributed import detect
from hpctrain.errors import UserError

try:
    print(sys.argv[1], json.dumps(dataclasses.asdict(detect())), flush=True)
except UserError as err:
    print(sys.argv[1], "ERROR", err, flush=True)
"""


def srun(args: list[str], cwd: Path) -> str:
    cmd = ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--time=5", "--job-name=hpctrain-test", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=clean_environ(), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_srun_tasks_detect_slurm_and_all_reduce(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = srun([sys.executable, str(script)], tmp_path)
    results = sorted(
        (json.loads(line) for line in out.splitlines() if line.startswith("{")), key=lambda r: r["env"]["rank"]
    )
    assert [r["env"]["rank"] for r in results] == [0, 1]
    job = int(results[0]["job"])
    for rank, r in enumerate(results):
        env = r["env"]
        assert env["launcher"] == "slurm"
        assert (env["world_size"], env["num_nodes"], env["node_rank"], env["local_rank"]) == (2, 2, rank, 0)
        assert env["master_addr"] == "node1"  # first host of node[1-2], parsed without scontrol
        assert env["master_port"] == slurm_port(job, 0)
        assert r["mean"] == pytest.approx(1.5)  # both tasks joined one world
    assert [r["node"] for r in results] == ["node1", "node2"]


@pytest.mark.fresh_steps(processes=2)  # a user's own script under srun, as a user starts it
def test_example_script_runs_unchanged_under_srun(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    out = srun([sys.executable, str(EXAMPLE), "--run-dir", "run", "--epochs", "2", "--device", "cpu"], tmp_path)
    assert "[rank 0] rank 0/2 (local 0/1, node 0/2) via slurm" in out
    assert "[rank 1] rank 1/2 (local 0/1, node 1/2) via slurm" in out
    assert len(re.findall(r"^epoch \d+ loss", out, re.MULTILINE)) == 2  # printed by rank 0 only
    assert (tmp_path / "run" / "checkpoints" / "checkpoint_epoch_2.pt").is_file()


def test_batch_shell_is_one_process_and_its_srun_tasks_are_the_world(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    py = sys.executable
    job = slurm_cluster.sbatch(
        "--nodes=2",
        "--ntasks=2",
        "--time=5",
        "--output=job.out",
        f"--wrap={py} probe.py batch && srun {py} probe.py task",
        cwd=tmp_path,
    )
    state = slurm_cluster.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"})
    out = (tmp_path / "job.out").read_text()
    assert state == "COMPLETED", out
    seen = {}
    for line in out.splitlines():
        where, _, payload = line.partition(" ")
        if where in ("batch", "task"):
            seen.setdefault(where, []).append(json.loads(payload))
    # The batch script has SLURM_PROCID=0 and SLURM_NTASKS=2 but is not a task: a single process, not rank 0 of 2.
    assert [(e["launcher"], e["world_size"]) for e in seen["batch"]] == [("none", 1)]
    assert sorted((e["launcher"], e["rank"], e["world_size"]) for e in seen["task"]) == [
        ("slurm", 0, 2),
        ("slurm", 1, 2),
    ]


def test_srun_copies_of_standalone_torchrun_are_refused(slurm_cluster: LocalSlurm, tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    out = srun(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", "probe.py", "worker"],
        tmp_path,
    )
    errors = [line for line in out.splitlines() if line.startswith("worker ERROR")]
    assert len(errors) == 2, out  # each copy formed its own world of one; both refuse
    assert all("separate worlds" in line and "SLURM_STEP_NUM_TASKS=2" in line for line in errors)
