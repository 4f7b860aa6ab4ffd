"""Elastic jobs (`--nodes MIN:MAX`, issue 42): the request as flags and job-file keys, the rendered Slurm script,
and the one-line refusal wherever it cannot run (launchers that start a fixed set of processes, a TrainJob, extra
sbatch options that would give the script a second node count). Real CLI runs (`hpctrain submit --dry-run`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from hpctrain.errors import UserError
from hpctrain.jobs.mapping import from_mapping
from hpctrain.jobs.values import parse_nodes
from hpctrain.health.view import elastic_lines
from hpctrain.training.provenance import membership_change
from training_helpers import run_hpctrain

RECIPE = ("train", "mnist", "--train-limit", "64")
COMMAND = ("--", "python3", "train.py")  # a dry run of it needs no data set here


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    """A refused command: exit 2, nothing on stdout, one line on stderr, no traceback."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    return line


def dry_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text("print('trained')\n")
    return run_hpctrain("submit", "--dry-run", *args, cwd=tmp_path)


@pytest.mark.parametrize(
    "value,expected",
    [(3, (None, 3)), ("3", (None, 3)), ("1:4", (1, 4)), (" 2 : 4 ", (2, 4)), ("4:4", (None, 4))],
)
def test_nodes_are_a_count_or_a_range(value, expected) -> None:
    assert parse_nodes(value) == expected


@pytest.mark.parametrize("value", ["1-2", "2:", ":2", "a:b", "1:2:3", "4:2"])
def test_a_bad_range_is_refused_with_the_form(value) -> None:
    with pytest.raises(UserError, match="MIN:MAX|MIN is more than MAX"):
        parse_nodes(value)


def test_a_job_file_range_reads_back_from_what_it_writes() -> None:
    job = from_mapping({"command": ["python", "x.py"], "nodes": "1:3", "max_restarts": 2})
    assert (job.resources.min_nodes, job.resources.nodes, job.resources.elastic) == (1, 3, True)
    assert job.to_dict()["nodes"] == "1:3" and "min_nodes" not in job.to_dict()
    assert from_mapping(job.to_dict()) == job
    with pytest.raises(UserError, match="unknown key"):
        from_mapping({"command": ["x"], "min_nodes": 1})


def test_slurm_script_of_an_elastic_job(tmp_path: Path) -> None:
    proc = dry_run(tmp_path, "--scheduler", "slurm", "--nodes", "1:2", "--max-restarts", "3", *COMMAND)
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    assert "#SBATCH --nodes=1-2\n#SBATCH --no-kill\n" in script
    assert "--kill-on-bad-exit=0" in script and "--kill-on-bad-exit=1" not in script
    # srun's own --no-kill: without it srun ends the whole step when a node goes DOWN (test_elastic_slurm [down])
    [step] = [line for line in script.splitlines() if line.startswith("srun ")]
    assert " --no-kill " in step, step
    assert "--nnodes=1:2 " in script and "--max-restarts=3 " in script and "$SLURM_NNODES" not in script


def test_the_job_file_asks_for_the_same(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({"nodes": "1:2", "max_restarts": 3}))
    proc = dry_run(tmp_path, "--scheduler", "slurm", "--job-file", "job.yaml", *COMMAND)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=1-2\n" in proc.stdout and "--nnodes=1:2 " in proc.stdout


def test_submit_help_says_what_a_range_does(tmp_path: Path) -> None:
    proc = run_hpctrain("submit", "--help", cwd=tmp_path)
    assert "MIN:MAX: an elastic job" in " ".join(proc.stdout.split())


@pytest.mark.parametrize(
    "args,message",
    [
        (("--nodes", "1:2", "--max-restarts", "3", "--launcher", "srun"), "elastic job, which torchrun re-forms"),
        (("--nodes", "1:2", "--max-restarts", "3", "--launcher", "single"), "elastic job, which torchrun re-forms"),
        (("--nodes", "1:2"), "--max-restarts N"),
        (("--nodes", "1-2"), "neither a node count nor MIN:MAX"),
        (("--nodes", "2", "--sbatch=--nodes=1-2"), "hpctrain writes --nodes itself"),
        (("--sbatch=-N 2",), "hpctrain writes -N itself"),
        (("--sbatch=--no-kill",), "hpctrain writes --no-kill itself"),
    ],
)
def test_slurm_refusals(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    assert message in one_error(dry_run(tmp_path, "--scheduler", "slurm", *args, *RECIPE))


def test_trainjob_refusal_names_the_pytorchjob_path(tmp_path: Path) -> None:
    proc = dry_run(
        tmp_path,
        *("--scheduler", "kubernetes", "--k8s-api", "trainjob", "--image", "registry.example/hpctrain:1"),
        *("--nodes", "1:2", "--max-restarts", "3", *RECIPE),
    )
    assert "has no elastic policy; use --k8s-api pytorchjob" in one_error(proc)


def test_a_membership_change_is_said_as_one_line() -> None:
    before = {"nodes": 2, "world_size": 2}
    after = {"nodes": 1, "world_size": 1, "worker_group_restart": 1, "resumed_step": 450}
    lost = {"lost_nodes": ["node2"], "lost_at_step": 481, "since_loss_s": 38}
    assert membership_change(before, {**after, **lost}) == (
        "node2 lost at step 481; continued on 1 node at step 450 after 38 s (was 2 nodes, 2 processes)"
    )
    # No survivor's sight of the loss (it could not write it): no "after" measured from the wrong moment.
    assert membership_change(before, after) == "continued on 1 node at step 450 (was 2 nodes, 2 processes)"
    assert membership_change(before, {**after, "world_size": 2}) is None  # same size: a restart, not a change


def test_status_lines_of_an_elastic_run(tmp_path: Path) -> None:
    first = {"nodes": 2, "world_size": 2, "requested_nodes": "1:2"}
    change = "node2 lost at step 481; continued on 1 node at step 450 after 38 s (was 2 nodes, 2 processes)"
    second = {"nodes": 1, "world_size": 1, "requested_nodes": "1:2", "membership_change": change}
    (tmp_path / "provenance.json").write_text(json.dumps({"attempts": [first, second]}))
    assert elastic_lines(tmp_path) == [
        "nodes:       1 of 1:2 (elastic; the run's last group)",
        f"membership:  {change}",
    ]
    (tmp_path / "provenance.json").write_text(json.dumps({"attempts": [{"nodes": 2, "world_size": 2}]}))
    assert elastic_lines(tmp_path) == []  # a fixed-size run: nothing to add
