"""What a job's page reads from its run directory (hpctrain.web.jobpage over hpctrain.training.provenance and
.metrics): the attempts with how each started and ended, the plot's points (finite, thinned), and the description
and hang report as visible text; a file that is not what it should be is its one line, never a traceback. Real
files in a temporary run directory; the attempt records are written by the product's own functions."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the web extra (pip install 'hpctrain[web]') is not installed")

from hpctrain.stops import StopReason
from hpctrain.training.provenance import attempt_rows, read_attempts, record_attempt, record_attempt_end
from hpctrain.training.stopping import write_stop_reason
from hpctrain.web import jobpage


def test_each_attempt_says_how_it_started_and_how_it_ended(tmp_path, monkeypatch):
    """Attempts recorded as the loop records them, each ended by the stop reason the loop writes: a warning, a hang,
    a sick node, then a torchrun restart of another size, and one still running."""
    monkeypatch.setattr("hpctrain.training.provenance.versions", lambda: {})  # no torch import needed here
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    record_attempt(tmp_path, ["node1"], {"world_size": 2, "nodes": 1})
    write_stop_reason(tmp_path, StopReason.PREEMPTED)
    write_stop_reason(tmp_path, StopReason.CANCELLED)  # a later word on the same attempt does not replace the first
    for restart, reason in ((1, StopReason.HUNG), (2, StopReason.SICK_NODE)):
        monkeypatch.setenv("SLURM_RESTART_COUNT", str(restart))
        record_attempt(tmp_path, ["node1", "node2"], {"world_size": 4, "nodes": 2})
        write_stop_reason(tmp_path, reason)
    record_attempt(tmp_path, ["node2"], {"world_size": 2, "nodes": 1, "worker_group_restart": 1, "resumed_step": 64})
    rows = attempt_rows(read_attempts(tmp_path))
    assert [r[0] for r in rows] == ["1", "2", "3", "4"]
    assert [r[2:4] for r in rows] == [("1", "2"), ("2", "4"), ("2", "4"), ("1", "2")]
    assert rows[0][4] == "first start"
    assert rows[0][5] == "time-limit warning or preemption: state saved, requeued"
    assert rows[1][4] == "requeued (restart 1)" and rows[1][5].startswith("hang: the watchdog ended it")
    assert rows[2][4] == "requeued (restart 2)" and rows[2][5].startswith("bad node:")
    assert rows[3][4].startswith("membership change: continued on 1 node at step 64 (was 2 nodes, 4 processes)")
    assert rows[3][5].startswith("running, or ended without a word")


def test_an_attempt_end_without_a_record_changes_nothing(tmp_path):
    record_attempt_end(tmp_path, "completed")  # no provenance.json: nothing written, nothing raised
    assert not (tmp_path / "provenance.json").exists()
    (tmp_path / "provenance.json").write_text("{not json")
    write_stop_reason(tmp_path, StopReason.NONE)  # the batch script's word is written all the same
    assert (tmp_path / "stop_reason").read_text() == "completed\n"
    assert (tmp_path / "provenance.json").read_text() == "{not json"


def test_the_plot_has_finite_points_thinned_to_a_bound(tmp_path):
    lines = [
        json.dumps({"step": 10 * i, "epoch": i, "train_loss": 1.0 / (i + 1), "test_accuracy": None})
        for i in range(1000)
    ]
    lines[5] = json.dumps({"step": 50, "epoch": 5, "train_loss": float("nan")})  # a diverged epoch: no point
    lines[7] = "<script>not a record</script>"
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    plot = jobpage.metrics(tmp_path)
    series = {s["key"]: s["points"] for s in plot["series"]}
    assert plot["records"] == 999 and len(plot["skipped"]) == 1 and "line 8" in plot["skipped"][0]
    assert len(series["train_loss"]) == jobpage.MAX_POINTS
    assert series["train_loss"][0] == [0.0, 1.0] and series["train_loss"][-1] == [9990.0, 1.0 / 1000]
    assert all(s < t for (s, _), (t, _) in zip(series["train_loss"], series["train_loss"][1:]))
    assert series["test_accuracy"] == [] and series["images_per_s"] == []
    assert jobpage.metrics(None) == {"series": [], "records": 0, "skipped": []}


def test_the_description_and_hang_report_are_visible_text_and_a_link_is_refused(tmp_path):
    (tmp_path / "job.yaml").write_text("name: <b>x</b>\x1b[2J\u202eevil\ncommand: [hpctrain, train, mnist]\n")
    (tmp_path / "stop_reason").write_text("hung\n")
    (tmp_path / "hang").mkdir()
    (tmp_path / "hang" / "report.txt").write_text("culprit: rank 1 on node2 never arrived\n  File <x>, line 3\n")
    parts = jobpage.run_parts(tmp_path)
    assert parts["description"] == ["name: <b>x</b>\\x1b[2J\\u202eevil", "command: [hpctrain, train, mnist]"]
    assert parts["hang_report"][0] == "culprit: rank 1 on node2 never arrived"
    assert parts["attempts"] is None and parts["problems"] == []
    assert parts["resume"] is None  # not YAML (an escape character): no command to offer

    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text("secret: 1\n")
    (tmp_path / "job.yaml").unlink()
    os.symlink(elsewhere, tmp_path / "job.yaml")
    parts = jobpage.run_parts(tmp_path)
    assert parts["description"] is None
    assert len(parts["problems"]) == 1 and "job.yaml" in parts["problems"][0], parts["problems"]


def test_a_run_directory_without_a_submission_record_says_so(tmp_path: Path):
    parts = jobpage.run_parts(tmp_path)
    assert parts["problems"] == [f"no job.yaml in {tmp_path}: the job was not submitted by `hpctrain submit`"]
    assert parts["hang_report"] is None and parts["attempts"] is None


def test_the_resume_command_is_the_cli_s_resume_path(tmp_path, monkeypatch):
    """A recipe: its job file, its recorded options, this run directory and --resume; run where it was submitted
    from (tests/test_web_slurm.py runs the command a page shows). Your own command: the job file and the run
    directory (the program resumes from it)."""
    monkeypatch.setattr("hpctrain.training.provenance.versions", lambda: {})
    (tmp_path / "job.yaml").write_text("command: [hpctrain, train, mnist, --epochs, '2']\nname: a b\n")
    monkeypatch.chdir(tmp_path.parent)
    record_attempt(tmp_path, ["node1"], {"world_size": 1, "nodes": 1})
    command = f"hpctrain submit --job-file {tmp_path}/job.yaml train mnist --epochs 2 --run-dir {tmp_path} --resume"
    assert jobpage.run_parts(tmp_path)["resume"] == f"cd {tmp_path.parent} && {command}"
    (tmp_path / "job.yaml").write_text("command: [python, 'my train.py']\n")
    assert jobpage.run_parts(tmp_path)["resume"].endswith(f"submit --job-file {tmp_path}/job.yaml --run-dir {tmp_path}")
