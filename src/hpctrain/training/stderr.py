"""Dropping a known line that C++ code writes straight to file descriptor 2, where Python's warnings filters never
see it (DDP's find_unused_parameters notice, printed once per process on its first forward pass)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any

from torch import nn
from hpctrain import channel


def drop_first_forward_stderr(module: nn.Module, text: str) -> None:
    """Drop the lines holding `text` that the module's first forward pass writes to stderr; pass on the others.

    For DDP's find_unused_parameters warning, which it prints once per process, from C++, on the first forward:
    straight to file descriptor 2, where Python's warnings filters never see it, and so once on every rank."""
    capture: list[Any] = []

    def start(*_: Any) -> None:
        channel.flush()
        capture[:] = [os.dup(2), tempfile.TemporaryFile()]
        os.dup2(capture[1].fileno(), 2)

    def stop(*_: Any) -> None:
        hooks.close()  # once
        saved, file = capture
        channel.flush()
        os.dup2(saved, 2)
        os.close(saved)
        with file:
            file.seek(0)
            kept = [line for line in file.read().splitlines(keepends=True) if text.encode() not in line]
        if kept:
            os.write(2, b"".join(kept))

    hooks = contextlib.ExitStack()
    hooks.callback(module.register_forward_pre_hook(start).remove)
    hooks.callback(module.register_forward_hook(stop, always_call=True).remove)
