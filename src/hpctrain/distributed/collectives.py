"""The collectives hpctrain runs, each keeping the tensors it hands to torch alive for a while after it returns, on
the torch versions and backends where that is needed.

Why they are kept: before pytorch/pytorch#154976 (merged 2025-06-04, so torch 2.8 and later have it; the hazard is
pytorch#56297), a gloo process group's destructor waits for its worker threads while it holds Python's GIL. A
worker thread lets go of a collective's tensors only *after* the caller has been told the collective is done. When
the caller has dropped its own reference by then (a temporary, as inside torch's `all_gather_object`), the worker's
release is the last one and needs the GIL to free the Python object; if `destroy_process_group` is running at that
moment, neither thread can go on and the process hangs for good, with its allocation. Seen in our floor CI (torch
2.2, gloo): a two-process job whose last collectives were a gather and a barrier never exited, about one run in five
on a loaded machine. With every tensor of a recent collective still referenced from here, the worker's release is
never the last one. NCCL's groups hand tensors to no such worker thread; torch >= 2.8 releases the GIL first: there,
nothing is kept.

Every collective in hpctrain's product code goes through this module (tests/test_collectives.py checks the sources).
"""

from __future__ import annotations

import pickle
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from hpctrain.compat import version_tuple

if TYPE_CHECKING:
    import torch

__all__ = [
    "all_gather_object",
    "all_reduce",
    "all_reduce_mean",
    "barrier",
    "collective_device",
    "collective_device_type",
    "device_type_for",
    "holds_for",
]

# Where kept (gloo, torch < 2.8), a collective's tensors stay referenced while they are among the HOLD_COUNT most
# recent or younger than HOLD_S seconds, never beyond the HOLD_MAX most recent, and never beyond HOLD_BYTES in all:
# the most recent collective's tensors are always kept (until the next one), older ones are let go first. A worker
# thread releases them microseconds after the collective completes; seconds cover a thread the operating system
# left waiting on a loaded machine. Most are small (votes, sums, pickled rank states); the preflight's buffers
# (64-192 MiB) and a user's all_reduce of a large tensor are not, hence the bound in bytes.
HOLD_S = 10.0
HOLD_COUNT = 64
HOLD_MAX = 20_000
HOLD_BYTES = 64 << 20
FIXED_IN = (2, 8)  # the first torch whose process-group destructor releases the GIL (pytorch#154976)
_held: deque[tuple[float, int, tuple[Any, ...]]] = deque()
_held_bytes = 0


def _hold(group: Any, *tensors: Any) -> None:
    global _held_bytes
    if not _needs_hold(group, tensors[0].device.type):
        return
    now = time.monotonic()
    size = sum(t.numel() * t.element_size() for t in tensors)
    _held.append((now, size, tensors))
    _held_bytes += size
    while len(_held) > 1 and (
        len(_held) > HOLD_MAX or _held_bytes > HOLD_BYTES or (len(_held) > HOLD_COUNT and now - _held[0][0] > HOLD_S)
    ):
        _held_bytes -= _held.popleft()[1]


def _needs_hold(group: Any, device_type: str) -> bool:
    """Whether a collective on `group` of tensors on `device_type` needs them kept: gloo carries it, on a torch
    before the fix. With "cpu:gloo,cuda:nccl", CUDA tensors go to NCCL: not kept."""
    import torch
    import torch.distributed as dist

    if version_tuple(torch.__version__) >= FIXED_IN:
        return False
    return holds_for(str(dist.get_backend(group)), device_type)


def holds_for(backend: str, device_type: str) -> bool:
    """Whether `backend` (torch.distributed.get_backend's name, or a per-device list such as "cpu:gloo,cuda:nccl")
    carries `device_type`'s tensors over gloo."""
    backend = backend.lower()
    if ":" not in backend:
        return backend == "gloo"
    per_device = dict(part.split(":", 1) for part in backend.split(",") if ":" in part)
    return per_device.get(device_type, "").strip() == "gloo"


