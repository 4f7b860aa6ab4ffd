"""hpctrain.checkpoint: atomic saves, manifests, safe loading, choosing the newest valid one, pruning."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from hpctrain import checkpoint
from hpctrain.checkpoint import CheckpointError, writing
from hpctrain.fsutil import sha256_file


def make_state(seed: int = 0) -> dict:
    """A real training state: a small model and its Adam state after one step, plus counters and RNG."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "epoch": 1,
        "step": 10 + seed,
        "rng": {"torch": torch.get_rng_state()},
        "config": {"lr": 0.01, "name": "test"},
    }


def assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def save_at(directory: Path, step: int, *, end_of_epoch: bool = False, keep: int | None = None, state=None) -> Path:
    state = state if state is not None else {"model": {"w": torch.full((4,), float(step))}, "step": step}
    name = checkpoint.checkpoint_name(step // 100, step, end_of_epoch)
    return checkpoint.save(state, directory, name, epoch=step // 100, step=step, keep=keep)


def manifest(path: Path) -> dict:
    return json.loads((path.parent / (path.name + ".manifest.json")).read_text())


# ---------------------------------------------------------------- round trip and refusing code


def test_round_trip(tmp_path):
    state = make_state()
    path = checkpoint.save(state, tmp_path / "ckpt", "checkpoint_epoch_1.pt", epoch=1, step=10, world_size=4)
    assert path == tmp_path / "ckpt" / "checkpoint_epoch_1.pt"
    assert_same(state, checkpoint.load(path))
    info = checkpoint.verify(path)
    assert (info.epoch, info.step, info.world_size, info.size) == (1, 10, 4, path.stat().st_size)
    written = manifest(path)
    assert written["format_version"] == checkpoint.FORMAT_VERSION
    assert written["file"] == "checkpoint_epoch_1.pt" and written["sha256"] == info.sha256
    # The checksum was computed while writing: it must equal one computed from the file afterwards.
    assert sha256_file(path) == (info.sha256, info.size)
    assert (tmp_path / "ckpt" / "latest").read_text() == "checkpoint_epoch_1.pt\n"
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "checkpoint_epoch_1.pt",
        "checkpoint_epoch_1.pt.manifest.json",
        "latest",
    ]


def test_checkpoint_name():
    assert checkpoint.checkpoint_name(3, 1234, True) == "checkpoint_epoch_3.pt"
    assert checkpoint.checkpoint_name(3, 1234, False) == "checkpoint_step_1234.pt"


def _run_code(marker: str) -> str:
    Path(marker).write_text("code ran")
    return "boom"


class Malicious:
    """Unpickling this calls _run_code: what a hostile or merely foreign checkpoint could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (_run_code, (str(self.marker),))


def test_checkpoint_holding_an_arbitrary_object_is_refused(tmp_path):
    marker = tmp_path / "marker"
    state = {"model": {}, "payload": Malicious(marker)}
    path = checkpoint.save(state, tmp_path, "checkpoint_epoch_1.pt", epoch=1, step=1)
    checkpoint.verify(path)  # its checksum is fine: only loading can tell
    with pytest.raises(CheckpointError, match="cannot be loaded"):
        checkpoint.load(path)
    assert not marker.exists()
    # The same file loaded the unsafe way would have run code: the test above could fail.
    torch.load(path, weights_only=False)
    assert marker.read_text() == "code ran"


def test_load_rejects_a_dict_without_model(tmp_path):
    path = checkpoint.save({"weights": torch.ones(1)}, tmp_path, "checkpoint_epoch_1.pt", epoch=1, step=1)
    with pytest.raises(CheckpointError, match="not an hpctrain checkpoint"):
        checkpoint.load(path)


def test_failed_save_leaves_nothing_behind(tmp_path):
    good = save_at(tmp_path, 1)
    with pytest.raises(Exception):
        checkpoint.save({"model": {}, "x": lambda: 0}, tmp_path, "checkpoint_step_2.pt", epoch=0, step=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([good.name, good.name + ".manifest.json", "latest"])
    assert checkpoint.find_latest(tmp_path).path == good


@pytest.mark.parametrize("name", ["model.pt", "../checkpoint_step_1.pt", "checkpoint_step_x.pt", "checkpoint_epoch_1"])
def test_names_find_latest_would_not_see_are_refused(tmp_path, name):
    with pytest.raises(CheckpointError, match="checkpoint_name"):
        checkpoint.save({"model": {}}, tmp_path / "ckpt", name, epoch=1, step=1)
    assert not (tmp_path / "ckpt").exists() and not (tmp_path / "checkpoint_step_1.pt").exists()


def test_keep_must_be_positive(tmp_path):
    with pytest.raises(CheckpointError, match="pass a keep of 1 or more"):
        save_at(tmp_path, 1, keep=0)
    assert not any(tmp_path.iterdir())
    with pytest.raises(CheckpointError, match="pass a keep of 1 or more"):
        checkpoint.prune(tmp_path, -1)


# ---------------------------------------------------------------- verification failures


def _break(path: Path, how: str) -> None:
    manifest_path = path.parent / (path.name + ".manifest.json")
    if how == "missing manifest":
        manifest_path.unlink()
    elif how == "truncated":
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)
    elif how == "bad checksum":  # same size, one byte different: only the checksum can tell
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    elif how == "unreadable manifest":
        manifest_path.write_text("{not json")
    elif how == "manifest lacks a field":
        data = json.loads(manifest_path.read_text())
        del data["sha256"]
        manifest_path.write_text(json.dumps(data))
    elif how == "newer format":
        data = json.loads(manifest_path.read_text())
        data["format_version"] = checkpoint.FORMAT_VERSION + 1
        manifest_path.write_text(json.dumps(data))
    else:
        raise ValueError(how)


BREAKAGES = {
    "missing manifest": "has no manifest",
    "truncated": "truncated or overwritten",
    "bad checksum": "fails its checksum",
    "unreadable manifest": "is unreadable",
    "manifest lacks a field": "lacks a field",
    "newer format": "upgrade hpctrain",
}


@pytest.mark.parametrize("how", list(BREAKAGES))
def test_verify_and_load_refuse_a_broken_checkpoint(tmp_path, how):
    path = save_at(tmp_path, 5)
    _break(path, how)
    with pytest.raises(CheckpointError, match=BREAKAGES[how]):
        checkpoint.verify(path)
    with pytest.raises(CheckpointError, match=BREAKAGES[how]):
        checkpoint.load(path)


def test_load_of_a_missing_path_names_the_fix(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint at .*drop it to resume from the newest one"):
        checkpoint.load(tmp_path / "checkpoint_epoch_9.pt")


@pytest.mark.parametrize("how", ["missing manifest", "truncated", "bad checksum", "unreadable manifest"])
def test_newest_broken_checkpoint_is_skipped_with_a_warning(tmp_path, how, caplog):
    save_at(tmp_path, 100, end_of_epoch=True)
    previous = save_at(tmp_path, 150)
    newest = save_at(tmp_path, 200, end_of_epoch=True)
    _break(newest, how)
    with caplog.at_level(logging.WARNING, logger="hpctrain.checkpoint"):
        info = checkpoint.find_latest(tmp_path)
        state = checkpoint.load_latest(tmp_path)
    assert info.path == previous and info.step == 150
    assert torch.equal(state["model"]["w"], torch.full((4,), 150.0))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all(newest.name in w and BREAKAGES[how] in w for w in warnings)


def test_unloadable_newest_is_skipped_by_load_latest(tmp_path, caplog):
    previous = save_at(tmp_path, 1)
    newest = tmp_path / "checkpoint_step_2.pt"
    checkpoint.save({"model": {}, "x": Malicious(tmp_path / "marker")}, tmp_path, newest.name, epoch=0, step=2)
    with caplog.at_level(logging.WARNING, logger="hpctrain.checkpoint"):
        state = checkpoint.load_latest(tmp_path)
    assert torch.equal(state["model"]["w"], torch.full((4,), 1.0))
    assert "cannot be loaded" in caplog.text and previous.exists()


def test_no_valid_checkpoint(tmp_path):
    assert checkpoint.find_latest(tmp_path / "absent") is None
    assert checkpoint.load_latest(tmp_path / "absent") is None
    path = save_at(tmp_path, 1)
    _break(path, "truncated")
    assert checkpoint.find_latest(tmp_path) is None
    assert checkpoint.load_latest(tmp_path) is None


# ---------------------------------------------------------------- which one is newest, and pruning


def test_epoch_end_sorts_before_a_step_checkpoint_of_the_same_step(tmp_path):
    step_ckpt = save_at(tmp_path, 300)
    epoch_ckpt = save_at(tmp_path, 300, end_of_epoch=True)
    assert checkpoint.candidates(tmp_path) == [epoch_ckpt, step_ckpt]
    assert (tmp_path / "latest").read_text().strip() == epoch_ckpt.name


def test_newest_is_furthest_in_training_whatever_the_clock_said(tmp_path, monkeypatch):
    """Checkpoints written while the clock was an hour fast must not win over later ones (nor get them pruned)."""
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 3600)
    for step in (100, 200):
        save_at(tmp_path, step, keep=2)
    monkeypatch.setattr(time, "time", real_time)  # the clock is put right
    for step in (300, 400):
        save_at(tmp_path, step, keep=2)
    assert checkpoint.find_latest(tmp_path).step == 400
    assert [p.name for p in checkpoint.candidates(tmp_path)] == ["checkpoint_step_400.pt", "checkpoint_step_300.pt"]
    assert torch.equal(checkpoint.load_latest(tmp_path)["model"]["w"], torch.full((4,), 400.0))


def test_newest_ignores_file_times(tmp_path):
    older, newer = save_at(tmp_path, 100), save_at(tmp_path, 200)
    future = time.time() + 86400
    os.utime(older, (future, future))
    os.utime(older.with_name(older.name + ".manifest.json"), (future, future))
    assert checkpoint.candidates(tmp_path) == [newer, older]


def test_rewriting_an_existing_valid_name_replaces_it_and_never_deletes_the_save_just_made(tmp_path):
    for step in (100, 200, 300):
        save_at(tmp_path, step)
    lower = save_at(tmp_path, 150, keep=1)
    assert lower.exists() and checkpoint.find_latest(tmp_path).step == 300
    again = save_at(tmp_path, 300, keep=2, state={"model": {"w": torch.zeros(4)}, "step": 300})
    assert checkpoint.find_latest(tmp_path).path == again
    assert torch.equal(checkpoint.load_latest(tmp_path)["model"]["w"], torch.zeros(4))
    assert (tmp_path / "latest").read_text() == "checkpoint_step_300.pt\n"


@pytest.mark.parametrize("how", ["truncated", "bad checksum", "unreadable manifest"])
def test_a_save_never_overwrites_a_damaged_file_but_moves_it_aside(tmp_path, how):
    damaged = save_at(tmp_path, 5)
    _break(damaged, how)
    evidence = damaged.read_bytes()
    save_at(tmp_path, 5, state={"model": {"w": torch.zeros(4)}})
    aside = tmp_path / "checkpoint_step_5.pt.corrupt"
    assert aside.read_bytes() == evidence
    assert checkpoint.candidates(tmp_path) == [damaged] and checkpoint.find_latest(tmp_path).path == damaged
    save_at(tmp_path, 5, state={"model": {"w": torch.ones(4)}})  # a valid one is simply replaced
    assert not (tmp_path / "checkpoint_step_5.pt.corrupt.1").exists()


def test_save_keeps_the_newest_k(tmp_path):
    for step in range(1, 8):
        save_at(tmp_path, step, keep=3)
    assert [p.name for p in checkpoint.candidates(tmp_path)] == [f"checkpoint_step_{s}.pt" for s in (7, 6, 5)]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".manifest.json")) == [
        f"checkpoint_step_{s}.pt.manifest.json" for s in (5, 6, 7)
    ]


def test_prune_keeps_the_newest_valid_and_never_deletes_damaged_files(tmp_path):
    paths = [save_at(tmp_path, step) for step in (1, 2, 3, 4, 5)]
    _break(paths[4], "truncated")
    _break(paths[3], "missing manifest")
    checkpoint.prune(tmp_path, 1)
    # Kept: the damaged ones (evidence, no slot used) and the newest valid (step 3).
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == [paths[2].name, paths[3].name, paths[4].name]
    assert checkpoint.find_latest(tmp_path).path == paths[2]
    assert torch.equal(checkpoint.load_latest(tmp_path)["model"]["w"], torch.full((4,), 3.0))


def test_saves_cut_short_are_pruned_once_a_valid_checkpoint_is_newer(tmp_path):
    for step in (1, 2, 3):
        save_at(tmp_path, step)
    _break(tmp_path / "checkpoint_step_2.pt", "missing manifest")  # what a kill during its save leaves
    save_at(tmp_path, 4, keep=3)
    assert [p.name for p in checkpoint.candidates(tmp_path)] == [f"checkpoint_step_{s}.pt" for s in (4, 3, 1)]


def test_damaged_files_use_up_no_keep_slots(tmp_path):
    for step in (1, 2, 3):
        save_at(tmp_path, step)
    _break(tmp_path / "checkpoint_step_3.pt", "truncated")
    _break(tmp_path / "checkpoint_step_2.pt", "unreadable manifest")
    save_at(tmp_path, 4, keep=2)
    # keep=2 valid ones: step 4 and step 1; the damaged 2 and 3 stay, untouched.
    assert [p.name for p in checkpoint.candidates(tmp_path)] == [f"checkpoint_step_{s}.pt" for s in (4, 3, 2, 1)]
    for step in (5, 6):
        save_at(tmp_path, step, keep=2)
    assert [p.name for p in checkpoint.candidates(tmp_path)] == [f"checkpoint_step_{s}.pt" for s in (6, 5, 3, 2)]


def test_search_reports_every_rejected_file_with_its_reason(tmp_path):
    for step in (1, 2, 3):
        save_at(tmp_path, step)
    _break(tmp_path / "checkpoint_step_3.pt", "truncated")
    _break(tmp_path / "checkpoint_step_2.pt", "missing manifest")
    found = checkpoint.search(tmp_path)
    assert found.info.step == 1 and torch.equal(found.state["model"]["w"], torch.full((4,), 1.0))
    assert [(r.path.name, r.unfinished) for r in found.rejected] == [
        ("checkpoint_step_3.pt", False),
        ("checkpoint_step_2.pt", True),
    ]
    assert "truncated" in found.rejected[0].reason and "did not finish" in found.rejected[1].reason
    assert all(str(tmp_path) not in r.reason for r in found.rejected)


# ---------------------------------------------------------------- messages


def test_the_latest_pointer_is_named_for_what_it_is(tmp_path):
    save_at(tmp_path, 1)
    with pytest.raises(CheckpointError, match="is the pointer to the newest checkpoint.*pass its directory"):
        checkpoint.load(tmp_path / "latest")


def test_an_empty_file_is_called_empty(tmp_path):
    (tmp_path / "checkpoint_step_1.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"is empty \(0 bytes\)"):
        checkpoint.load(tmp_path / "checkpoint_step_1.pt")
    # Even with a manifest that matches it (the checksum of nothing), it is called empty, not "cannot be loaded ()".
    path = checkpoint.save({"model": {}}, tmp_path, "checkpoint_step_2.pt", epoch=0, step=2)
    path.write_bytes(b"")
    with pytest.raises(CheckpointError, match="is empty"):
        checkpoint.load(path)


def test_a_file_that_is_not_a_checkpoint_is_not_called_an_unfinished_save(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    with pytest.raises(CheckpointError, match="is not an hpctrain checkpoint") as caught:
        checkpoint.load(other)
    assert "did not finish" not in str(caught.value)


def test_refusing_unsafe_contents_never_suggests_weights_only_false(tmp_path):
    path = checkpoint.save(
        {"model": {}, "x": Malicious(tmp_path / "m")}, tmp_path, "checkpoint_step_1.pt", epoch=0, step=1
    )
    with pytest.raises(CheckpointError) as caught:
        checkpoint.load(path)
    message = str(caught.value)
    assert "weights_only" not in message and "trust" not in message and "\n" not in message
    assert "safe loading refuses" in message and "_run_code" in message


# ---------------------------------------------------------------- temporaries of killed saves


def test_a_checkpoint_or_a_ranks_part_is_never_read_through_a_symbolic_link(tmp_path):
    """A link planted in the checkpoint folder (to a valid checkpoint elsewhere) is refused naming the link, and
    the search passes over it to the newest file that is not one; a rank's part (or its folder) likewise. Before,
    both were verified and loaded through the link, although the README says run files never are."""
    elsewhere = checkpoint.save(make_state(7), tmp_path / "elsewhere", "checkpoint_epoch_9.pt", epoch=9, step=900)
    ckpt = tmp_path / "run" / "checkpoints"
    save_at(ckpt, 100, end_of_epoch=True)
    planted = ckpt / "checkpoint_epoch_9.pt"
    planted.symlink_to(elsewhere)
    (ckpt / "checkpoint_epoch_9.pt.manifest.json").write_bytes(
        (elsewhere.parent / "checkpoint_epoch_9.pt.manifest.json").read_bytes()
    )
    with pytest.raises(CheckpointError, match="is a symbolic link") as caught:
        checkpoint.load(planted)
    assert str(planted) in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(CheckpointError, match="is a symbolic link"):
        checkpoint.verify(planted)
    found = checkpoint.search(ckpt)
    assert found.info.path == ckpt / "checkpoint_epoch_1.pt" and found.state["step"] == 100
    assert [(r.path, r.reason.split(":")[0]) for r in found.rejected] == [(planted, "is a symbolic link")]
    # a rank's part, and the parts' folder
    source = ckpt / "checkpoint_epoch_1.pt"
    real_part = checkpoint.save_part(tmp_path / "elsewhere" / "checkpoint_epoch_1.pt", 0, {"loss_sum": 1.0})
    folder = checkpoint.rank_dir(source)
    folder.mkdir()
    (folder / "rank-0.pt").symlink_to(real_part)
    with pytest.raises(CheckpointError, match="symbolic link") as caught:
        checkpoint.load_part(folder, 0)
    assert str(folder / "rank-0.pt") in str(caught.value)
    (folder / "rank-0.pt").unlink()
    folder.rmdir()
    folder.symlink_to(real_part.parent)
    with pytest.raises(CheckpointError, match="symbolic link"):
        checkpoint.load_part(folder, 0)
    assert checkpoint.load_part(real_part.parent, 0) == {"loss_sum": 1.0}  # the file itself, reached directly


def test_the_bytes_loaded_are_the_bytes_verified(tmp_path, monkeypatch):
    """A file renamed into a checkpoint's place between its check and its load is not what gets loaded (one
    descriptor serves both); a checkpoint changed in place meanwhile is refused. Before, verify and torch.load each
    opened the path: the swapped-in file was loaded unverified."""
    from hpctrain.checkpoint import files

    good = save_at(tmp_path / "ckpt", 100, end_of_epoch=True)
    evil = tmp_path / "evil.pt"
    torch.save({"model": {"w": torch.full((4,), -1.0)}, "step": -1}, evil)
    real_load = torch.load

    def swapping_load(source, *args, **kwargs):  # the last moment before the load: verified, not yet read
        os.replace(evil, good)
        return real_load(source, *args, **kwargs)

    monkeypatch.setattr(files.torch, "load", swapping_load)
    state = checkpoint.load(good)
    assert state["step"] == 100 and torch.equal(state["model"]["w"], torch.full((4,), 100.0))
    assert checkpoint.search(tmp_path / "ckpt").rejected  # what lies there now fails its checksum

    rewritten = save_at(tmp_path / "again", 200, end_of_epoch=True)

    def rewriting_load(source, *args, **kwargs):  # another process writes the same file in place meanwhile
        loaded = real_load(source, *args, **kwargs)
        with open(rewritten, "r+b") as handle:
            handle.write(handle.read(1))
            time.sleep(0.01)  # a later mtime even on a coarse clock
        return loaded

    monkeypatch.setattr(files.torch, "load", rewriting_load)
    with pytest.raises(CheckpointError, match="changed while it was being read"):
        checkpoint.load(rewritten)


def test_stale_temporaries_are_removed_but_live_ones_kept(tmp_path):
    host = writing._HOST
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # a process that has exited
    live_pid = os.getppid()
    names = {
        "dead": f".checkpoint_step_1.pt.tmp-{host}-{dead_pid}-1",
        "live": f".checkpoint_step_1.pt.tmp-{host}-{live_pid}-1",
        "foreign-recent": ".checkpoint_step_1.pt.tmp-othernode-1-1",
        "foreign-old": ".checkpoint_step_1.pt.tmp-othernode-2-1",
        "not-ours": ".something.tmp-unrelated",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"partial")
    old = time.time() - checkpoint.FOREIGN_TEMPORARY_MAX_AGE_S - 60
    os.utime(tmp_path / names["foreign-old"], (old, old))
    save_at(tmp_path, 2)
    left = {p.name for p in tmp_path.iterdir() if p.name.startswith(".")}
    assert left == {names["live"], names["foreign-recent"], names["not-ours"]}
    assert socket.gethostname()  # the host part really comes from this machine's name


def test_temporaries_never_count_as_checkpoints(tmp_path):
    path = save_at(tmp_path, 1)
    (tmp_path / f".checkpoint_step_9.pt.tmp-{writing._HOST}-{os.getpid()}-1").write_bytes(path.read_bytes())
    assert checkpoint.candidates(tmp_path) == [path]
