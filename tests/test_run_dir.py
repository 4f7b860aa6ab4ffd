"""The run directory is the run's memory: `--resume` never starts over silently, two runs never share one, damaged
checkpoints are kept as evidence, and nothing is written or read through a symbolic link.

End to end with the real `hpctrain train` in subprocesses; one short training (module fixture) is copied where a
test needs checkpoints."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid

import pytest
import torch

from hpctrain import checkpoint
from hpctrain.errors import UserError
from hpctrain.fsutil import DirectoryInUse, DirectoryLock, append_line, read_text, write_atomic
from hpctrain.training.metrics import read_metrics
from training_helpers import QUICK, hpctrain, start_hpctrain, tree_digest

CLASSIC = ("--recipe", "classic")  # 512 images / batch 64: 8 steps an epoch


def train(data_dir, run_dir, *extra, expect=0, env=None):
    result = hpctrain(
        "train", "mnist", *QUICK, *CLASSIC, "--data-dir", str(data_dir), "--run-dir", str(run_dir), *extra, env=env
    )
    assert result.returncode == expect, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    if expect == 2:
        assert "Traceback" not in result.stderr, result.stderr
    return result


@pytest.fixture(scope="module")
def one_epoch(fashion_data_dir, tmp_path_factory):
    """A run directory after one completed epoch (checkpoint_epoch_1.pt, global step 8)."""
    run_dir = tmp_path_factory.mktemp("one-epoch") / "run"
    train(fashion_data_dir, run_dir, "--epochs", "1")
    return run_dir


@pytest.fixture
def run_copy(one_epoch, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(one_epoch, copy)
    return copy


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------- every checkpoint damaged


@pytest.mark.parametrize("how", ["--resume", "requeued"])
def test_resume_refuses_when_every_checkpoint_is_damaged_and_changes_nothing(fashion_data_dir, run_copy, how):
    only = run_copy / "checkpoints" / "checkpoint_epoch_1.pt"
    flip_a_byte(only)
    before = tree_digest(run_copy)
    extra, env = (["--resume"], None) if how == "--resume" else ([], {"SLURM_RESTART_COUNT": "1"})
    result = train(fashion_data_dir, run_copy, "--epochs", "2", *extra, env=env, expect=2)
    assert "no usable checkpoint" in result.stderr
    assert "checkpoint_epoch_1.pt fails its checksum" in result.stderr
    assert tree_digest(run_copy) == before  # not overwritten, not pruned, no metrics appended


def test_resume_past_a_damaged_newest_checkpoint_moves_it_aside_and_never_overwrites_it(fashion_data_dir, run_copy):
    train(fashion_data_dir, run_copy, "--epochs", "2", "--resume")
    damaged = run_copy / "checkpoints" / "checkpoint_epoch_2.pt"
    damaged.write_bytes(damaged.read_bytes()[:1000])
    evidence = damaged.read_bytes()
    result = train(fashion_data_dir, run_copy, "--epochs", "3", "--resume")
    assert "global step 8" in result.stdout and "moved checkpoint_epoch_2.pt aside" in result.stdout
    assert (run_copy / "checkpoints" / "checkpoint_epoch_2.pt.corrupt").read_bytes() == evidence
    assert [r["epoch"] for r in read_metrics(run_copy)] == [1, 2, 3]
    assert checkpoint.find_latest(run_copy / "checkpoints").epoch == 3


def test_a_killed_first_save_is_not_damage_a_requeued_attempt_starts_over(fashion_data_dir, run_copy):
    """What SIGKILL during the very first save leaves (a checkpoint without its manifest) never counted: a
    requeued attempt starts from the beginning, and the file is moved aside rather than overwritten."""
    ckpt = run_copy / "checkpoints" / "checkpoint_epoch_1.pt"
    ckpt.with_name(ckpt.name + ".manifest.json").unlink()
    (run_copy / "metrics.jsonl").unlink()
    result = train(fashion_data_dir, run_copy, "--epochs", "1", env={"SLURM_RESTART_COUNT": "1"})
    assert "starting from the beginning" in result.stdout
    assert (run_copy / "checkpoints" / "checkpoint_epoch_1.pt.incomplete").exists()
    assert [r["epoch"] for r in read_metrics(run_copy)] == [1]


# ---------------------------------------------------------------- what --resume accepts


def test_resume_of_a_run_dir_that_does_not_exist_is_refused(fashion_data_dir, tmp_path):
    typo = tmp_path / "rnu"
    result = train(fashion_data_dir, typo, "--epochs", "1", "--resume", expect=2)
    assert f"the run directory {typo} does not exist" in result.stderr and "typo" in result.stderr
    assert not typo.exists()


@pytest.mark.parametrize("restart", [{"SLURM_RESTART_COUNT": "2"}, {"HPCTRAIN_AUTO_RESUME": "1"}])
def test_a_requeued_attempt_into_a_run_dir_not_yet_made_starts_fresh(fashion_data_dir, tmp_path, restart):
    run_dir = tmp_path / "new"
    train(fashion_data_dir, run_dir, "--epochs", "1", "--train-limit", "128", env=restart)
    assert [r["epoch"] for r in read_metrics(run_dir)] == [1]


def test_a_pod_restarted_in_place_resumes_without_being_told(fashion_data_dir, run_copy):
    """Kubernetes restarts a failed container with nothing in its environment to say so; the rendered pods carry
    HPCTRAIN_AUTO_RESUME=1, so the same command resumes instead of refusing a run dir that holds checkpoints."""
    result = train(fashion_data_dir, run_copy, "--epochs", "2", env={"HPCTRAIN_AUTO_RESUME": "1"})
    assert "resumed at epoch 2, step 0" in result.stdout
    assert [r["epoch"] for r in read_metrics(run_copy)] == [1, 2]


def test_resume_of_a_complete_run_says_so_and_how_to_extend_it(fashion_data_dir, run_copy):
    before = tree_digest(run_copy)
    result = train(fashion_data_dir, run_copy, "--epochs", "1", "--resume")
    assert "already complete" in result.stdout and "--epochs 2" in result.stdout
    assert "resumed at" not in result.stdout
    assert tree_digest(run_copy) == before


@pytest.mark.parametrize("form", ["run dir", "checkpoints dir", "latest pointer"])
def test_resume_accepts_a_run_dir_a_checkpoints_dir_or_the_latest_pointer(fashion_data_dir, one_epoch, tmp_path, form):
    path = {
        "run dir": one_epoch,
        "checkpoints dir": one_epoch / "checkpoints",
        "latest pointer": one_epoch / "checkpoints" / "latest",
    }[form]
    result = train(fashion_data_dir, tmp_path / "continued", "--epochs", "2", "--resume", str(path))
    assert "resumed at epoch 2, step 0 of 8 (global step 8)" in result.stdout
    assert [r["epoch"] for r in read_metrics(tmp_path / "continued")] == [2]


def test_resume_of_an_older_checkpoint_sets_the_newer_ones_aside(fashion_data_dir, run_copy):
    """Newest is decided by (epoch, step): after going back to epoch 1, the abandoned epoch-2 line must not count
    as newer than the resumed run's own saves, nor be overwritten by them."""
    train(fashion_data_dir, run_copy, "--epochs", "2", "--resume")
    abandoned = (run_copy / "checkpoints" / "checkpoint_epoch_2.pt").read_bytes()
    train(
        fashion_data_dir, run_copy, "--epochs", "2", "--resume", str(run_copy / "checkpoints" / "checkpoint_epoch_1.pt")
    )
    assert (run_copy / "checkpoints" / "checkpoint_epoch_2.pt.abandoned").read_bytes() == abandoned
    assert checkpoint.find_latest(run_copy / "checkpoints").epoch == 2


