"""Each rank's own part of a job's checkpoint (random streams, loss sum, threads), beside the checkpoint (issue 32):
the previous format still resumes, a damaged or missing part is refused naming its file, the mean loss sum serves
a resume at another world size, and pruning takes a checkpoint's parts with it. What a save and a resume cost each
rank at 2 and 4 real gloo processes is counted in tests/test_scale_ranks.py.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hpctrain import checkpoint
from hpctrain.training import loop_state as checkpoints, rng
from hpctrain.training.run import Position


def test_a_checkpoint_of_the_previous_format_gives_each_rank_its_part_from_the_file() -> None:
    """Before the parts had files of their own, a job's checkpoint held every rank's state in "ranks", a list; such
    a checkpoint still resumes, at its own world size or another."""
    parts = [{"rng": rng.capture(), "loss_sum": float(r), "threads": 1} for r in range(2)]
    state = {"ranks": parts}
    assert checkpoints.saved_part(state, 1) == (parts[1], 2)
    assert checkpoints.saved_part(state, 2) == (parts[0], 2)  # 3 ranks resuming 2 ranks' checkpoint
    checkpoints.load_own_part(state, Path("/nonexistent/checkpoint_step_1.pt"), 1)  # nothing to load: no file read
    assert "own_part" not in state


def test_a_missing_or_damaged_part_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint_step_3.pt"
    checkpoint.save_part(path, 0, {"rng": rng.capture(), "loss_sum": 1.0, "threads": 1})
    state = {"ranks": {"parts": path.name + ".ranks", "world_size": 2, "loss_sum_mean": 1.0}}
    checkpoints.load_own_part(state, path, 0)
    assert state["own_part"]["loss_sum"] == 1.0
    with pytest.raises(checkpoint.CheckpointError, match=r"rank 1's part of the checkpoint, .*rank-1.pt, is missing"):
        checkpoints.load_own_part(state, path, 1)
    part = checkpoint.part_path(checkpoint.rank_dir(path), 0)
    data = bytearray(part.read_bytes())
    data[-10] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match="rank-0.pt fails its checksum: corrupt; resume from an"):
        checkpoints.load_own_part(state, path, 2)


def test_restore_takes_the_mean_loss_sum_when_the_world_changed() -> None:
    part = {"rng": rng.capture(), "loss_sum": 5.0, "threads": 1}
    state = {
        "ranks": {"parts": "x.ranks", "world_size": 4, "loss_sum_mean": 2.5},
        "own_part": part,
        "epoch": 0,
        "step": 3,
        "step_in_epoch": 3,
        "epoch_train_seconds": 1.0,
    }
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state.update(
        model=model.state_dict(),
        optimizer=optimizer.state_dict(),
        scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 1).state_dict(),
    )
    optimization = SimpleNamespace(
        optimizer=optimizer, scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 1), scaler=None
    )
    for world, expected in ((4, 5.0), (2, 2.5)):
        run = SimpleNamespace(env=SimpleNamespace(rank=1, world_size=world), is_main=False)
        position = checkpoints.restore(run, model, optimization, state)
        assert position == Position(0, 3, 3, 1.0, expected, -1.0)


def test_pruning_removes_a_checkpoints_parts_unless_the_best_copy_uses_them(tmp_path: Path) -> None:
    def save(step: int, best: bool = False) -> Path:
        path = tmp_path / f"checkpoint_step_{step}.pt"
        checkpoint.save_part(path, 0, {"loss_sum": float(step)})
        checkpoint.save({"model": {}}, tmp_path, path.name, epoch=0, step=step, keep=1)
        if best:
            checkpoint.copy_checkpoint(path, tmp_path / checkpoint.BEST_NAME)
        return path

    def folders() -> list[str]:
        return sorted(p.name for p in tmp_path.glob("*.ranks"))

    save(1, best=True)
    save(2)
    assert folders() == ["checkpoint_step_1.pt.ranks", "checkpoint_step_2.pt.ranks"]  # step 1's: the best copy's
    save(3, best=True)  # the best copy moves on: step 1's parts have no user left
    assert folders() == ["checkpoint_step_3.pt.ranks"]
    best = checkpoint.load(tmp_path / checkpoint.BEST_NAME)
    assert best == {"model": {}}
    assert checkpoint.load_part(checkpoint.rank_dir(tmp_path / "checkpoint_step_3.pt"), 0) == {"loss_sum": 3.0}
    save(4)
    assert folders() == ["checkpoint_step_3.pt.ranks", "checkpoint_step_4.pt.ranks"]


def test_pruning_takes_the_parts_of_a_save_that_never_finished(tmp_path: Path) -> None:
    """A kill after the ranks wrote their parts but before rank 0's manifest: the file and its parts both go once a
    newer checkpoint is kept."""
    cut = tmp_path / "checkpoint_step_1.pt"
    checkpoint.save_part(cut, 0, {"loss_sum": 1.0})
    cut.write_bytes(b"half a checkpoint")  # no manifest: a save cut short
    path = tmp_path / "checkpoint_step_2.pt"
    checkpoint.save_part(path, 0, {"loss_sum": 2.0})
    checkpoint.save({"model": {}}, tmp_path, path.name, epoch=0, step=2, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "checkpoint_step_2.pt",
        "checkpoint_step_2.pt.manifest.json",
        "checkpoint_step_2.pt.ranks",
        "latest",
    ]
