"""Jobs find the tools that submitted them, and a recipe's %j run dir is one directory, on the real local Slurm
cluster: hpctrain is called through its interpreter's path with a PATH that lacks that interpreter's environment
(as a user does who runs `venv/bin/hpctrain submit ...` without activating the venv)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from training_helpers import run_hpctrain

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# The PATH of a shell where the environment holding hpctrain and torch is not active (sbatch and Slurm's tools
# live in /usr/bin). sys.executable is then the only way to the tools, as for a venv called by its path.
BARE_PATH = "/usr/bin:/bin"
TINY = [
    "--recipe",
    "classic",
    "--dataset",
    "fashion-mnist",
    "--train-limit",
    "256",
    "--test-limit",
    "128",
    "--epochs",
    "1",
]


def hpctrain_bare(*args: str, cwd: Path, timeout: float = 600, path: str = BARE_PATH) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path}
    return run_hpctrain(*args, cwd=cwd, env=env, timeout=timeout)


def job_log(tmp_path: Path, job_id: str) -> str:
    path = tmp_path / f"job-{job_id}.out"
    return path.read_text() if path.exists() else "(no log)"


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_environment_is_not_on_path_for_this_test() -> None:
    """The premise of the tests below: the bare PATH has neither torchrun nor a Python with torch."""
    env = {"PATH": BARE_PATH}
    assert subprocess.run(["sh", "-c", "command -v torchrun"], env=env, capture_output=True).returncode != 0
    assert subprocess.run(["sh", "-c", "command -v hpctrain"], env=env, capture_output=True).returncode != 0


def test_a_torchrun_job_finds_the_tools_that_submitted_it(
    slurm_cluster, tmp_path: Path, fashion_data_dir: Path
) -> None:
    proc = hpctrain_bare(
        "submit",
        "--wait",
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--output",
        "job-%j.out",
        "--time",
        "10",
        "train",
        "mnist",
        *TINY,
        "--data-dir",
        str(fashion_data_dir),
        cwd=tmp_path,
    )
    job_id = proc.stdout.strip()
    assert proc.returncode == 0, proc.stderr + job_log(tmp_path, job_id)
    log = job_log(tmp_path, job_id)
    assert "No such file or directory" not in log, log
    metrics = read_metrics(tmp_path / "runs" / f"mnist-fashion-mnist-classic-{job_id}")
    assert metrics and metrics[-1]["world_size"] == 4, metrics


def test_check_names_a_program_the_nodes_will_not_find(slurm_cluster, tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "mytool").write_text("#!/bin/sh\necho mytool ran\n")
    (tools / "mytool").chmod(0o755)
    missing = hpctrain_bare("check", "--launcher", "single", "--", "mytool", cwd=tmp_path)
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert "hpctrain check: `mytool` is not on the PATH the job will have" in missing.stderr
    # with the program on the PATH that sbatch passes on, the job fits
    env = {**os.environ, "PATH": f"{tools}:{BARE_PATH}"}
    found = subprocess.run(
        [sys.executable, "-m", "hpctrain", "check", "--launcher", "single", "--", "mytool"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.startswith("ok:")


def test_percent_j_in_a_recipe_run_dir_is_one_directory(slurm_cluster, tmp_path: Path, fashion_data_dir: Path) -> None:
    # The environment active this time (its bin/ on PATH), so that only the run directory is under test.
    active = f"{os.path.dirname(os.path.abspath(sys.executable))}:{BARE_PATH}"
    proc = hpctrain_bare(
        "submit",
        "--wait",
        "--launcher",
        "srun",
        "--nodes",
        "1",
        "--nproc-per-node",
        "1",
        "--output",
        "job-%j.out",
        "--time",
        "10",
        "train",
        "mnist",
        *TINY,
        "--data-dir",
        str(fashion_data_dir),
        "--run-dir",
        "runs/r-%j",
        cwd=tmp_path,
        path=active,
    )
    job_id = proc.stdout.strip()
    assert proc.returncode == 0, proc.stderr + job_log(tmp_path, job_id)
    run_dir = tmp_path / "runs" / f"r-{job_id}"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [run_dir.name]  # no literal runs/r-%j
    # training, the requeue logic (stop_reason) and submit's record all use the one directory
    assert read_metrics(run_dir)
    assert (run_dir / "stop_reason").read_text().strip() == "completed"
    assert (run_dir / "job.sbatch").is_file() and (run_dir / "job.yaml").is_file()
    assert "runs/r-%j" in (run_dir / "job.yaml").read_text()  # the description keeps the pattern for a resubmit


@pytest.mark.parametrize(("flags", "tool"), [(["--conda-env", "myenv"], "conda"), (["--module", "foo/1"], "module")])
def test_an_environment_whose_tool_this_host_lacks_is_refused_when_the_nodes_are_this_host(
    tmp_path: Path, flags: list[str], tool: str
) -> None:
    """Issue 39 §17: `check`/`submit` accepted an environment whose tool (conda, module) the submit host lacks;
    on the local cluster the nodes are this host (their names resolve to it), so the job would stop at once. Here
    neither tool exists (a PATH of /usr/bin:/bin; bash exports no `module` function): refused before queueing."""
    env = {**os.environ, "PATH": BARE_PATH}
    env = {k: v for k, v in env.items() if not k.startswith("BASH_FUNC_module")}
    check = run_hpctrain("check", *flags, "--", "true", cwd=tmp_path, env=env)
    assert check.returncode == 2 and "Traceback" not in check.stderr, check.stderr
    assert f"the job's batch shell needs `{tool}`, and its nodes (node1, node2) are this host" in check.stderr
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    submit = run_hpctrain("submit", *flags, "--", "true", cwd=tmp_path, env=env)
    assert submit.returncode == 2 and "nothing was submitted" in submit.stderr, submit.stderr
    after = subprocess.run(["squeue", "-h", "-o", "%i %Z"], capture_output=True, text=True).stdout.splitlines()
    assert not [line for line in after if line.split()[0] not in before and line.endswith(str(tmp_path))]
