"""Features that the supported torch and torchvision range (README, "Supported versions") does not all have.

Each is detected in the running process (a job runs the torch of its own environment, not the submitting host's),
and a missing one gets a fallback that works plus one line, once per job, saying what is lost:

    torch.distributed.init_process_group(device_id=...)   torch >= 2.3   eager NCCL initialisation
    torchvision.io.decode_jpeg(list_of_jpegs, ...)         torchvision >= 0.19   one batched GPU decode per batch
    TORCH_GLOO_LAZY_INIT=1 (gloo connects on first use)     torch >= 2.8   the stop vote's gloo group: 2 peers a rank
    torch.optim.SGD(fused=True)                             torch >= 2.3 (CUDA), 2.4 (CPU)   one kernel per parameter

(torchrun's --signals-to-handle, torch >= 2.9, is decided in the batch script: schedulers/slurm/batch/script.py.)
"""

from __future__ import annotations

import logging
import functools
import inspect
import os
import re
from hpctrain.channel import note

log = logging.getLogger(__name__)

_said: set[str] = set()


def version_tuple(version: str) -> tuple[int, int]:
    """ "2.2.2+cu121" -> (2, 2); (0, 0) when unreadable (then every feature check says no)."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


@functools.cache
def init_takes_device_id() -> bool:
    """torch >= 2.3: init_process_group(device_id=...) binds the group to one GPU and creates NCCL at once."""
    import torch.distributed as dist

    return "device_id" in inspect.signature(dist.init_process_group).parameters


def gloo_connects_lazily() -> bool:
    """torch >= 2.8 (pytorch#151031): a gloo group made while TORCH_GLOO_LAZY_INIT=1 connects a pair of ranks at
    their first exchange, not every rank to every other at creation."""
    import torch

    return version_tuple(torch.__version__) >= (2, 8)


@functools.cache
def fused_sgd(device_type: str) -> bool:
    """torch.optim.SGD(fused=True) on a device of this type: the keyword exists since torch 2.3 (CUDA only; an
    older SGD refuses it with a TypeError), the CPU kernels since torch 2.4. Read from the signature and the
    version, as torch documents them, not from which exception a refusal raises."""
    import torch

    if "fused" not in inspect.signature(torch.optim.SGD).parameters:
        return False
    if device_type == "cuda":
        return True
    return device_type == "cpu" and version_tuple(torch.__version__) >= (2, 4)


@functools.cache
def batched_decode_jpeg() -> bool:
    """torchvision >= 0.19: decode_jpeg takes a list of JPEGs and decodes them in one call (nvJPEG's batched API)."""
    import torchvision

    return version_tuple(torchvision.__version__) >= (0, 19)


def say_once(key: str, message: str) -> None:
    """One line on stderr per process and key, only from the job's first process (RANK unset or 0)."""
    if key in _said or os.environ.get("RANK", "0") != "0":
        return
    _said.add(key)
    note(log, f"note: {message}")


def numpy_mismatch(torch_version: str | None, numpy_version: str | None) -> str | None:
    """torch before 2.3 was built against NumPy 1.x: beside NumPy 2 its NumPy bridge fails in every process
    (torch.from_numpy, a DataLoader collating NumPy arrays), after a long warning at import. One line naming the
    fix, or None (also when a version is missing or unreadable)."""
    if not torch_version or not numpy_version or version_tuple(torch_version) == (0, 0):
        return None
    if version_tuple(torch_version) < (2, 3) and version_tuple(numpy_version) >= (2, 0):
        return (
            f"torch {torch_version} was built against NumPy 1.x but NumPy {numpy_version} is installed, so torch "
            "cannot use NumPy: pip install 'numpy<2' (or a torch >= 2.3)"
        )
    return None


def installed_numpy_mismatch() -> str | None:
    """numpy_mismatch for the torch and NumPy installed in this environment, read from their metadata (imports
    neither)."""
    import importlib.metadata

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return numpy_mismatch(version("torch"), version("numpy"))