# ---------------------------------------------------------------- checkpoints that do not fit


@pytest.mark.parametrize(
    "change,message",
    [
        ("shape", "holds a different model"),
        ("no ranks", "lacks 'ranks'"),
    ],
)
def test_a_checkpoint_that_does_not_fit_is_refused_clearly(fashion_data_dir, one_epoch, tmp_path, change, message):
    state = checkpoint.load(one_epoch / "checkpoints" / "checkpoint_epoch_1.pt")
    if change == "shape":
        name = next(k for k, v in state["model"].items() if v.dim() == 2)
        state["model"][name] = torch.zeros(3, 3)
    else:
        del state["ranks"]
    forged = checkpoint.save(state, tmp_path / "elsewhere", "checkpoint_epoch_1.pt", epoch=1, step=8)
    result = train(fashion_data_dir, tmp_path / "run", "--epochs", "2", "--resume", str(forged), expect=2)
    assert message in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "what,message",
    [
        ("empty", "is empty (0 bytes)"),
        ("not ours", "is not an hpctrain checkpoint"),
    ],
)
def test_files_that_are_no_checkpoints_are_named_for_what_they_are(fashion_data_dir, tmp_path, what, message):
    path = tmp_path / ("checkpoint_epoch_1.pt" if what == "empty" else "weights.bin")
    path.write_bytes(b"" if what == "empty" else b"\x00" * 64)
    result = train(fashion_data_dir, tmp_path / "run", "--resume", str(path), expect=2)
    assert message in result.stderr and "did not finish" not in result.stderr and "()" not in result.stderr


