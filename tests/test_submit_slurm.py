"""`hpctrain submit` / `check` end to end on the real local Slurm cluster (scripts/local-slurm.sh up): real sbatch,
srun, torchrun, squeue, scontrol. node1 and node2 run on this host with 2 CPUs each, so multi-node jobs are
2 nodes x 2 processes with gloo on CPU."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training_helpers import run_hpctrain, run_torchrun

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

ALLREDUCE = """\
import json, os, sys
import torch
import torch.distributed as dist
from hpctrain.distributed import setup

env, _ = setup(device="cpu")
t = torch.tensor([float(env.rank)])
dist.all_reduce(t)
record = {"rank": env.rank, "world_size": env.world_size, "local_rank": env.local_rank, "launcher": env.launcher,
          "sum": t.item(), "node": os.environ.get("SLURMD_NODENAME"), "argv": sys.argv[1:]}
with open(os.path.join(os.environ["HPCTRAIN_RUN_DIR"], f"rank{env.rank}.json"), "w") as f:
    json.dump(record, f)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def slurm() -> None:
    if shutil.which("sbatch") is None:
        pytest.fail("Slurm is not installed: run scripts/local-slurm.sh up")
    proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True)
    if proc.returncode != 0 or "node1" not in proc.stdout:
        pytest.fail(f"the local Slurm cluster is not up ({proc.stderr.strip()}): run scripts/local-slurm.sh up")


