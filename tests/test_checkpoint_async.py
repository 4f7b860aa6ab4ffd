"""AsyncCheckpointer: training may go on (and change its tensors in place) while the write runs.

The writer is held back with an event where a test needs the write to be in flight, so nothing depends on
timing. The CUDA copy path (pinned memory, non-blocking copies) cannot run on this CPU-only machine.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import threading
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

from hpctrain import checkpoint
from hpctrain.checkpoint import AsyncCheckpointer, CheckpointError, background


@pytest.fixture
def held_writer(monkeypatch):
    """Makes background writes wait for `release.set()`; `started` lists the names whose write began."""
    release = threading.Event()
    started: list[str] = []
    real_save = checkpoint.save

    def held_save(state, directory, name, **kwargs):
        started.append(name)
        if not release.wait(timeout=60):
            raise RuntimeError("test never released the writer")
        return real_save(state, directory, name, **kwargs)

    monkeypatch.setattr(background, "save", held_save)  # the function AsyncCheckpointer calls
    yield release, started
    release.set()


def train_steps(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(16, 10)).square().mean().backward()
        optimizer.step()


def clone_state(state):
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}


def in_flight(writer: AsyncCheckpointer) -> bool:
    """Whether the writer's background write has not finished yet."""
    return writer._future is not None and not writer._future.done()


def test_training_continues_while_the_write_is_in_flight(tmp_path, held_writer):
    release, started = held_writer
    torch.manual_seed(0)
    model = nn.Linear(10, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_steps(model, optimizer, 3)
    expected_model = clone_state(model.state_dict())
    expected_momentum = optimizer.state_dict()["state"][0]["momentum_buffer"].clone()

    with AsyncCheckpointer() as writer:
        path = writer.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 3},
            tmp_path,
            "checkpoint_step_3.pt",
            epoch=0,
            step=3,
        )
        assert in_flight(writer) and started == ["checkpoint_step_3.pt"]
        assert not path.exists()
        train_steps(model, optimizer, 5)  # in-place updates of the very tensors being saved
        assert not torch.equal(model.weight, expected_model["weight"])
        release.set()
        assert writer.wait() == path
        assert not in_flight(writer)

    state = checkpoint.load(path)
    assert torch.equal(state["model"]["weight"], expected_model["weight"])
    assert torch.equal(state["model"]["bias"], expected_model["bias"])
    assert torch.equal(state["optimizer"]["state"][0]["momentum_buffer"], expected_momentum)
    assert checkpoint.find_latest(tmp_path).step == 3


def test_at_most_one_write_in_flight(tmp_path, held_writer):
    release, started = held_writer
    writer = AsyncCheckpointer()
    writer.save({"model": {"w": torch.ones(2)}}, tmp_path, "checkpoint_step_1.pt", epoch=0, step=1)
    second_returned = threading.Event()

    def second() -> None:
        writer.save({"model": {"w": torch.full((2,), 2.0)}}, tmp_path, "checkpoint_step_2.pt", epoch=0, step=2)
        second_returned.set()

    thread = threading.Thread(target=second)
    thread.start()
    assert not second_returned.wait(timeout=0.5)  # blocked behind the first write
    assert started == ["checkpoint_step_1.pt"]
    release.set()
    thread.join(timeout=30)
    assert second_returned.is_set()
    writer.close()
    assert started == ["checkpoint_step_1.pt", "checkpoint_step_2.pt"]
    assert checkpoint.find_latest(tmp_path).step == 2


def test_a_failed_write_surfaces_on_the_next_call(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    writer = AsyncCheckpointer()
    writer.save({"model": {}}, blocker, "checkpoint_step_1.pt", epoch=0, step=1)  # fails in the background
    with pytest.raises(CheckpointError, match="in the background failed.*check free space and permissions"):
        writer.save({"model": {}}, tmp_path, "checkpoint_step_2.pt", epoch=0, step=2)
    assert not (tmp_path / "checkpoint_step_2.pt").exists()  # the call that reported the error saved nothing
    # Reported once; the writer keeps working afterwards.
    writer.save({"model": {}}, tmp_path, "checkpoint_step_3.pt", epoch=0, step=3)
    assert writer.wait() == tmp_path / "checkpoint_step_3.pt"
    writer.save({"model": {}}, blocker, "checkpoint_step_4.pt", epoch=0, step=4)
    with pytest.raises(CheckpointError, match="checkpoint_step_4.pt"):
        writer.wait()
    writer.close()


def test_keep_is_checked_before_copying(tmp_path):
    with AsyncCheckpointer() as writer, pytest.raises(CheckpointError, match="keep of 1 or more"):
        writer.save({"model": {}}, tmp_path, "checkpoint_step_1.pt", epoch=0, step=1, keep=0)


def test_async_saves_prune_like_sync_ones(tmp_path):
    with AsyncCheckpointer() as writer:
        for step in range(1, 6):
            writer.save(
                {"model": {"w": torch.full((3,), float(step))}},
                tmp_path,
                checkpoint.checkpoint_name(0, step, False),
                epoch=0,
                step=step,
                keep=2,
            )
    assert [p.name for p in checkpoint.candidates(tmp_path)] == ["checkpoint_step_5.pt", "checkpoint_step_4.pt"]
    assert torch.equal(checkpoint.load_latest(tmp_path)["model"]["w"], torch.full((3,), 5.0))


Pair = collections.namedtuple("Pair", "a b")


def test_snapshot_copies_everything_and_keeps_sharing():
    shared = torch.arange(6.0)
    rng = np.random.default_rng(0).bit_generator.state  # nested dicts of ints
    state = collections.OrderedDict(
        w=shared,
        tied=shared,
        view=shared[2:4],
        pair=Pair(torch.ones(2), [torch.zeros(1), 3]),
        numpy=np.arange(3),
        rng=rng,
        text="x",
        none=None,
    )
    copied = checkpoint.snapshot(state)
    assert type(copied) is collections.OrderedDict and list(copied) == list(state)
    assert copied["w"] is copied["tied"]  # shared before, shared after
    assert copied["w"].data_ptr() != shared.data_ptr()
    assert isinstance(copied["pair"], Pair) and torch.equal(copied["pair"].a, torch.ones(2))
    assert copied["view"].tolist() == [2.0, 3.0] and copied["view"].untyped_storage().nbytes() == 8
    shared.add_(100)
    state["numpy"][0] = 99
    rng["state"]["state"] = 0
    assert copied["w"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert copied["numpy"].tolist() == [0, 1, 2]
    assert copied["rng"]["state"]["state"] != 0


def test_pending_write_completes_when_the_interpreter_exits(tmp_path):
    """A script that forgets wait(): the write still finishes (the worker thread is joined at exit)."""
    script = textwrap.dedent(
        f"""
        import torch
        from hpctrain.checkpoint import AsyncCheckpointer
        writer = AsyncCheckpointer()
        writer.save({{"model": {{"w": torch.ones(2_000_000)}}}}, {str(tmp_path)!r}, "checkpoint_step_7.pt",
                    epoch=0, step=7)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    state = checkpoint.load(tmp_path / "checkpoint_step_7.pt")
    assert torch.equal(state["model"]["w"], torch.ones(2_000_000))