# ---------------------------------------------------------------- one run at a time


def test_a_second_run_in_a_locked_run_dir_is_refused_naming_the_holder(fashion_data_dir, tmp_path):
    run_dir = tmp_path / "run"
    first = start_hpctrain(
        "train",
        "mnist",
        *QUICK,
        *CLASSIC,
        "--data-dir",
        str(fashion_data_dir),
        "--run-dir",
        str(run_dir),
        "--epochs",
        "50",
    )
    try:
        for line in first.stdout:
            if "step 1/" in line:
                break
        first.send_signal(signal.SIGSTOP)  # holds its lock, does nothing: the test cannot race it
        for extra in ([], ["--resume"]):
            result = train(fashion_data_dir, run_dir, "--epochs", "1", *extra, expect=2)
            assert "is in use by another run" in result.stderr
            assert f"pid {first.pid} on {socket.gethostname()}" in result.stderr
        result = train(fashion_data_dir, run_dir, "--epochs", "1", "--nproc", "2", "--resume", expect=2)
        assert f"pid {first.pid}" in result.stderr
        first.kill()  # SIGKILL: the kernel drops the lock; the file it leaves means nothing
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=60)
    result = train(fashion_data_dir, run_dir, "--epochs", "1", "--resume")
    assert "in use" not in result.stderr
    assert not (run_dir / ".hpctrain.lock").exists()  # released, and removed, at the end of a run


def test_directory_lock_excludes_a_second_holder_and_survives_a_removed_file(tmp_path):
    lock = DirectoryLock.acquire(tmp_path / "a" / "b", ".lock", "pid 1 on test")
    with pytest.raises(DirectoryInUse, match=r"in use by another run \(pid 1 on test\)"):
        DirectoryLock.acquire(tmp_path / "a" / "b", ".lock", "second")
    lock.release()
    again = DirectoryLock.acquire(tmp_path / "a" / "b", ".lock", "third")
    assert read_text(tmp_path / "a" / "b" / ".lock") == "third\n"
    again.release()
    assert not (tmp_path / "a").exists()  # directories made for the lock and left empty are removed again
    # A lock file left by a killed holder is no lock.
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / ".lock").write_text("pid 99999 on gone\n")
    DirectoryLock.acquire(tmp_path / "c", ".lock", "new").release()


def test_the_lock_is_dropped_when_its_holder_is_killed(tmp_path):
    code = (
        "import sys, time; from pathlib import Path; from hpctrain.fsutil import DirectoryLock; "
        "DirectoryLock.acquire(Path(sys.argv[1]), '.lock', 'child'); print('locked', flush=True); "
        "time.sleep(600)"
    )
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(DirectoryInUse, match="child"):
            DirectoryLock.acquire(tmp_path, ".lock", "parent")
        child.kill()
        child.wait(timeout=60)
        DirectoryLock.acquire(tmp_path, ".lock", "parent").release()
    finally:
        if child.poll() is None:
            child.kill()