def hpctrain(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_hpctrain(*args, cwd=cwd, timeout=timeout)


def queued_ids(work_dir: Path | None = None) -> set[str]:
    """The ids of the jobs in the queue; only those submitted from `work_dir` when given (tests on other pytest
    workers submit jobs meanwhile)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %Z"], capture_output=True, text=True, check=True).stdout
    jobs = [line.split(" ", 1) for line in out.splitlines() if " " in line]
    return {job for job, cwd in jobs if work_dir is None or Path(cwd) == work_dir}


def wait_gone(job_id: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while job_id in queued_ids():
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id])
            pytest.fail(f"job {job_id} did not end within {timeout} s")
        time.sleep(1)


def job_log(tmp_path: Path, job_id: str) -> str:
    path = tmp_path / f"job-{job_id}.out"
    return path.read_text() if path.exists() else "(no log)"


def read_ranks(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(run_dir.glob("rank*.json"))]


HOSTILE_NAME = "we'ird $(touch pwned) `x`"
HOSTILE_ARGS = ["it's", '"q"', "$(touch pwned)", "a b", "`touch pwned2`"]


@pytest.mark.parametrize(
    "launcher,nodes,nproc", [("torchrun", 2, 2), ("srun", 2, 2), ("torchrun", 2, 1), ("srun", 1, 2)]
)
def test_allreduce_ranks_for_each_shape(slurm, tmp_path: Path, launcher: str, nodes: int, nproc: int) -> None:
    (tmp_path / "allreduce.py").write_text(ALLREDUCE)
    proc = hpctrain(
        "submit",
        "--wait",
        "--launcher",
        launcher,
        "--nodes",
        str(nodes),
        "--nproc-per-node",
        str(nproc),
        "--job-name",
        HOSTILE_NAME,
        "--output",
        "job-%j.out",
        "--time",
        "5",
        "--",
        sys.executable,
        "allreduce.py",
        *HOSTILE_ARGS,
        cwd=tmp_path,
    )
    job_id = proc.stdout.strip()
    assert proc.returncode == 0, proc.stderr + job_log(tmp_path, job_id)
    run_dir = tmp_path / "runs" / f"we_ird_touch_pwned_x-{job_id}"
    ranks = read_ranks(run_dir)
    world = nodes * nproc
    assert [r["rank"] for r in ranks] == list(range(world)), job_log(tmp_path, job_id)
    assert {r["world_size"] for r in ranks} == {world} and {r["sum"] for r in ranks} == {float(sum(range(world)))}
    per_node: dict[str, list[int]] = {}
    for r in ranks:
        per_node.setdefault(r["node"], []).append(r["local_rank"])
    # which nodes Slurm picks depends on what else runs; each must hold local ranks 0..nproc-1
    assert len(per_node) == nodes and all(sorted(v) == list(range(nproc)) for v in per_node.values()), per_node
    assert {r["launcher"] for r in ranks} == {"torchrun" if launcher == "torchrun" else "slurm"}
    assert all(r["argv"] == HOSTILE_ARGS for r in ranks)
    assert not list(tmp_path.rglob("pwned*"))
    # the job kept its literal name, and the run dir records what was submitted
    name = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    assert f"JobName={HOSTILE_NAME}" in name or name == ""  # finished jobs leave scontrol after MinJobAge
    assert (run_dir / "job.sbatch").read_text().startswith("#!/bin/bash\n")
    assert f"nproc_per_node: {nproc}" in (run_dir / "job.yaml").read_text()


def test_cpu_only_single_job_and_exit_status(slurm, tmp_path: Path) -> None:
    proc = hpctrain(
        "submit",
        "--wait",
        "--launcher",
        "single",
        "--output",
        "job-%j.out",
        "--",
        sys.executable,
        "-c",
        "import os, sys; print('cpus', os.sched_getaffinity(0)); sys.exit(3)",
        cwd=tmp_path,
    )
    job_id = proc.stdout.strip()
    assert proc.returncode == 3, proc.stderr + job_log(tmp_path, job_id)
    assert "cpus" in job_log(tmp_path, job_id)
    assert "exit status 3" in proc.stderr


def test_follow_prints_the_jobs_output_while_it_waits(slurm, tmp_path: Path) -> None:
    proc = hpctrain(
        "submit",
        "--follow",
        "--launcher",
        "single",
        "--output",
        "job-%j.out",
        "--",
        sys.executable,
        "-c",
        "print('hello from the job', flush=True)",
        cwd=tmp_path,
    )
    job_id, *log = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stderr + job_log(tmp_path, job_id)
    assert "hello from the job" in log, proc.stdout
    assert f"job {job_id} ended COMPLETED with exit status 0" in proc.stderr


def test_shard_job_holds_its_shards_while_running(slurm, tmp_path: Path) -> None:
    release = tmp_path / "release"
    script = f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.2)\n"
    proc = hpctrain(
        "submit",
        "--gres",
        "shard:16",
        "--launcher",
        "single",
        "--output",
        "job-%j.out",
        "--",
        sys.executable,
        "-c",
        script,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip()
    try:
        deadline = time.monotonic() + 600
        while True:
            state = subprocess.run(
                ["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True
            ).stdout.strip()
            if state == "RUNNING":
                break
            assert state in ("PENDING", "CONFIGURING"), f"job {job_id} is {state!r}: {job_log(tmp_path, job_id)}"
            assert time.monotonic() < deadline, "the shard job did not start"
            time.sleep(0.5)
        detail = subprocess.run(["scontrol", "-d", "show", "job", job_id], capture_output=True, text=True).stdout
        assert "JOB_GRES=shard:16" in detail, detail
        cluster = hpctrain("cluster", "--json", cwd=tmp_path)
        assert cluster.returncode == 0, cluster.stderr
        nodes = json.loads(cluster.stdout)["nodes"]
        assert sum(n["shards_used"] for n in nodes) >= 16, nodes
    finally:
        release.write_text("")
    wait_gone(job_id)
    state = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    assert "JobState=COMPLETED" in state or state == "", state


def test_bad_job_file_leaves_the_queue_unchanged(slurm, tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("nodes: 2\nnproc_per_node: 2\ntime: 90 minutes\ncommand: [python, x.py]\n")
    proc = hpctrain("submit", "--job-file", "job.yaml", cwd=tmp_path)
    assert proc.returncode == 2
    assert "is not a time" in proc.stderr
    assert not (tmp_path / "runs").exists()
    assert queued_ids(tmp_path) == set()  # nothing was submitted from here


@pytest.mark.parametrize(
    "args,word",
    [
        (["--gpus-per-node", "3", "--nproc-per-node", "3"], "gpu"),
        (["--nodes", "3"], "node"),
        (["--partition", "short", "--time", "1:00:00"], "time"),
        (["--partition", "nosuch"], "nosuch"),
    ],
)
def test_check_rejects_what_the_cluster_cannot_run(slurm, tmp_path: Path, args: list[str], word: str) -> None:
    proc = hpctrain("check", *args, "--", "true", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("hpctrain check:")]
    assert lines and any(word in line.lower() for line in lines), proc.stderr
    submitted = hpctrain("submit", *args, "--", "true", cwd=tmp_path)
    assert submitted.returncode == 2 and "nothing was submitted" in submitted.stderr
    assert queued_ids(tmp_path) == set()


def test_check_accepts_a_job_that_fits(slurm, tmp_path: Path) -> None:
    proc = hpctrain(
        "check",
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--gpus-per-node",
        "2",
        "--time",
        "10",
        "--",
        "true",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok:")


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


# torchrun: the README's 2-node job as it stands (its default recipe, the fast one), on CPUs: 2 nodes x 2 processes;
# the floor environment runs it too. srun: the classic recipe.
@pytest.mark.parametrize("launcher", [pytest.param("torchrun", marks=pytest.mark.floor), "srun"])
def test_train_mnist_ddp_on_two_nodes(slurm, tmp_path: Path, fashion_data_dir: Path, launcher: str) -> None:
    recipe = [] if launcher == "torchrun" else ["--recipe", "classic"]
    train = [
        "train",
        "mnist",
        *recipe,
        "--dataset",
        "fashion-mnist",
        "--data-dir",
        str(fashion_data_dir),
        "--train-limit",
        "1024",
        "--test-limit",
        "300",
        "--epochs",
        "1",
        "--threads",
        "1",
    ]
    proc = hpctrain(
        "submit",
        "--wait",
        "--launcher",
        launcher,
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--output",
        "job-%j.out",
        "--time",
        "10",
        *train,
        cwd=tmp_path,
    )
    job_id = proc.stdout.strip()
    assert proc.returncode == 0, proc.stderr + job_log(tmp_path, job_id)
    run_dir = tmp_path / "runs" / f"mnist-fashion-mnist{'-classic' if recipe else ''}-{job_id}"
    metrics = read_metrics(run_dir)
    assert metrics and metrics[-1]["world_size"] == 4, metrics
    assert (run_dir / "job.sbatch").exists() and (run_dir / "job.yaml").exists()
    if launcher == "torchrun":
        # The same recipe as 4 local processes (same seed, same shards, gloo) must learn the same: the 2-node
        # job is the same computation spread differently. Tolerance only for reduction-order rounding.
        local = run_torchrun(
            ["--standalone", "--nproc-per-node=4"],
            ["-m", "hpctrain"],
            [*train, "--run-dir", str(tmp_path / "local")],
            cwd=tmp_path,
            timeout=300,
        )
        assert local.returncode == 0, local.stderr
        local_acc, cluster_acc = read_metrics(tmp_path / "local")[-1]["test_accuracy"], metrics[-1]["test_accuracy"]
        assert abs(local_acc - cluster_acc) <= 0.01, (local_acc, cluster_acc)


def test_a_second_job_into_a_run_directory_an_active_job_holds_is_refused_before_queueing(
    slurm, tmp_path: Path
) -> None:
    """Issue 39 §12: two submits into one run directory were both queued, and the second ended in torch's
    ChildFailedError. The first job here waits (--begin an hour away) and holds runs/fixed."""
    args = ["submit", "--launcher", "single", "--run-dir", "runs/fixed", "--time", "5"]
    first = hpctrain(*args, "--sbatch=--begin=now+3600", "--", "true", cwd=tmp_path)
    job_id = first.stdout.strip()
    assert first.returncode == 0 and job_id.isdigit(), first.stderr
    try:
        second = hpctrain(*args, "--", "true", cwd=tmp_path)
        check = hpctrain("check", *args[1:], "--", "true", cwd=tmp_path)
        queued = queued_ids(tmp_path)
    finally:
        subprocess.run(["scancel", job_id], check=False)
    assert queued == {job_id}, (queued, second.stdout)
    said = f"--run-dir {tmp_path / 'runs' / 'fixed'} is held by job {job_id} (PENDING), which writes there"
    assert second.returncode == 2 and said.replace(str(tmp_path) + "/", "") in second.stderr, second.stderr
    assert "Traceback" not in second.stderr
    assert check.returncode == 2 and f"is held by job {job_id} (PENDING)" in check.stderr, check.stderr
    wait_gone(job_id)
    third = hpctrain(*args, "--", "true", cwd=tmp_path)  # the holder ended: the directory is free again
    assert third.returncode == 0, third.stderr
    wait_gone(third.stdout.strip())
