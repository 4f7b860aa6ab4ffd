"""GPU decoding on a CUDA stream of its own, ordered with the training stream by events.

Batched nvJPEG decoding (torchvision's `decode_jpeg(list, device="cuda")`) must not run while kernels of the
training step are still queued on the same device: the hardware JPEG engine of A100/H100-class GPUs does not honour
the stream it is given, and has been reported to corrupt unrelated memory (pytorch/vision#9606, torchcodec#1634).
So each batch is decoded on a decode stream that first waits for an event recorded on the training stream after the
previous step's kernels, and the training stream waits for the decode's own event before it uses the batch. The host
never blocks: it queues the decode and goes on (reading and Huffman-decoding on the host overlap the GPU's step),
and the batch's memory, allocated on the decode stream, is marked as used by the training stream so the caching
allocator does not hand it out again while the step still reads it.

`CudaLayer` is what this needs of torch.cuda; the tests replace it with a recorder (no GPU in CI) and check the
order of the calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class CudaLayer:
    """The few torch.cuda calls `DecodeStream` makes (a seam for the tests)."""

    def __init__(self) -> None:
        import torch

        self.cuda = torch.cuda

    def current_stream(self, device: Any) -> Any:
        return self.cuda.current_stream(device)

    def new_stream(self, device: Any) -> Any:
        return self.cuda.Stream(device)

    def new_event(self) -> Any:
        return self.cuda.Event()

    def use(self, stream: Any) -> contextlib.AbstractContextManager:
        return self.cuda.stream(stream)


class DecodeStream:
    """`with decode.batch() as used: images = <decode on the device>; used(images)`: the decode runs on a stream of
    its own after the training stream's queued work, and the training stream waits for it before it reads `images`
    (the tensors named to `used`)."""

    def __init__(self, device: Any, layer: CudaLayer | None = None) -> None:
        self.layer = layer or CudaLayer()
        self.training = self.layer.current_stream(device)
        self.stream = self.layer.new_stream(device)

    @contextlib.contextmanager
    def batch(self) -> Iterator[Any]:
        after_step = self.layer.new_event()
        after_step.record(self.training)  # after the previous step's kernels (all the training stream has queued)
        self.stream.wait_event(after_step)
        used: list[Any] = []
        with self.layer.use(self.stream):
            yield lambda *tensors: used.extend(tensors)
        decoded = self.layer.new_event()
        decoded.record(self.stream)
        self.training.wait_event(decoded)  # the step that uses the batch starts after its decode
        for tensor in used:
            tensor.record_stream(self.training)


__all__ = ["CudaLayer", "DecodeStream"]
