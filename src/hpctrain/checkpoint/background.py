"""Saving in the background: `AsyncCheckpointer` writes with `save` in a thread while training goes on.

`snapshot` first copies the state off the device (training may change its tensors in place right after), so
training pauses only for that copy; at most one write is in flight.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from hpctrain.checkpoint.files import CheckpointError
from hpctrain.checkpoint.writing import check_arguments, copy_checkpoint, save


def snapshot(state: Any) -> Any:
    """A copy of `state` that training cannot change any more: every tensor copied to CPU memory, containers
    rebuilt, other values deep-copied. Tensors shared inside `state` stay shared in the copy."""
    memo: dict[int, torch.Tensor] = {}
    pending_device_copies = [False]
    copied = _snapshot(state, memo, pending_device_copies)
    if pending_device_copies[0]:
        torch.cuda.synchronize()  # the non-blocking device-to-host copies must land before anyone reads them
    return copied


def _snapshot(value: Any, memo: dict[int, torch.Tensor], pending: list[bool]) -> Any:
    if isinstance(value, torch.Tensor):
        key = id(value)
        if key not in memo:
            memo[key] = _copy_to_cpu(value.detach(), pending)
        return memo[key]
    if isinstance(value, OrderedDict):
        return OrderedDict((k, _snapshot(v, memo, pending)) for k, v in value.items())
    if isinstance(value, dict):
        return {k: _snapshot(v, memo, pending) for k, v in value.items()}
    if isinstance(value, list):
        return [_snapshot(v, memo, pending) for v in value]
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_snapshot(v, memo, pending) for v in value))
    if isinstance(value, tuple):
        return tuple(_snapshot(v, memo, pending) for v in value)
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return value
    return copy.deepcopy(value)  # e.g. NumPy arrays in RNG states


def _copy_to_cpu(tensor: torch.Tensor, pending: list[bool]) -> torch.Tensor:
    if tensor.device.type == "cpu":
        return tensor.clone()
    if tensor.device.type == "cuda":
        # Pinned host memory lets the copy run at full bus speed without blocking per tensor; one sync at the end.
        out = torch.empty_like(tensor, device="cpu", pin_memory=True)
        out.copy_(tensor, non_blocking=True)
        pending[0] = True
        return out
    return tensor.to("cpu")


def _save_and_keep(state: dict[str, Any], directory: str | Path, name: str, also_as: str | None, **kwargs: Any) -> Path:
    path = save(state, directory, name, **kwargs)
    if also_as is not None:
        copy_checkpoint(path, path.with_name(also_as))
    return path


class AsyncCheckpointer:
    """Saves checkpoints in a background thread, so training pauses only for the copy of its state to CPU.

    `save()` takes the same arguments as `checkpoint.save`: it first waits for the previous write (at most one
    is in flight, so memory holds at most one extra copy of the state), copies `state` off the device, starts
    the write (the same atomic save, manifest and pruning) and returns the final path at once. A failed write
    is raised as CheckpointError by the next `save()` or `wait()`. Call `wait()` before relying on the file
    (before exiting, or before a final synchronous checkpoint); `close()` or a `with` block does that too.
    """

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpctrain-checkpoint")
        self._future: Future[Path] | None = None
        self._target: Path | None = None

    def save(
        self,
        state: dict[str, Any],
        directory: str | Path,
        name: str,
        *,
        epoch: int,
        step: int,
        world_size: int = 1,
        keep: int | None = None,
        also_as: str | None = None,
    ) -> Path:
        """`also_as`: once written, the checkpoint is also kept under that name in the same directory (the best
        epoch's, `copy_checkpoint`), in the background as well: nobody waits for it."""
        self.wait()
        check_arguments(name, keep)  # save() checks too, but here it is before the copy and in the caller's thread
        copied = snapshot(state)
        self._target = Path(directory) / name
        self._future = self._executor.submit(
            _save_and_keep,
            copied,
            directory,
            name,
            also_as,
            epoch=epoch,
            step=step,
            world_size=world_size,
            keep=keep,
        )
        return self._target

    def wait(self) -> Path | None:
        """Block until the write in flight (if any) is durable; return its path, or raise what went wrong."""
        future, target = self._future, self._target
        if future is None:
            return None
        self._future = None
        try:
            return future.result()
        except CheckpointError:
            raise
        except Exception as err:
            raise CheckpointError(
                f"writing checkpoint {target} in the background failed ({err!r}); "
                "check free space and permissions of the checkpoint directory"
            ) from err

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)

    def __enter__(self) -> AsyncCheckpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
