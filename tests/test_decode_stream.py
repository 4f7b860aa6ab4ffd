"""The nvjpeg backend's ordering of GPU decoding with the training step (hpctrain.data.backends.streams).

No GPU in CI: torch.cuda is replaced by a recorder (`Recorder`, standing in for `streams.CudaLayer`: streams,
events, the stream context) that logs every call in order; what is checked is the order. tests/test_gpu.py runs the
real thing on a GPU and compares its pixels with the CPU decoder's."""

from __future__ import annotations

import contextlib

import torch

from hpctrain.data.backends import nvjpeg, streams
from hpctrain.data.loader import Batch


class Recorder:
    def __init__(self) -> None:
        self.log: list[str] = []
        self.current = "training"
        self.events = 0

    def current_stream(self, device):
        return Stream(self, "training")

    def new_stream(self, device):
        return Stream(self, "decode")

    def new_event(self):
        self.events += 1
        return Event(self, f"event{self.events}")

    @contextlib.contextmanager
    def use(self, stream):
        before, self.current = self.current, stream.name
        self.log.append(f"enter {stream.name}")
        yield
        self.log.append(f"leave {stream.name}")
        self.current = before


class Stream:
    def __init__(self, recorder: Recorder, name: str) -> None:
        self.recorder, self.name = recorder, name

    def wait_event(self, event: Event) -> None:
        self.recorder.log.append(f"{self.name} waits {event.name}")


class Event:
    def __init__(self, recorder: Recorder, name: str) -> None:
        self.recorder, self.name = recorder, name

    def record(self, stream: Stream) -> None:
        self.recorder.log.append(f"{self.name} on {stream.name}")


class Images:
    """A decoded batch's tensor: logs which stream it is marked as used by."""

    def __init__(self, recorder: Recorder, name: str) -> None:
        self.recorder, self.name = recorder, name

    def record_stream(self, stream: Stream) -> None:
        self.recorder.log.append(f"{self.name} used by {stream.name}")


def test_each_batch_is_decoded_on_its_own_stream_between_the_steps(monkeypatch) -> None:
    recorder = Recorder()
    monkeypatch.setattr(nvjpeg, "DecodeStream", lambda device: streams.DecodeStream(device, layer=recorder))

    def decode_batch(batch, dataset, epoch, device):
        recorder.log.append(f"decode {batch} on {recorder.current}")
        return Batch(Images(recorder, f"images{batch}"), torch.zeros(1))

    monkeypatch.setattr(nvjpeg, "decode_batch", decode_batch)
    source = nvjpeg.NvjpegSource.__new__(nvjpeg.NvjpegSource)
    source.device = torch.device("cuda", 0)
    for batch in source._decoded([1, 2], None, [None, None]):
        recorder.log.append(f"step on {batch.images.name}")
    assert recorder.log == [
        "event1 on training",  # after the previous step's kernels
        "decode waits event1",
        "enter decode",
        "decode 1 on decode",
        "leave decode",
        "event2 on decode",
        "training waits event2",  # the step starts after the decode
        "images1 used by training",
        "step on images1",
        "event3 on training",
        "decode waits event3",  # the next decode waits for that step's kernels
        "enter decode",
        "decode 2 on decode",
        "leave decode",
        "event4 on decode",
        "training waits event4",
        "images2 used by training",
        "step on images2",
    ]


def test_on_the_cpu_nothing_is_ordered(monkeypatch) -> None:
    def no_stream(device):
        raise AssertionError("a CPU decode needs no stream")

    monkeypatch.setattr(nvjpeg, "DecodeStream", no_stream)
    monkeypatch.setattr(nvjpeg, "decode_batch", lambda batch, dataset, epoch, device: batch)
    source = nvjpeg.NvjpegSource.__new__(nvjpeg.NvjpegSource)
    source.device = torch.device("cpu")
    assert list(source._decoded([1, 2], None, [None, None])) == [1, 2]