def test_a_lost_lock_is_noticed_and_its_successors_file_left_alone(tmp_path):
    """Deleting a held lock file (a clean-up of "stale" locks) lets a second process lock a new file there."""
    lock = DirectoryLock.acquire(tmp_path, ".lock", "first")
    assert lock.lost() is None
    (tmp_path / ".lock").unlink()
    assert lock.lost() == "removed"
    second = DirectoryLock.acquire(tmp_path, ".lock", "second")  # what a second --resume then does
    assert lock.lost() == "replaced by another file" and second.lost() is None
    lock.release()
    assert read_text(tmp_path / ".lock") == "second\n"  # the first's release leaves the second's file alone
    second.release()


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_lock_path_that_is_a_fifo_or_a_directory_is_refused_in_one_line(fashion_data_dir, tmp_path, kind):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lock = run_dir / ".hpctrain.lock"
    os.mkfifo(lock) if kind == "fifo" else lock.mkdir()
    with pytest.raises(UserError, match=f"is a {'FIFO' if kind == 'fifo' else 'directory'}, not the lock file"):
        DirectoryLock.acquire(run_dir, ".hpctrain.lock", "me")
    result = train(fashion_data_dir, run_dir, "--epochs", "1", expect=2)
    [line] = result.stderr.strip().splitlines()
    assert f"{lock} is a" in line and "remove it" in line, line  # before anything waits on it


def test_a_run_whose_lock_file_is_deleted_stops_at_its_next_checkpoint(fashion_data_dir, tmp_path):
    """Guards issue 29 (A5): with the lock file deleted, a second `--resume` could lock a new one and train in the
    same directory at once, interleaving checkpoints and metrics. The run checks its lock at every checkpoint."""
    run_dir = tmp_path / "run"
    first = start_hpctrain(
        "train",
        "mnist",
        *QUICK,
        *CLASSIC,
        "--data-dir",
        str(fashion_data_dir),
        "--run-dir",
        str(run_dir),
        "--epochs",
        "3",
    )
    try:
        for line in first.stdout:
            if "step 1/" in line:
                break
        first.send_signal(signal.SIGSTOP)  # mid-epoch 1, before its checkpoint: the test cannot race it
        (run_dir / ".hpctrain.lock").unlink()
        first.send_signal(signal.SIGCONT)
        stderr, _ = first.communicate(timeout=300)  # stderr joins stdout
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=60)
    assert first.returncode == 2 and "Traceback" not in stderr, stderr
    assert f"{run_dir / '.hpctrain.lock'} was removed while this run held it" in stderr, stderr
    assert "stops without writing its checkpoint at step 8" in stderr, stderr
    assert not list((run_dir / "checkpoints").glob("checkpoint_*.pt"))


# ---------------------------------------------------------------- paths of the wrong kind


def _make(path, kind):
    if kind == "file":
        path.write_text("in the way\n")
    elif kind == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)