def _is_initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def all_reduce(tensor: torch.Tensor, op: str = "sum", group: Any = None) -> torch.Tensor:
    """All-reduce `tensor` in place over `group` (the default group when None) with torch's ReduceOp named by `op`
    ("sum", "max", ...), and return it. Identity without a process group."""
    import torch.distributed as dist

    if _is_initialized():
        _hold(group, tensor)
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op.upper()), group=group)
    return tensor


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    """Mean of `tensor` over all ranks (a new tensor; the input unchanged). Identity for a single process."""
    import torch.distributed as dist

    result = all_reduce(tensor.detach().clone())
    if _is_initialized():
        result /= dist.get_world_size()
    return result


def barrier() -> None:
    """Wait for all ranks (no-op for a single process). gloo's barrier holds no tensor of the caller's."""
    import torch.distributed as dist

    if _is_initialized():
        dist.barrier()


def exchange(tensor: torch.Tensor, received: torch.Tensor, peer: int, first: bool) -> None:
    """Send `tensor` to rank `peer` and receive its tensor into `received` (same size): the rank with `first` sends
    first, its peer receives first, so the two never wait on each other. Point to point: no other rank takes part."""
    import torch.distributed as dist

    _hold(None, tensor, received)
    if first:
        dist.send(tensor, peer)
        dist.recv(received, peer)
    else:
        dist.recv(received, peer)
        dist.send(tensor, peer)


def all_gather_object(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's `obj` (picklable), in rank order: torch's `all_gather_object`, with tensors kept here.

    Two all-gathers: the pickled sizes, then the pickles padded to the longest. Only hpctrain's own ranks of one
    job contribute, as with torch's own function, which also unpickles what the ranks send."""
    import torch
    import torch.distributed as dist

    if not _is_initialized():
        return [obj]
    device = collective_device(group)
    world = dist.get_world_size(group)
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
    size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    _hold(group, size, *sizes)
    dist.all_gather(sizes, size, group=group)
    lengths = [int(s.item()) for s in sizes]
    padded = torch.zeros(max(lengths), dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload.to(device)
    gathered = [torch.empty_like(padded) for _ in range(world)]
    _hold(group, padded, *gathered)
    dist.all_gather(gathered, padded, group=group)
    return [pickle.loads(t[:n].cpu().numpy().tobytes()) for t, n in zip(gathered, lengths)]  # our ranks


def collective_device(group: Any = None) -> torch.device:
    """The device a collective's tensors must be on for `group`'s backend: the CPU when the backend takes CPU
    tensors (gloo, "cpu:gloo,cuda:nccl"), else this process's current device of the backend's type (NCCL: its
    GPU, set by init_process_group)."""
    import torch

    device_type = collective_device_type(group)
    if device_type == "cpu":
        return torch.device("cpu")
    return torch.device(device_type, _current_index(device_type))


def collective_device_type(group: Any = None) -> str:
    """`collective_device`'s type, without asking which device is current: "cpu", "cuda", ..."""
    import torch.distributed as dist

    return device_type_for(dist.get_backend(group), _backend_capability())


def device_type_for(backend: str, capability: dict[str, list[str]]) -> str:
    """The device type for a collective's tensor on a group with this backend: "cpu" when the backend takes CPU
    tensors, else the first device type it supports ("cuda" for nccl). `backend` is what
    torch.distributed.get_backend returns: a name ("nccl") or a per-device list ("cpu:gloo,cuda:nccl");
    `capability` is torch's table of the device types each backend name supports. An unknown name counts as CPU."""
    backend = backend.lower()
    if ":" in backend:
        devices = [part.split(":", 1)[0].strip() for part in backend.split(",")]
    else:
        devices = capability.get(backend) or ["cpu"]
    return "cpu" if "cpu" in devices else devices[0]


def _backend_capability() -> dict[str, list[str]]:
    import torch.distributed as dist

    known = getattr(dist.Backend, "backend_capability", None)
    return known if isinstance(known, dict) else {"gloo": ["cpu", "cuda"], "nccl": ["cuda"], "mpi": ["cpu", "cuda"]}


def _current_index(device_type: str) -> int | None:
    """This process's current device of that type (set by `torch.cuda.set_device` in init_process_group)."""
    import torch

    module = getattr(torch, device_type, None)
    current = getattr(module, "current_device", None)
    return int(current()) if callable(current) else None
