"""The batch script's restart logic (schedulers/slurm/batch/script.py), run with stand-ins for srun and scontrol
(test_render.py's): who gets the time-limit warning, when the job requeues itself, and that nothing read back from
the run directory (counters, node lists, special files) can break the script, hang it, or make a budget endless.
Slurm's own behaviour (signals through srun, requeues) is tested on the local cluster in
test_submit_signals_slurm.py."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.schedulers.slurm.batch.requeue import helper_lines
from hpctrain.schedulers.slurm.batch.script import render_sbatch
from hpctrain.schedulers.slurm.batch.options import SlurmOptions
from test_render import _run_and_signal, fake_slurm, slurm_job  # noqa: F401 - the fixture

RUN = Path("runs") / "r-4242"


def _job(**changes) -> tuple[JobSpec, SlurmOptions]:
    return slurm_job(
        command=("python3", "my_train.py"),
        launcher="srun",
        resources=Resources(nodes=1, nproc_per_node=1),
        run_dir="runs/r-%j",
        signal_grace=60,
        **changes,
    )


def _requeued(out: Path) -> bool:
    return (out / "scontrol").exists() and "requeue 4242" in (out / "scontrol").read_text()


def test_a_program_that_never_said_it_handles_the_warning_does_not_get_it_and_is_not_requeued(fake_slurm) -> None:
    """Python's default action for SIGUSR1 ends the process: a program that did not say it handles it (no
    RUN/handles_signals) must not get it, and its end at the time limit is no reason to start it from scratch."""
    tmp_path, env, out = fake_slurm
    code, output = _run_and_signal(tmp_path, env, out, _job(), signal.SIGUSR1, "ignores")
    assert not (out / "signals").exists(), output
    assert "not passed on, since your program has not said it handles it" in output
    assert not _requeued(out) and code == 3, output


def test_a_step_that_fails_after_the_warning_without_saying_it_saved_is_not_requeued(fake_slurm) -> None:
    tmp_path, env, out = fake_slurm
    code, output = _run_and_signal(tmp_path, env, out, _job(), signal.SIGUSR1, "fail")
    assert (out / "signals").read_text() == "SIGUSR1\n", output  # it said it handles it: passed on
    assert not _requeued(out), output
    assert "without saying it stopped with its state saved" in output and code == 3


def test_a_stale_stop_reason_of_an_earlier_attempt_is_no_word_of_this_one(fake_slurm) -> None:
    tmp_path, env, out = fake_slurm
    (tmp_path / RUN).mkdir(parents=True)
    (tmp_path / RUN / "stop_reason").write_text("preempted\n")  # the attempt before this one's
    code, output = _run_and_signal(tmp_path, env, out, _job(), signal.SIGUSR1, "fail")
    assert not _requeued(out), output


def test_a_planned_stop_explains_slurms_error_lines_about_its_exit_status(fake_slurm) -> None:
    """Issue 39 §18: srun reports a planned stop's exit status 75 as `error: ... Exited with exit code 75` (and
    slurmstepd the tasks --kill-on-bad-exit ended as CANCELLED): the script says, before it requeues, what those
    lines were. A stop that exits 0 leaves Slurm nothing to report, and nothing to explain."""
    tmp_path, env, out = fake_slurm
    code, output = _run_and_signal(tmp_path, env, out, _job(), signal.SIGUSR1, "preempt-75")
    assert _requeued(out) and code == 0, output
    lines = output.splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith("hpctrain: the run stopped as planned")]
    assert len(said) == 1 and "(exit status 75)" in lines[said[0]] and "not a failure" in lines[said[0]], output
    assert lines[said[0] + 1].startswith("hpctrain: the run stopped with its state saved; requeueing job 4242")
    for name in ("requeue_count", "hang_restarts"):
        (tmp_path / RUN / name).unlink(missing_ok=True)
    for left in out.iterdir():  # the first run's records (ready, signals, scontrol)
        left.unlink()
    code, output = _run_and_signal(tmp_path, env, out, _job(), signal.SIGUSR1, "preempt")
    assert _requeued(out) and "stopped as planned" not in output, output


def test_a_counter_with_a_leading_zero_is_a_decimal_number(fake_slurm) -> None:
    tmp_path, env, out = fake_slurm
    (tmp_path / RUN).mkdir(parents=True)
    (tmp_path / RUN / "requeue_count").write_text("08\n")  # not octal: bash's $((08)) is an error
    env = {**env, "SLURM_RESTART_COUNT": "08"}
    code, output = _run_and_signal(tmp_path, env, out, _job(max_requeues=9), signal.SIGUSR1, "preempt")
    assert _requeued(out) and code == 0, output
    assert (tmp_path / RUN / "requeue_count").read_text() == "9\n"


def test_a_counter_that_cannot_be_written_refuses_the_requeue(fake_slurm) -> None:
    """A budget whose count cannot be kept would never run out: no requeue."""
    tmp_path, env, out = fake_slurm
    (tmp_path / RUN / "requeue_count").mkdir(parents=True)
    code, output = _run_and_signal(tmp_path, env, out, _job(), signal.SIGUSR1, "preempt")
    assert not _requeued(out), output
    assert "cannot record the restart in runs/r-4242/requeue_count: not requeueing" in output
    assert code == 1  # stopped early, not requeued: never a success


def test_a_counter_is_never_written_through_a_link_planted_in_the_run_directory(tmp_path: Path) -> None:
    """A temporary with a name known in advance (the shell's pid) can be a link someone planted: writing through
    it overwrote a file outside the run directory. The temporary is mktemp's (O_EXCL), then renamed."""
    run, outside = tmp_path / "run", tmp_path / "precious"
    run.mkdir()
    outside.write_text("keep me\n")
    body = "\n".join([*helper_lines(), "read -r _", 'write_count "$1/requeue_count" 7'])
    proc = subprocess.Popen(["bash", "-c", body, "bash", str(run)], stdin=subprocess.PIPE, text=True)
    for name in ("requeue_count", "excluded_nodes"):  # the names the old script wrote through ($$: bash's pid)
        (run / f"{name}.tmp.{proc.pid}").symlink_to(outside)
    proc.communicate("go\n", timeout=30)
    assert proc.returncode == 0
    assert outside.read_text() == "keep me\n"
    assert (run / "requeue_count").read_text() == "7\n" and not (run / "requeue_count").is_symlink()
    assert sorted(p.name for p in run.iterdir() if ".tmp." in p.name) == [
        f"excluded_nodes.tmp.{proc.pid}",
        f"requeue_count.tmp.{proc.pid}",
    ]  # only the planted links: no temporary of its own is left behind


def test_a_fifo_for_a_counter_or_stop_reason_does_not_hang_the_script(fake_slurm) -> None:
    tmp_path, env, out = fake_slurm
    (tmp_path / RUN).mkdir(parents=True)
    for name in ("requeue_count", "hang_restarts", "excluded_nodes"):
        os.mkfifo(tmp_path / RUN / name)
    (tmp_path / "job.sbatch").write_text(render_sbatch(*_job()))
    proc = subprocess.run(["bash", "job.sbatch"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_restarts_beyond_every_budget_together_end_the_job_whatever_the_run_directory_says(fake_slurm) -> None:
    tmp_path, env, out = fake_slurm
    (tmp_path / RUN).mkdir(parents=True)
    (tmp_path / RUN / "requeue_count").write_text("900\n")  # a count that would excuse any number of restarts
    job = _job(max_requeues=1, max_hang_restarts=1, max_preemptions=1)
    (tmp_path / "job.sbatch").write_text(render_sbatch(*job))
    proc = subprocess.run(
        ["bash", "job.sbatch"],
        cwd=tmp_path,
        env={**env, "SLURM_RESTART_COUNT": "4"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1 and "more than all its budgets together allow (3:" in proc.stderr
    assert not (out / "ready").exists(), "the step must not start"


def _excluded(tmp_path: Path, job: JobSpec, bad_nodes: str, partition_nodes: int) -> str:
    """The sick-node requeue's own lines (with the real scontrol's hostlist expansion), with a partition of
    `partition_nodes`: "end", "requeue" or "empty"."""
    script = render_sbatch(job)
    lines = [
        line.strip()
        for line in script.splitlines()
        if line.strip().startswith(("excluded=", "partition_nodes=", "left="))
    ]
    (tmp_path / "bad_nodes").write_text(bad_nodes)
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "bin" / "sinfo").write_text(f"#!/bin/sh\necho {partition_nodes}\n")
    (tmp_path / "bin" / "sinfo").chmod(0o755)
    body = "\n".join(
        [
            *helper_lines(),
            f"run_dir={tmp_path}",
            "SLURM_JOB_NUM_NODES=" + str(job.resources.nodes),
            *lines,
            'if [ -z "$excluded" ]; then echo empty; elif [ "$partition_nodes" -gt 0 ] && '
            '[ "$left" -lt "$SLURM_JOB_NUM_NODES" ]; then echo "end $excluded"; else echo "requeue $excluded"; fi',
        ]
    )
    return subprocess.run(
        ["bash", "-c", body],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"},
    ).stdout.strip()


@pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v scontrol"], capture_output=True).returncode != 0,
    reason="needs Slurm's scontrol (hostlist expansion)",
)
@pytest.mark.parametrize(
    ("bad", "partition", "expected"),
    [
        ("node[1-2]\n", 3, "end node1,node2"),  # one expression, two nodes: 3 - 2 < 2 nodes the job needs
        ("node[1-2]\n", 4, "requeue node1,node2"),
        ("node3\nnode3\n", 3, "requeue node3"),
        ("$(touch pwned)\n[\n", 3, "empty"),  # names no node: never exclude on garbage
    ],
)
def test_a_bad_node_list_is_read_as_hostlists_and_never_excludes_more_than_the_partition_spares(
    tmp_path: Path, bad: str, partition: int, expected: str
) -> None:
    job = JobSpec(command=("hpctrain", "train", "mnist"), run_dir="runs/x-%j", resources=Resources(nodes=2))
    assert _excluded(tmp_path, job, bad, partition) == expected
    assert not (tmp_path / "pwned").exists()


def test_submit_says_in_one_line_what_the_warning_will_do(tmp_path: Path) -> None:
    from hpctrain.schedulers.slurm.checks.login_node import warning_note

    (tmp_path / "lib.py").write_text("from hpctrain.training import StopRequest\nstop = StopRequest().install()\n")
    (tmp_path / "plain.py").write_text("import time\ntime.sleep(9)\n")
    job, options = _job()
    [uses] = warning_note(job, options, (str(tmp_path / "lib.py"),))
    assert uses == (
        f"note: time limit: SIGUSR1 60 s before it goes to your program once it installs "
        f"hpctrain.training.StopRequest (as {tmp_path / 'lib.py'} does); the job requeues itself only if "
        "the program then says its state is saved (announce_stop), at most 3 times"
    )
    [plain] = warning_note(job, options, (str(tmp_path / "plain.py"),))
    assert plain.startswith(
        f"note: time limit: {tmp_path / 'plain.py'} does not use hpctrain.training.StopRequest, "
        "which says it handles SIGUSR1; a program that does not say so gets no SIGUSR1"
    )
    assert warning_note(job.replace(signal_grace=0), options) == [
        "note: time limit: no warning (--signal-grace 0): the job ends at its limit, and is not requeued"
    ]
    [recipe] = warning_note(JobSpec(command=("hpctrain", "train", "mnist"), run_dir="runs/x-%j"), SlurmOptions())
    assert "the run gets SIGUSR1 120 s before it, checkpoints and stops" in recipe


def test_a_recipe_into_a_run_directory_of_an_earlier_run_is_refused_before_queueing(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """`train` refuses a run directory with checkpoints unless --resume: the check says so before the queue does."""
    from hpctrain.checkpoint.files import NAME_PATTERN
    from hpctrain.cli import main
    from hpctrain.schedulers.slurm.checks import login_node
    from hpctrain.training.rundir import CHECKPOINT_DIR

    assert (login_node.CHECKPOINT_NAME.pattern, login_node.CHECKPOINT_DIR) == (NAME_PATTERN.pattern, CHECKPOINT_DIR)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "done" / "checkpoints").mkdir(parents=True)
    (tmp_path / "done" / "checkpoints" / "checkpoint_epoch_1.pt").write_bytes(b"x")
    argv = ["submit", "--dry-run", "train", "imagenet", "--synthetic", "--run-dir", "done"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        "hpctrain submit: --run-dir done already holds checkpoints of an earlier run, which the job's `train` "
        "would refuse after waiting in the queue: pass --resume (after the recipe: `train imagenet --resume ...`) "
        "to continue it, or choose another --run-dir for a new run"
    ) in err
    main([*argv, "--resume"])
    assert "already holds checkpoints" not in capsys.readouterr().err
    assert main(["submit", "--dry-run", "train", "imagenet", "--synthetic", "--run-dir", "new"]) == 0, (
        capsys.readouterr().err
    )
