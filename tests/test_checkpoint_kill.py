"""SIGKILL at random moments while a process saves checkpoints back to back: a valid one must always remain.

The saving process is forked from the test process (torch is already imported there, so each of the many
rounds costs milliseconds instead of a fresh interpreter), then killed with SIGKILL after a random delay.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
import torch

from hpctrain import checkpoint

ROUNDS = 30
PAYLOAD_FLOATS = 1 << 20  # 4 MB, so a kill often lands inside torch.save, the fsync or the hashing


def _saver(directory: str, ready_fd: int, payload: torch.Tensor, background: bool) -> None:
    """Runs in the forked child until it is killed: resume from the newest valid checkpoint, then save on."""
    # OpenMP's thread pool does not survive fork (a parallel copy would hang): stay single-threaded here.
    torch.set_num_threads(1)
    state = checkpoint.load_latest(directory)
    step = state["step"]
    writer = checkpoint.AsyncCheckpointer() if background else None
    os.write(ready_fd, b"r")
    while True:
        step += 1
        new = {"model": {"payload": payload, "step_tensor": torch.full((8,), float(step))}, "step": step}
        for end_of_epoch in (False, True) if step % 4 == 0 else (False,):
            name = checkpoint.checkpoint_name(step // 4, step, end_of_epoch)
            if writer is None:
                checkpoint.save(new, directory, name, epoch=step // 4, step=step, keep=3)
            else:
                writer.save(new, directory, name, epoch=step // 4, step=step, keep=3)
        os.write(ready_fd, b"s")  # a save call returned (the async writer's previous save is then done)


def _debris(directory) -> bool:
    """Did the kill interrupt a save (a temporary, or a checkpoint without its manifest, is left)?"""
    names = {p.name for p in directory.iterdir()}
    return any(n.startswith(".") for n in names) or any(
        n.endswith(".pt") and n + ".manifest.json" not in names for n in names
    )


@pytest.mark.slow
@pytest.mark.parametrize("background", [False, True], ids=["sync", "async"])
def test_sigkill_during_saves_always_leaves_a_valid_checkpoint(tmp_path, background):
    rng = random.Random(1234)
    payload = torch.randn(PAYLOAD_FLOATS, generator=torch.Generator().manual_seed(0))
    checkpoint.save(
        {"model": {"payload": payload, "step_tensor": torch.zeros(8)}, "step": 0},
        tmp_path,
        checkpoint.checkpoint_name(0, 0, False),
        epoch=0,
        step=0,
    )
    last_step, interrupted_saves, unpruned_rounds = 0, 0, 0
    for round_ in range(ROUNDS):
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: never return into pytest
            try:
                os.close(ready_r)
                _saver(str(tmp_path), ready_w, payload, background)
            finally:
                os._exit(1)
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"r", "the saving process failed to start"
        # Two save calls back: each round moves the newest checkpoint on by at least one step however loaded the
        # machine is (a fixed sleep alone let a slow child be killed before any save); then a kill at random.
        assert os.read(ready_r, 1) + os.read(ready_r, 1) == b"ss", "the saving process stopped saving"
        time.sleep(rng.uniform(0.0, 0.25))
        os.kill(pid, signal.SIGKILL)
        os.close(ready_r)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"round {round_}: child exited early"

        interrupted_saves += _debris(tmp_path)
        info = checkpoint.find_latest(tmp_path)
        assert info is not None, f"round {round_}: no valid checkpoint left"
        state = checkpoint.load(info.path)
        assert state["step"] == info.step
        assert torch.equal(state["model"]["step_tensor"], torch.full((8,), float(info.step)))
        assert torch.equal(state["model"]["payload"], payload)
        assert info.step >= last_step, f"round {round_}: went back from step {last_step} to {info.step}"
        # Pruning keeps up. A child that got two saves further had run its first save's prune to the end: then
        # at most the newest save (killed before its own prune) and a killed save's file exceed `keep`. A child
        # killed before its second save may have been killed between its one save and that save's prune (the
        # fsyncs of the `latest` pointer and the folder lie there, slow on a loaded disk): one more file each
        # such round in a row, until a child prunes again.
        unpruned_rounds = unpruned_rounds + 1 if info.step - last_step < 2 else 0
        last_step = info.step
        assert len(checkpoint.candidates(tmp_path)) <= 3 + 2 + unpruned_rounds

    assert last_step >= ROUNDS  # the children really saved, round after round
    assert interrupted_saves > 0  # and kills did land in the middle of saves
    # The next save clears the dead writers' temporaries.
    checkpoint.save(
        {"model": {}, "step": last_step + 1},
        tmp_path,
        checkpoint.checkpoint_name(0, last_step + 1, False),
        epoch=(last_step + 1) // 4,
        step=last_step + 1,
        keep=3,
    )
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert len(checkpoint.candidates(tmp_path)) == 3  # and prunes back to `keep`, however many kills left extra
