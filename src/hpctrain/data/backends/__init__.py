"""Which image pipeline feeds the training device (``--data-backend auto|cpu|dali|nvjpeg``), and building it.

- ``cpu``: `hpctrain.data.loader.ImageFolderSource`, DataLoader worker processes decode and crop on the CPU.
- ``nvjpeg`` (`backends.nvjpeg`): workers only read the encoded bytes and each sample's crop window; the batch is
  decoded on the training device by nvJPEG (torchvision.io.decode_jpeg), cropped, resized and mirrored there.
- ``dali`` (`backends.dali`): an NVIDIA DALI pipeline fed by an external source (the bytes and crop windows, read
  by DALI's parallel Python workers), decoding only each crop's region (nvJPEG / the hardware JPEG decoder on a
  GPU), resizing and mirroring in the pipeline.

Every backend takes samples only through `EncodedImages.read(i)`, orders them with `EpochPlan` and crops them with
hpctrain's own `CropSpec` (pure functions of seed, epoch and sample index), and hands the loop uint8 NHWC batches
that `to_device` normalizes: the same batches at any resume point, the same normalization whichever backend. The
GPU backends' modules are imported only when chosen (DALI's import is heavy).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass

from hpctrain.compat import version_tuple
from hpctrain.errors import UserError

DATA_BACKENDS = ("auto", "cpu", "dali", "nvjpeg")


@dataclass(frozen=True)
class BackendChoice:
    name: str  # cpu, dali or nvjpeg
    why: str  # one line for the startup output

    def describe(self) -> str:
        return f"data backend {self.name} ({self.why})"


# The oldest NVIDIA DALI whose fn.decoders.image_slice takes the arguments the dali backend passes: adjust_orientation
# came with the nvImageCodec-based decoders, fn.decoders from DALI 2.0 (in 1.x only fn.experimental.decoders had it;
# 1.x's fn.decoders disregard EXIF and reject the argument); jpeg_fancy_upsampling is older (NVIDIA/DALI#4662, 2023).
# NGC PyTorch images before 2025 ship a DALI 1.x.
MIN_DALI = (2, 0)


def choose_backend(
    requested: str, device_type: str, prove: Callable[[str], str | None] | None = None, decoded: bool = False
) -> BackendChoice:
    """The backend for `--data-backend requested` on a `device_type` ("cuda", "cpu", ...) training device. auto on a
    CUDA GPU: the first of dali and nvjpeg that is usable (dali: installed, version >= MIN_DALI) and proves
    itself on this GPU (`prove(name)`: None, or what went wrong; default: `proof.prove` on the current GPU), else
    cpu; the reason says why each one before it was passed over. auto elsewhere, or on images stored decoded
    (`decoded`: shards of `hpctrain prepare --format raw`, nothing for a GPU decoder to do): cpu. dali and nvjpeg
    asked for on another device run their CPU variants (decoding on the CPU): they are meant for GPUs.
    """
    if requested not in DATA_BACKENDS:
        raise UserError(f"--data-backend {requested!r}: choose one of {', '.join(DATA_BACKENDS)}")
    cuda = device_type == "cuda"
    if requested == "auto":
        if decoded:
            return BackendChoice(
                "cpu", "auto: the shards hold decoded pixels (prepare --format raw), workers crop them"
            )
        if not cuda:
            return BackendChoice("cpu", f"auto: training runs on {device_type}, GPU decoding needs a CUDA device")
        return _auto_on_gpu(prove or _prove_on_current_gpu)
    if requested == "dali":
        require_dali()
    if requested == "cpu":
        return BackendChoice("cpu", "as asked: data worker processes decode on the CPU")
    if cuda:
        return BackendChoice(requested, "as asked: JPEGs are decoded on the GPU")
    return BackendChoice(
        requested,
        f"as asked, but decoding on the CPU: this backend is meant for CUDA GPUs and "
        f"training runs on {device_type}; --data-backend cpu is faster there",
    )


def _auto_on_gpu(prove: Callable[[str], str | None]) -> BackendChoice:
    passed_over = []
    version = dali_version()
    if version is None:
        passed_over.append(f"NVIDIA DALI is not installed ({dali_install_hint()} to use it)")
    elif version_tuple(version) < MIN_DALI:
        passed_over.append(
            f"NVIDIA DALI {version} is older than {MIN_DALI[0]}.{MIN_DALI[1]}, whose decoder "
            "arguments the dali backend uses"
        )
    else:
        failure = prove("dali")
        if failure is None:
            return BackendChoice("dali", f"auto: NVIDIA DALI {version} decoded its test JPEGs right on this GPU")
        passed_over.append(f"dali on this GPU: {failure}")
    failure = prove("nvjpeg")
    if failure is None:
        return BackendChoice(
            "nvjpeg", f"auto: {'; '.join(passed_over)}; nvjpeg decoded its test JPEGs right on this GPU"
        )
    passed_over.append(f"nvjpeg on this GPU: {failure}")
    return BackendChoice("cpu", f"auto: {'; '.join(passed_over)}; data worker processes decode on the CPU")


def _prove_on_current_gpu(name: str) -> str | None:
    import torch

    from hpctrain.data.backends.proof import prove

    return prove(name, torch.device("cuda", torch.cuda.current_device()))


@functools.cache
def dali_version() -> str | None:
    """The installed NVIDIA DALI's version, or None when it does not import."""
    try:
        dali = importlib.import_module("nvidia.dali")
    except ImportError:
        return None
    return str(getattr(dali, "__version__", "0.0"))


def dali_installed() -> bool:
    return dali_version() is not None


def dali_install_hint() -> str:
    """The pip command for the DALI wheel that matches this torch's CUDA (cuda120 for CUDA 12, cuda130 for 13)."""
    import torch

    major = (torch.version.cuda or "12").split(".")[0]
    return f"pip install nvidia-dali-cuda{major}0 (or 'hpctrain[dali-cuda{major}0]')"


def require_dali() -> None:
    version = dali_version()
    if version is None:
        raise UserError(
            f"--data-backend dali needs NVIDIA DALI, which is not installed: {dali_install_hint()}, "
            "or use --data-backend nvjpeg or cpu"
        )
    if version_tuple(version) < MIN_DALI:
        upgrade = dali_install_hint().replace("pip install", "pip install -U", 1)
        raise UserError(
            f"--data-backend dali needs NVIDIA DALI >= {MIN_DALI[0]}.{MIN_DALI[1]} (its decoder "
            f"arguments), and {version} is installed: {upgrade}, or use --data-backend nvjpeg or cpu"
        )


def make_loader(
    choice: BackendChoice,
    train,
    val,
    config,
    seed: int,
    train_crop,
    eval_crop,
    device,
):
    """The streaming loader (see `hpctrain.data.loader.BatchSource`) of backend `choice` on `device`."""
    if choice.name == "dali":
        from hpctrain.data.backends.dali import DaliSource

        return DaliSource(train, val, config, seed, train_crop, eval_crop, device=device)
    if choice.name == "nvjpeg":
        from hpctrain.data.backends.nvjpeg import NvjpegSource

        return NvjpegSource(train, val, config, seed, train_crop, eval_crop, device=device)
    from hpctrain.data.loader import ImageFolderSource

    return ImageFolderSource(train, val, config, seed, train_crop, eval_crop)


__all__ = [
    "DATA_BACKENDS",
    "MIN_DALI",
    "BackendChoice",
    "choose_backend",
    "dali_install_hint",
    "dali_installed",
    "dali_version",
    "make_loader",
    "require_dali",
]
