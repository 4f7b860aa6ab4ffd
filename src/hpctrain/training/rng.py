"""Capture and restore every random generator in play, in a form `torch.load(weights_only=True)` accepts
(tensors, numbers, strings, lists, tuples, dicts: no pickled numpy objects)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def problem(state: Any) -> str | None:
    """Why `state` (a checkpoint's, read back) is not one `capture` wrote, so that `restore` would fail; None if it
    is. Checked before a run starts, rather than met as a traceback once it has."""
    if not isinstance(state, dict):
        return f"is a {type(state).__name__}, not the streams' states"
    own = torch.get_rng_state()
    saved = state.get("torch")
    if not isinstance(saved, torch.Tensor) or saved.dtype != own.dtype or saved.shape != own.shape:
        shape = tuple(saved.shape) if isinstance(saved, torch.Tensor) else type(saved).__name__
        return f"has a torch generator state of shape {shape}, not {tuple(own.shape)} bytes"
    numpy_state = state.get("numpy")
    if not (
        isinstance(numpy_state, (tuple, list))
        and len(numpy_state) == 5
        and isinstance(numpy_state[0], str)
        and isinstance(numpy_state[1], torch.Tensor)
        and numpy_state[1].shape == (624,)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numpy_state[2:])
    ):
        return "has no numpy generator state of the form (kind, 624 keys, position, has_gauss, cached)"
    python = state.get("python")
    if not (
        isinstance(python, (tuple, list))
        and len(python) == 3
        and isinstance(python[0], int)
        and isinstance(python[1], (tuple, list))
        and len(python[1]) == 625
        and all(type(v) is int and 0 <= v < 2**32 for v in python[1])
        and (python[2] is None or isinstance(python[2], float))
    ):
        return "has no Python generator state of the form (version, 625 words, gauss)"
    cuda = state.get("cuda", [])
    if not (
        isinstance(cuda, (list, tuple)) and all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in cuda)
    ):
        return "has CUDA generator states that are not byte tensors"
    return None


def restore(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        for index, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, index)
