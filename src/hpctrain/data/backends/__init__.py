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
from dataclasses import dataclass

from hpctrain.errors import UserError

DATA_BACKENDS = ("auto", "cpu", "dali", "nvjpeg")


@dataclass(frozen=True)
class BackendChoice:
    name: str  # cpu, dali or nvjpeg
    why: str  # one line for the startup output

    def describe(self) -> str:
        return f"data backend {self.name} ({self.why})"


def choose_backend(requested: str, device_type: str) -> BackendChoice:
    """The backend for `--data-backend requested` on a `device_type` ("cuda", "cpu", ...) training device.

    auto: dali when it is installed and the device is a CUDA GPU, else nvjpeg on a CUDA GPU, else cpu. dali and
    nvjpeg asked for on another device run their CPU variants (decoding on the CPU): they are meant for GPUs.
    """
    if requested not in DATA_BACKENDS:
        raise UserError(f"--data-backend {requested!r}: choose one of {', '.join(DATA_BACKENDS)}")
    cuda = device_type == "cuda"
    if requested == "auto":
        if cuda and dali_installed():
            return BackendChoice("dali", "auto: NVIDIA DALI is installed and training runs on a CUDA GPU")
        if cuda:
            return BackendChoice("nvjpeg", f"auto: training runs on a CUDA GPU and NVIDIA DALI is not installed "
                                           f"({dali_install_hint()} to use it)")
        return BackendChoice("cpu", f"auto: training runs on {device_type}, GPU decoding needs a CUDA device")
    if requested == "dali":
        require_dali()
    if requested == "cpu":
        return BackendChoice("cpu", "as asked: data worker processes decode on the CPU")
    if cuda:
        return BackendChoice(requested, "as asked: JPEGs are decoded on the GPU")
    return BackendChoice(requested, f"as asked, but decoding on the CPU: this backend is meant for CUDA GPUs and "
                                    f"training runs on {device_type}; --data-backend cpu is faster there")


@functools.cache
def dali_installed() -> bool:
    try:
        importlib.import_module("nvidia.dali")
    except ImportError:
        return False
    return True


def dali_install_hint() -> str:
    """The pip command for the DALI wheel that matches this torch's CUDA (cuda120 for CUDA 12, cuda130 for 13)."""
    import torch

    major = (torch.version.cuda or "12").split(".")[0]
    return f"pip install nvidia-dali-cuda{major}0 (or 'hpctrain[dali-cuda{major}0]')"


def require_dali() -> None:
    if not dali_installed():
        raise UserError(f"--data-backend dali needs NVIDIA DALI, which is not installed: {dali_install_hint()}, "
                        "or use --data-backend nvjpeg or cpu")


def make_loader(choice: BackendChoice, train, val, config, seed: int,  # type: ignore[no-untyped-def]
                train_crop, eval_crop, device):
    """The streaming loader (see `hpctrain.data.loader.BatchSource`) of backend `choice` on `device`."""
    if choice.name == "dali":
        from hpctrain.data.backends.dali import DaliSource

        return DaliSource(train, val, config, seed, train_crop, eval_crop, device=device)
    if choice.name == "nvjpeg":
        from hpctrain.data.backends.nvjpeg import NvjpegSource

        return NvjpegSource(train, val, config, seed, train_crop, eval_crop, device=device)
    from hpctrain.data.loader import ImageFolderSource

    return ImageFolderSource(train, val, config, seed, train_crop, eval_crop)


__all__ = ["DATA_BACKENDS", "BackendChoice", "choose_backend", "dali_install_hint", "dali_installed", "make_loader",
           "require_dali"]
