"""Which floating-point type a recipe computes in, from what the training device does natively (one rule for the
MNIST and ImageNet fast recipes).

On a CUDA GPU, by compute capability:

- sm80 and later (A100, H100, L4, RTX 30xx on): bfloat16 autocast. Tensor cores take bf16 natively, and bf16 has
  float32's range: no loss scaling.
- sm70 and sm75 (V100, T4, RTX 20xx): float16 autocast with a gradient scaler. Their tensor cores take fp16 only;
  torch 2.2 raises on bf16 autocast there and later torch emulates it, slower than float32.
- below sm70 (P100 sm60, P40/GTX 10xx sm61): float32. No tensor cores: sm60 computes fp16 at twice its float32 rate,
  but on convolution networks mixed precision then saves mostly memory traffic, for loss-scaling's cost and risk,
  and sm61 computes fp16 at 1/64 of its float32 rate. float32 is right on both and never wrong.

On a CPU, from a table that `benchmarks/mnist_step_cost.py` keeps honest (it times both types on the fast MNIST
recipe's own step and says whether the table picked the faster; docs/benchmarks.md has the figures):

- AMX (Intel Sapphire Rapids and later): bfloat16 autocast; oneDNN's tile kernels make it the faster.
- AVX512-BF16 without AMX on an Intel CPU (Cooper Lake, or a Sapphire Rapids guest without AMX): float32. There
  bf16 convolutions measured 1.3-1.5x slower than AVX-512 float32 ones (issue 33).
- AVX512-BF16 on an AMD CPU (Zen 4, Zen 5): bfloat16; measured the faster there (docs/benchmarks.md, issue 33).
- anything else: float32 (bf16 would be emulated).

A table rather than a timing at start: every rank of a job and every resumed attempt computes in the same type (a
measurement under load could flip between them, and a resumed run would then not continue bitwise).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import torch

BF16_FROM = (8, 0)  # CUDA compute capability with bf16 tensor cores (Ampere)
FP16_FROM = (7, 0)  # with fp16 tensor cores (Volta)
# oneDNN instruction-set caps (ONEDNN_MAX_CPU_ISA) that still allow its AMX kernels, and its bf16 ones; "ALL" is
# the default (no cap).
AMX_ISAS = frozenset(
    {"ALL", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512_AMX_2"}
)
BF16_ISAS = AMX_ISAS | {"AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512", "AVX10_2_512"}


@dataclass(frozen=True)
class Precision:
    dtype: torch.dtype | None  # the autocast type; None: float32 throughout
    why: str  # one phrase for the start-up line

    @property
    def scaled(self) -> bool:
        """float16 needs its gradients scaled (its range ends at 65504; small gradients underflow)."""
        return self.dtype == torch.float16

    @property
    def name(self) -> str:
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self.dtype, "fp32")

    def autocast(self, device_type: str) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        # No cache of cast weights while a CUDA graph is captured (torch's advice for autocast with graphs: the
        # cached copies would be freed into the graph's memory pool when autocast exits).
        capturing = device_type == "cuda" and torch.cuda.is_current_stream_capturing()
        return torch.autocast(device_type, dtype=self.dtype, cache_enabled=not capturing)


def cuda_precision(capability: tuple[int, int]) -> Precision:
    """The type for a CUDA GPU of compute capability `capability` (torch.cuda.get_device_capability)."""
    sm = f"sm{capability[0]}{capability[1]}"
    if tuple(capability) >= BF16_FROM:
        return Precision(torch.bfloat16, f"bf16: {sm} has bf16 tensor cores")
    if tuple(capability) >= FP16_FROM:
        return Precision(torch.float16, f"fp16 with gradient scaling: {sm} has fp16 tensor cores and no bf16 ones")
    return Precision(None, f"fp32: {sm} has no tensor cores")


def cpu_precision(vendor: str, amx: bool, avx512_bf16: bool, isa_cap: str = "ALL") -> Precision:
    """The type for a CPU of `vendor` (/proc/cpuinfo's vendor_id: GenuineIntel, AuthenticAMD, ...) with or without
    AMX tiles and AVX512-BF16 instructions, under oneDNN's instruction-set cap `isa_cap` (ONEDNN_MAX_CPU_ISA)."""
    cap = isa_cap.strip().upper()
    if amx and cap in AMX_ISAS:
        return Precision(torch.bfloat16, "bf16: this CPU has AMX")
    if avx512_bf16 and vendor == "AuthenticAMD" and cap in BF16_ISAS:
        return Precision(torch.bfloat16, "bf16: AVX512-BF16 on an AMD CPU, measured faster than fp32")
    if (amx or avx512_bf16) and cap not in BF16_ISAS:
        return Precision(None, f"fp32: ONEDNN_MAX_CPU_ISA={isa_cap} rules out bf16 instructions")
    if avx512_bf16:
        return Precision(None, "fp32: AVX512-BF16 without AMX, measured slower than fp32 on Intel CPUs")
    return Precision(None, "fp32: this CPU has no bf16 instructions")


def cpu_vendor(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's vendor_id (GenuineIntel, AuthenticAMD, ...), or "" where the file is not there (not Linux)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def precision_for(device: torch.device) -> Precision:
    """This process's rule for `device` (see the module docstring); fp32 on other device types."""
    if device.type == "cuda":
        return cuda_precision(torch.cuda.get_device_capability(device))
    if device.type == "cpu":
        cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL"
        return cpu_precision(
            cpu_vendor(), _cpu_has("_is_amx_tile_supported"), _cpu_has("_is_avx512_bf16_supported"), cap
        )
    return Precision(None, f"fp32 on {device.type}")


def _cpu_has(probe: str) -> bool:
    check = getattr(getattr(torch, "cpu", None), probe, None)
    return bool(check()) if callable(check) else False


def grad_scaler(precision: Precision, device: torch.device) -> Any:
    """A gradient scaler where `precision` needs one (fp16), else None."""
    if not precision.scaled:
        return None
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):
        try:
            return amp.GradScaler(device.type)
        except TypeError:  # older torch: torch.amp.GradScaler without the device argument
            pass
    return torch.cuda.amp.GradScaler()


__all__ = [
    "AMX_ISAS",
    "BF16_FROM",
    "BF16_ISAS",
    "FP16_FROM",
    "Precision",
    "cpu_precision",
    "cpu_vendor",
    "cuda_precision",
    "grad_scaler",
    "precision_for",
]