@pytest.mark.parametrize(
    "name,kind",
    [
        ("checkpoints", "file"),
        ("metrics.jsonl", "directory"),
        ("stop_reason", "directory"),
        ("provenance.json", "fifo"),
    ],
)
def test_a_run_path_of_the_wrong_kind_is_refused_before_the_first_step(fashion_data_dir, tmp_path, name, kind):
    """Guards issue 29 (A6): these were found only after the epoch's work (the epoch lost), or blocked forever."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _make(run_dir / name, kind)
    result = train(fashion_data_dir, run_dir, "--epochs", "1", expect=2)
    [line] = result.stderr.strip().splitlines()
    assert f"{run_dir / name} is a" in line and "the run writes a" in line, line
    assert "step 1/" not in result.stdout + result.stderr


def test_every_path_a_run_writes_is_checked_for_its_kind(tmp_path):
    from hpctrain.training.rundir import RUN_DIRECTORIES, RUN_FILES, check_run_paths

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    check_run_paths(run_dir)  # nothing there yet: nothing in the way
    for name in RUN_FILES + RUN_DIRECTORIES:
        for kind in ("fifo", "directory" if name in RUN_FILES else "file"):
            _make(run_dir / name, kind)
            with pytest.raises(UserError, match=f"^{run_dir / name} is a"):
                check_run_paths(run_dir)
            (run_dir / name).rmdir() if kind == "directory" else (run_dir / name).unlink()
        _make(run_dir / name, "directory" if name in RUN_DIRECTORIES else "file")
    check_run_paths(run_dir)  # each of the right kind


# ---------------------------------------------------------------- symbolic links


@pytest.mark.parametrize("name", ["metrics.jsonl", "provenance.json", "stop_reason", "config.yaml"])
def test_a_symlinked_run_file_is_refused_and_its_target_untouched(fashion_data_dir, tmp_path, name):
    run_dir, target = tmp_path / "run", tmp_path / "precious.txt"
    run_dir.mkdir()
    target.write_text("do not touch\n")
    (run_dir / name).symlink_to(target)
    result = train(fashion_data_dir, run_dir, "--epochs", "1", expect=2)
    assert f"{run_dir / name} is a symbolic link" in result.stderr
    assert target.read_text() == "do not touch\n"


@pytest.mark.parametrize("name", ["checkpoints", "tb"])
@pytest.mark.parametrize("resume", [False, True])
def test_a_symlinked_run_folder_is_refused_and_its_target_untouched(
    fashion_data_dir, one_epoch, tmp_path, name, resume
):
    """Guards issue 17: `ln -s /elsewhere/ck RUN/checkpoints` put checkpoints, manifests and `latest` in
    /elsewhere/ck, exit 0 (the same for tb/). The run's folders are never written (nor read) through a link."""
    elsewhere = tmp_path / "elsewhere"
    if resume:  # a run with checkpoints whose folder was replaced by a link to a copy of it
        run_dir = tmp_path / "run"
        shutil.copytree(one_epoch, run_dir)
        shutil.move(run_dir / name, elsewhere)
    else:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        elsewhere.mkdir()
    (run_dir / name).symlink_to(elsewhere)
    before = tree_digest(elsewhere)
    result = train(fashion_data_dir, run_dir, "--epochs", "2", *(["--resume"] if resume else []), expect=2)
    assert f"{run_dir / name} is a symbolic link" in result.stderr and "this folder itself" in result.stderr
    assert tree_digest(elsewhere) == before


def test_run_file_helpers_never_follow_links(tmp_path):
    target = tmp_path / "target"
    target.write_text("x\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(OSError):
        append_line(link, "y")
    with pytest.raises(OSError):
        read_text(link)
    write_atomic(link, b"new\n")  # replaces the link itself
    assert not link.is_symlink() and link.read_text() == "new\n" and target.read_text() == "x\n"


# ---------------------------------------------------------------- disk full


@pytest.fixture
def small_tmpfs(tmp_path):
    """A file system that fills up: tmpfs, which only root may mount (the test is skipped otherwise)."""
    mount = tmp_path / "small"
    mount.mkdir()
    sizes = {}

    def make(size_bytes: int):
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", f"hpctrain-{uuid.uuid4().hex[:8]}", str(mount)],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()}): needs root")
        sizes["mounted"] = True
        return mount

    yield make
    if sizes:
        subprocess.run(["umount", str(mount)], check=False)


def test_disk_full_during_a_checkpoint_says_so_and_keeps_the_previous_ones(fashion_data_dir, one_epoch, small_tmpfs):
    size = (one_epoch / "checkpoints" / "checkpoint_epoch_1.pt").stat().st_size
    mount = small_tmpfs(int(size * 1.6) + 512 * 1024)  # room for one checkpoint and the small files, not two
    run_dir = mount / "run"
    shutil.copytree(one_epoch, run_dir, ignore=shutil.ignore_patterns("tb"))
    result = train(fashion_data_dir, run_dir, "--epochs", "2", "--resume", "--sync-checkpoints", expect=2)
    assert "no space left on the device holding" in result.stderr and str(run_dir / "checkpoints") in result.stderr
    assert "unexpected pos" not in result.stderr
    assert checkpoint.find_latest(run_dir / "checkpoints").epoch == 1
    assert not [p for p in (run_dir / "checkpoints").iterdir() if ".tmp-" in p.name or "epoch_2" in p.name]
