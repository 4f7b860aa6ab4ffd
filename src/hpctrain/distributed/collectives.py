"""The collectives hpctrain runs, each keeping the tensors it hands to torch alive for a while after it returns.

Why they are kept: before the mid-2025 fix (pytorch/pytorch#154976; the hazard is pytorch#56297), a gloo process
group's destructor waits for its worker threads while it holds Python's GIL. A worker thread lets go of a
collective's tensors only *after* the caller has been told the collective is done. When the caller has dropped its
own reference by then (a temporary, as inside torch's `all_gather_object`), the worker's release is the last one and
needs the GIL to free the Python object; if `destroy_process_group` is running at that moment, neither thread can go
on and the process hangs for good, with its allocation. Seen in our floor CI (torch 2.2, gloo): a two-process job
whose last collectives were a gather and a barrier never exited, about one run in five on a loaded machine. With
every tensor of a recent collective still referenced from here, the worker's release is never the last one.

Every collective in hpctrain's product code goes through this module (tests/test_collectives.py checks the sources).
"""

from __future__ import annotations

import pickle
import time
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["all_gather_object", "all_reduce", "all_reduce_mean", "barrier", "collective_device",
           "collective_device_type", "device_type_for"]

# A collective's tensors stay referenced while they are among the HOLD_COUNT most recent or younger than HOLD_S
# seconds, and never beyond the HOLD_MAX most recent. A worker thread releases them microseconds after the
# collective completes; seconds cover a thread the operating system left waiting on a loaded machine. The tensors
# are small (votes, sums, pickled rank states), so even a loop voting thousands of times a second keeps a few MB.
HOLD_S = 10.0
HOLD_COUNT = 64
HOLD_MAX = 20_000
_held: deque[tuple[float, tuple[Any, ...]]] = deque()


def _hold(*tensors: Any) -> None:
    now = time.monotonic()
    _held.append((now, tensors))
    while len(_held) > HOLD_MAX or (len(_held) > HOLD_COUNT and now - _held[0][0] > HOLD_S):
        _held.popleft()


def held_count() -> int:
    """How many collectives' tensors are being kept (for tests)."""
    return len(_held)


def _is_initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def all_reduce(tensor: torch.Tensor, op: str = "sum", group: Any = None) -> torch.Tensor:
    """All-reduce `tensor` in place over `group` (the default group when None) with torch's ReduceOp named by `op`
    ("sum", "max", ...), and return it. Identity without a process group."""
    import torch.distributed as dist

    if _is_initialized():
        _hold(tensor)
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

    _hold(tensor, received)
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
    _hold(size, *sizes)
    dist.all_gather(sizes, size, group=group)
    lengths = [int(s.item()) for s in sizes]
    padded = torch.zeros(max(lengths), dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload.to(device)
    gathered = [torch.empty_like(padded) for _ in range(world)]
    _hold(padded, *gathered)
    dist.all_gather(gathered, padded, group=group)
    return [pickle.loads(t[:n].cpu().numpy().tobytes()) for t, n in zip(gathered, lengths)]  # noqa: S301 - our ranks


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
