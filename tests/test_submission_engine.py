"""The engine of `submit` and `check` (hpctrain.engine.submission), called as the web console's job form calls it:
build a job from flag values, check it against the local Slurm cluster (each problem with its fix and its field),
preview the exact script, submit it, and find its record; nothing is printed (issue 40 item 3, for submission)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hpctrain.engine import submission
from hpctrain.errors import UserError


def command_flags(tmp_path: Path, **flags) -> dict:
    return {
        "scheduler": "slurm",
        "name": "engine-test",
        "run_dir": str(tmp_path / "run-%j"),
        "time": "5",
        "job_command": ["--", "sleep", "300"],
        **flags,
    }


def test_check_says_each_problem_with_its_fix_and_its_field(slurm_cluster, tmp_path: Path, capsys) -> None:
    job = submission.build(command_flags(tmp_path, partition="nosuch", nproc_per_node=64))
    problems = [p for p in submission.check(job) if p.blocking]
    by_field = {p.field: p for p in problems}
    assert by_field["partition"].fix == "choose one of: debug, short", problems
    assert by_field["partition"].live and by_field["partition"].line.startswith("--partition nosuch: ")
    fixed = submission.build(command_flags(tmp_path, partition="debug", nproc_per_node=64))
    (cpus,) = [p for p in submission.check(fixed) if p.blocking]
    assert cpus.field == "nproc_per_node" and "CPUs" in cpus.line and cpus.fix, cpus
    assert capsys.readouterr() == ("", "")  # the engine says nothing itself


def test_preview_then_submit_returns_the_job_and_its_record(slurm_cluster, tmp_path: Path, capsys) -> None:
    job = submission.build(command_flags(tmp_path, partition="debug", nproc_per_node=1))
    assert [p for p in submission.check(job) if p.blocking] == []
    rendered = submission.preview(job)
    assert rendered.text.startswith("#!") and "#SBATCH --partition=debug" in rendered.text
    submitted = submission.submit(job)
    try:
        assert submitted.scheduler == "slurm" and submitted.job_id.isdigit()
        assert submitted.run_dir == str(tmp_path / f"run-{submitted.job_id}")
        recorded = yaml.safe_load((Path(submitted.run_dir) / "job.yaml").read_text())
        assert recorded == submitted.description and recorded["slurm"]["partition"] == "debug"
        assert (Path(submitted.run_dir) / rendered.filename).read_text() == rendered.text
        assert capsys.readouterr() == ("", "")
    finally:
        slurm_cluster.cancel_quietly(submitted.job_id)


def test_submit_refuses_a_job_that_a_check_blocks_and_sends_nothing(slurm_cluster, tmp_path: Path) -> None:
    job = submission.build(command_flags(tmp_path, partition="nosuch"))
    with pytest.raises(submission.Refused) as refused:
        submission.submit(job)
    assert "--partition nosuch: no such partition" in str(refused.value)
    assert [p.field for p in refused.value.problems if p.blocking] == ["partition"]
    assert list(tmp_path.iterdir()) == []


def test_bad_input_gets_the_clis_one_line(tmp_path: Path, capsys) -> None:
    """A typed value out of place, an unknown flag, an unknown option key: the words `hpctrain submit` says."""
    from hpctrain.cli import main

    for argv, said in (
        (["--nproc-per-node", "x"], "argument --nproc-per-node/--ntasks-per-node: invalid int value: 'x'"),
        (["--launcher", "mpirun"], "argument --launcher: invalid choice: 'mpirun'"),
    ):
        with pytest.raises(UserError) as err:
            submission.flags_from_argv(argv)
        assert str(err.value).startswith(said)
        with pytest.raises(SystemExit):
            main(["submit", "--dry-run", *argv, "--", "true"])
        assert said in capsys.readouterr().err
    with pytest.raises(UserError, match="unknown job option"):
        submission.build({"no_such_flag": 1})


def test_a_job_file_given_as_text_fills_the_job(tmp_path: Path) -> None:
    """The web form's import: a job file's text and its name (the suffix says the format)."""
    text = "name: from-text\nnodes: 2\ncommand: [sleep, '1']\nscheduler: slurm\nslurm:\n  partition: short\n"
    job = submission.build({"nproc_per_node": 1}, job_file_text=("mine.yaml", text), dry_run=True)
    assert (job.spec.name, job.spec.resources.nodes, job.submission.options["partition"]) == ("from-text", 2, "short")
    with pytest.raises(UserError, match="mine.toml"):
        submission.build({}, job_file_text=("mine.toml", "nodes = ["), dry_run=True)


def test_a_resume_from_another_directory_is_checked_there_and_its_refusal_comes_back(tmp_path, monkeypatch) -> None:
    """engine.submission.resume of a job that ran elsewhere goes through a spawned child (it changes to that
    directory; tests/test_web_slurm.py's resume shows the relative paths read there, on Slurm); what refuses the job
    there comes back as the same one line as here. (No scheduler is reached: the job file names an unknown one.)"""
    from hpctrain.engine.submission import ResumePlan, resume

    there, here = tmp_path / "there", tmp_path / "here"
    there.mkdir()
    here.mkdir()
    monkeypatch.chdir(here)
    plan = ResumePlan({}, ("job.yaml", "command: [python3, train.py]\nscheduler: nowhere\n"), str(there))
    with pytest.raises(UserError) as refused:
        resume(plan)
    with pytest.raises(UserError) as here_too:
        resume(ResumePlan({}, plan.job_file_text, None))
    assert str(refused.value) == str(here_too.value) and "nowhere" in str(refused.value), str(refused.value)
