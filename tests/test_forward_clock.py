"""The forward-pass clock (hpctrain.training.watch.ForwardClock) under DataParallel, whose replicas run the model's
forward hooks in threads of their own at the same time (torch's replicas share the module's hook dictionaries).

Real threads and a real module; the clock's `time.perf_counter` is replaced by a value the test sets, so the
order of events, not their timing, decides what is measured (no GPU here: DataParallel on the CPU runs no threads,
so the threads are started by the test as parallel_apply starts them)."""

from __future__ import annotations

import threading

import torch
from torch import nn

from hpctrain.training import watch


class Gate(nn.Module):
    """Waits inside forward until the test lets the calling thread go on."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = {name: threading.Event() for name in ("a", "b")}
        self.go = {name: threading.Event() for name in ("a", "b")}

    def forward(self, x: torch.Tensor, name: str) -> torch.Tensor:
        self.inside[name].set()
        assert self.go[name].wait(10)
        return x


def test_concurrent_replicas_count_as_the_slowest_replica_not_a_mix_of_two(monkeypatch) -> None:
    now = [0.0]
    monkeypatch.setattr(watch.time, "perf_counter", lambda: now[0])
    model = Gate()
    clock = watch.ForwardClock(model, torch.device("cpu"))
    threads = {name: threading.Thread(target=model, args=(torch.zeros(1), name)) for name in ("a", "b")}

    threads["a"].start()  # replica a enters at t = 0
    assert model.inside["a"].wait(10)
    now[0] = 10.0
    threads["b"].start()  # replica b enters at t = 10, while a is still inside
    assert model.inside["b"].wait(10)
    now[0] = 15.0
    model.go["a"].set()  # a leaves at t = 15: it took 15 s
    threads["a"].join(10)
    now[0] = 20.0
    model.go["b"].set()  # b leaves at t = 20: it took 10 s
    threads["b"].join(10)

    # The pass took as long as its slowest replica, 15 s. Without a per-thread start under a lock, b's start
    # overwrote a's and the clock read 5 s (a's end minus b's start), then 10 s.
    assert clock.read() == 15.0
    clock.remove()


class Takes(nn.Module):
    """A forward pass that takes `seconds` of the test's clock."""

    def __init__(self, now: list[float]) -> None:
        super().__init__()
        self.now, self.seconds = now, 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.now[0] += self.seconds
        return x


def test_in_one_thread_each_forward_pass_is_timed_and_one_that_raised_is_forgotten(monkeypatch) -> None:
    now = [100.0]
    monkeypatch.setattr(watch.time, "perf_counter", lambda: now[0])
    model = Takes(now)
    clock = watch.ForwardClock(model, torch.device("cpu"))
    for seconds in (2.0, 3.0):
        model.seconds = seconds
        model(torch.zeros(1))
        assert clock.read() == seconds
    model.seconds = "not a number"
    try:
        model(torch.zeros(1))  # raises inside forward: the end hook never runs
    except TypeError:
        pass
    model.seconds = 4.0
    model(torch.zeros(1))
    assert clock.read() == 4.0
    clock.remove()
