"""A GPU backend proves itself before `--data-backend auto` picks it: it decodes two small test JPEGs on the device
training runs on, as it decodes a batch (nvjpeg: one batched `decode_jpeg`; dali: a pipeline with the decoder
arguments the dali backend uses), and the pixels must match Pillow's decoding of the same bytes (libjpeg-turbo, the
cpu backend's decoder) within a few levels. A driver, library or GPU generation that decodes wrongly, or not at all,
is then found at start, once, in a second, and the next backend is tried.

The same functions run on the CPU (torchvision's CPU decoder, DALI's CPU pipeline): the tests run them there.
"""

from __future__ import annotations

import io

import numpy as np
import torch

# Mean absolute difference, in 0-255 levels, allowed between a backend's pixels and Pillow's. GPU decoders use
# other IDCT and chroma-upsampling arithmetic than libjpeg-turbo (a level or two on smooth images); a broken
# decode (zeros, swapped channels, another image's memory) differs by tens.
TOLERANCE = 4.0


def test_jpegs() -> list[bytes]:
    """Two smooth colour JPEGs of different sizes (4:2:0 chroma, as photographs are stored)."""
    from PIL import Image

    images = []
    for height, width in ((48, 64), (40, 72)):
        y, x = np.mgrid[0:height, 0:width]
        pixels = np.stack([x * 255 // width, y * 255 // height, (x + y) * 255 // (height + width)], axis=-1)
        out = io.BytesIO()
        Image.fromarray(pixels.astype(np.uint8), "RGB").save(out, format="JPEG", quality=90, subsampling=2)
        images.append(out.getvalue())
    return images


def reference(jpeg: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(jpeg)) as image:
        return np.asarray(image.convert("RGB"))


def decode_nvjpeg(jpegs: list[bytes], device: torch.device) -> list[np.ndarray]:
    from torchvision.io import ImageReadMode, decode_jpeg

    from hpctrain import compat

    tensors = [torch.frombuffer(bytearray(jpeg), dtype=torch.uint8) for jpeg in jpegs]
    if compat.batched_decode_jpeg():
        pictures = decode_jpeg(tensors, mode=ImageReadMode.RGB, device=device)
    else:
        pictures = [decode_jpeg(t, mode=ImageReadMode.RGB, device=device) for t in tensors]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return [p.permute(1, 2, 0).cpu().numpy() for p in pictures]


def decode_dali(jpegs: list[bytes], device: torch.device) -> list[np.ndarray]:
    from nvidia.dali import fn, pipeline_def, types

    gpu = device.type == "cuda"

    def feed():
        return [np.frombuffer(jpeg, dtype=np.uint8) for jpeg in jpegs]

    @pipeline_def
    def decode():
        encoded = fn.external_source(source=feed, batch=True, dtype=types.UINT8)
        return fn.decoders.image_slice(
            encoded,
            start=[0, 0],
            rel_shape=[1.0, 1.0],
            device="mixed" if gpu else "cpu",
            axis_names="HW",
            output_type=types.RGB,
            adjust_orientation=False,
            jpeg_fancy_upsampling=True,
        )

    pipe = decode(
        batch_size=len(jpegs),
        num_threads=1,
        device_id=(device.index if device.index is not None else torch.cuda.current_device()) if gpu else None,
    )
    try:
        pipe.build()
        (pictures,) = pipe.run()
        if gpu:
            pictures = pictures.as_cpu()
        return [np.array(pictures[i]) for i in range(len(jpegs))]
    finally:
        del pipe


DECODERS = {"nvjpeg": decode_nvjpeg, "dali": decode_dali}


def prove(name: str, device: torch.device) -> str | None:
    """None when backend `name` decodes the test JPEGs right on `device`, else what went wrong (one phrase)."""
    jpegs = test_jpegs()
    try:
        pictures = DECODERS[name](jpegs, device)
    except Exception as err:  # any failure means "not this backend", said in one line
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return f"its test decode failed: {first[:200]}"
    for jpeg, picture in zip(jpegs, pictures):
        expected = reference(jpeg)
        if picture.shape != expected.shape:
            return f"its test decode gave a {picture.shape} image for a {expected.shape} one"
        difference = float(np.abs(picture.astype(np.float64) - expected).mean())
        if difference > TOLERANCE:
            return f"its test decode differs from Pillow's by {difference:.1f} levels on average"
    return None
