"""A job's checkpoint costs each rank the same whatever the world size: every rank writes its own part (random
streams, loss sum) beside the checkpoint and reads only its own back (issue 32).

Counted, not timed, with real torch.distributed (gloo, CPU) at 2 and 3 processes: the bytes each rank receives
through collectives while a checkpoint is saved, the size of the checkpoint file rank 0 writes, and the files each
rank opens to get its part back. Before, every rank all-gathered every rank's RNG state (some 15 KB a rank, so
N x 15 KB received by each rank and written into the checkpoint), and each resumed rank found its part in there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hpctrain import checkpoint
from hpctrain.training import checkpoints, rng
from hpctrain.training.run import Position
from training_helpers import clean_environ

WORKER = r"""
import datetime, json, os, sys
from pathlib import Path
from types import SimpleNamespace
import torch, torch.distributed as dist
from hpctrain import checkpoint
from hpctrain.training import checkpoints, rng
from hpctrain.training.run import Position

received = [0]
def counted(function, outputs):
    def call(*args, **kwargs):
        result = function(*args, **kwargs)
        received[0] += sum(t.numel() * t.element_size() for t in outputs(args, kwargs))
        return result
    return call
dist.all_gather = counted(dist.all_gather, lambda a, k: a[0])
dist.all_reduce = counted(dist.all_reduce, lambda a, k: [a[0]])
dist.broadcast = counted(dist.broadcast, lambda a, k: [a[0]])

run_dir, rank, size = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo", store=dist.FileStore(str(run_dir / "store"), size), rank=rank, world_size=size,
                        timeout=datetime.timedelta(seconds=60))
torch.manual_seed(rank)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
optimization = SimpleNamespace(optimizer=optimizer, scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 1),
                               scaler=None)
run = SimpleNamespace(env=SimpleNamespace(rank=rank, world_size=size, is_distributed=True), is_main=rank == 0,
                      lock=None, run_dir=run_dir, writer=None,
                      cfg=SimpleNamespace(to_dict=lambda: {}, keep_checkpoints=None))
position = Position(epoch=0, step=7, step_in_epoch=7, loss_sum=float(rank + 1))
torch.rand(3)  # this rank's streams somewhere of their own
saved_rng = rng.capture()
checkpoints.save(run, SimpleNamespace(model=model, optimization=optimization), position, end_of_epoch=False)
path = run_dir / "checkpoints" / "checkpoint_step_7.pt"

state = checkpoint.load(path)
opened = []
real_open = os.open
def counting_open(file, *args, **kwargs):
    opened.append(os.fspath(file))
    return real_open(file, *args, **kwargs)
os.open = counting_open
checkpoints.load_own_part(state, path, rank)
os.open = real_open
part, saved = checkpoints.saved_part(state, rank)
torch.rand(5)
rng.restore(part["rng"])
print(json.dumps({"received": received[0], "size": path.stat().st_size, "opened": [Path(f).name for f in opened],
                  "saved": saved, "loss_sum": part["loss_sum"], "mean": state["ranks"]["loss_sum_mean"],
                  "rng_back": torch.equal(rng.capture()["torch"], saved_rng["torch"])}))
dist.destroy_process_group()
"""


def run_ranks(folder: Path, size: int) -> list[dict]:
    folder.mkdir(parents=True)
    script = folder / "worker.py"
    script.write_text(WORKER)
    procs = [subprocess.Popen([sys.executable, str(script), str(folder), str(rank), str(size)], env=clean_environ(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(size)]
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


@pytest.mark.slow
def test_each_rank_saves_and_reads_only_its_own_part_at_any_world_size(tmp_path: Path) -> None:
    by_size = {size: run_ranks(tmp_path / str(size), size) for size in (2, 3)}
    for size, results in by_size.items():
        for rank, result in enumerate(results):
            assert result["opened"] == [f"rank-{rank}.pt"], result  # its own part, one file
            assert (result["saved"], result["loss_sum"], result["rng_back"]) == (size, rank + 1.0, True)
            assert result["mean"] == sum(range(1, size + 1)) / size
        assert sorted(p.name for p in (tmp_path / str(size) / "checkpoints" / "checkpoint_step_7.pt.ranks").iterdir()
                      ) == [f"rank-{r}.pt" for r in range(size)]
    # What a checkpoint's save brings each rank (a vote of three numbers; before: every rank's RNG state, some
    # 15 KB a rank) and rank 0's checkpoint file (before: every rank's state in it) do not grow with the world.
    received = {size: {r["received"] for r in results} for size, results in by_size.items()}
    assert received[2] == received[3] and max(received[3]) < 1024, received
    assert by_size[2][0]["size"] == by_size[3][0]["size"], "the checkpoint file grew with the world"


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
    state = {"ranks": {"parts": "x.ranks", "world_size": 4, "loss_sum_mean": 2.5}, "own_part": part,
             "epoch": 0, "step": 3, "step_in_epoch": 3, "epoch_train_seconds": 1.0}
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state.update(model=model.state_dict(), optimizer=optimizer.state_dict(),
                 scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 1).state_dict())
    optimization = SimpleNamespace(optimizer=optimizer, scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 1),
                                   scaler=None)
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
