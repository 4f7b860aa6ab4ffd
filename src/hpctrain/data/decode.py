"""Decode an image file straight to its output crop: RGB uint8, decoded at a reduced scale where the crop allows.

JPEGs (nearly all of ImageNet) go through libjpeg-turbo via simplejpeg: the header gives the size, the crop is
chosen in original pixels, and the image is decoded at the smallest of 1/8, 1/4, 1/2 scale that still covers the
crop at the output size (a 500x375 photo cropped to 224x224 from a box of 100 pixels is decoded at 1/4 scale:
several times less work). Binary PPMs (`hpctrain prepare --format raw`: pixels already decoded at training
resolution) are used in place: the header is parsed and the pixels viewed, nothing is decoded. CMYK/YCCK JPEGs,
files libjpeg-turbo rejects, PNGs and other formats go through Pillow (with its own `draft` reduced decoding for
JPEGs), which accepts what torchvision's ImageFolder accepts. Grayscale becomes RGB. OpenCV crops and resizes (see
`_crop_resize`).
"""

from __future__ import annotations

import functools
import io
import math
import re
from typing import Protocol

import numpy as np

from hpctrain.data.transforms import Crop
from hpctrain.errors import UserError
from hpctrain.fsutil import FileRefused, read_regular

JPEG_MAGIC = b"\xff\xd8\xff"
# A binary 8-bit PPM as `hpctrain prepare --format raw` writes it (Pillow's writer): "P6", width, height, 255, one
# whitespace byte, then height x width x 3 bytes of RGB. Anything else (comments, 16-bit samples) goes to Pillow.
PPM_HEADER = re.compile(rb"P6\s+(\d+)\s+(\d+)\s+255\s")
MAX_IMAGE_BYTES = 64 << 20
"""The largest image file read (64 MiB: ImageNet's largest is about 15 MB; a 100-megapixel JPEG is ~30 MB). A
larger file, or anything that is not a regular file (a FIFO, /dev/zero behind a link), is a bad image: refused
by name, or left out with --skip-bad-images."""


class CropSpec(Protocol):
    size: tuple[int, int]  # output (height, width)

    def crop(self, height: int, width: int, seed: int, epoch: int, index: int) -> Crop: ...


class BadImageError(UserError):
    """An image file that cannot be read or decoded; the message names the file and the fix."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(
            f"{path}: cannot decode this image ({reason}); replace or delete the file, "
            "or pass --skip-bad-images to train without it"
        )
        self.path = path
        self.reason = reason


def read_image_file(path: str) -> bytes:
    """The bytes of the image file `path`: a regular file of at most MAX_IMAGE_BYTES, else BadImageError."""
    try:
        return read_regular(path, MAX_IMAGE_BYTES)
    except FileRefused as err:
        raise BadImageError(path, err.reason) from err
    except OSError as err:
        raise BadImageError(path, err.strerror or str(err)) from err


def decode_crop(data: bytes, name: str, spec: CropSpec, seed: int, epoch: int, index: int, out: np.ndarray) -> None:
    """Decode the encoded image `data` (called `name` in errors), crop it as `spec` says for sample `index` of
    `epoch`, and write it into `out` (H, W, 3)."""
    try:
        image, crop, scale = _decode(data, spec, seed, epoch, index)
        _crop_resize(image, crop, scale, out)
    except BadImageError:
        raise
    except Exception as err:  # decoders raise ValueError, OSError, PIL and cv2 errors: all mean "bad file"
        raise BadImageError(name, f"{type(err).__name__}: {err}") from err


def _decode(
    data: bytes, spec: CropSpec, seed: int, epoch: int, index: int
) -> tuple[np.ndarray, Crop, tuple[float, float]]:
    """The decoded (maybe reduced) RGB image, the crop in original pixels, and decoded/original scale (y, x)."""
    if data[:2] == b"P6":
        raw = _raw_pixels(data)
        if raw is not None:
            return raw, spec.crop(raw.shape[0], raw.shape[1], seed, epoch, index), (1.0, 1.0)
    if data[:3] == JPEG_MAGIC:
        simplejpeg = _simplejpeg()
        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError:
            colorspace = None  # let Pillow judge the file
        if colorspace is not None and colorspace not in ("CMYK", "YCCK"):
            crop = spec.crop(height, width, seed, epoch, index)
            min_height, min_width = _min_decoded_size(height, width, crop, spec.size)
            try:
                image = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=min_height, min_width=min_width)
            except ValueError:
                pass  # e.g. a recoverable libjpeg warning; Pillow accepts what torchvision accepts
            else:
                return image, crop, (image.shape[0] / height, image.shape[1] / width)
    return _decode_pillow(data, spec, seed, epoch, index)


def _raw_pixels(data: bytes) -> np.ndarray | None:
    """The RGB pixels of a binary 8-bit PPM, viewed in `data` (no copy), or None when it is not exactly one."""
    header = PPM_HEADER.match(data)
    if header is None:
        return None
    width, height = int(header[1]), int(header[2])
    if width < 1 or height < 1 or len(data) - header.end() != width * height * 3:
        return None  # Pillow then says what is wrong with it
    return np.frombuffer(data, dtype=np.uint8, count=width * height * 3, offset=header.end()).reshape(height, width, 3)


def _decode_pillow(
    data: bytes, spec: CropSpec, seed: int, epoch: int, index: int
) -> tuple[np.ndarray, Crop, tuple[float, float]]:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        width, height = img.size
        crop = spec.crop(height, width, seed, epoch, index)
        if img.format == "JPEG":
            min_height, min_width = _min_decoded_size(height, width, crop, spec.size)
            img.draft(None, (min_width, min_height))  # scaled DCT decoding, never below the requested size
        rgb = img.convert("RGB")
        image = np.asarray(rgb)
    return image, crop, (image.shape[0] / height, image.shape[1] / width)


def _min_decoded_size(height: int, width: int, crop: Crop, size: tuple[int, int]) -> tuple[int, int]:
    """The smallest 1/2, 1/4 or 1/8 scale (or full size) at which the crop still has the output's pixels.

    Only those scales: libjpeg-turbo's other n/8 scalings (7/8, 3/4, ...) use slow non-SIMD inverse DCTs,
    slower than decoding at full size.
    """
    needed = max(size[0] / crop.height, size[1] / crop.width)  # decoded pixels per original pixel
    divisor = next((d for d in (8, 4, 2) if needed <= 1 / d), 1)
    return math.ceil(height / divisor), math.ceil(width / divisor)


def _crop_resize(image: np.ndarray, crop: Crop, scale: tuple[float, float], out: np.ndarray) -> None:
    """Resample the crop box (original pixels; `image` is decoded at `scale`) onto `out`, mirrored if asked.

    Up to 2x shrinking (always the case after a reduced-size decode) an exact affine map: a reduced image's
    box has fractional corners, and rounding them would shift the picture by up to half a decoded pixel.
    Beyond 2x (full-size decodes of PNGs and the like) area averaging of the rounded box, against aliasing.
    """
    cv2 = _cv2()
    sy, sx = scale
    out_h, out_w = out.shape[:2]
    fy, fx = crop.height * sy / out_h, crop.width * sx / out_w  # source pixels per output pixel
    if fx <= 2 and fy <= 2:
        x_step, x_start = (
            (-fx, crop.left * sx + (out_w - 0.5) * fx - 0.5) if crop.flip else (fx, crop.left * sx + 0.5 * fx - 0.5)
        )
        matrix = np.array([[x_step, 0.0, x_start], [0.0, fy, crop.top * sy + 0.5 * fy - 0.5]])
        cv2.warpAffine(
            image,
            matrix,
            (out_w, out_h),
            dst=out,
            flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
            borderMode=cv2.BORDER_REPLICATE,
        )
        return
    top, left = int(round(crop.top * sy)), int(round(crop.left * sx))
    bottom = max(top + 1, min(image.shape[0], int(round((crop.top + crop.height) * sy))))
    right = max(left + 1, min(image.shape[1], int(round((crop.left + crop.width) * sx))))
    resized = cv2.resize(image[top:bottom, left:right], (out_w, out_h), interpolation=cv2.INTER_AREA)
    out[...] = resized[:, ::-1] if crop.flip else resized


@functools.cache
def _simplejpeg():
    import simplejpeg

    return simplejpeg


@functools.cache
def _cv2():
    import cv2

    cv2.setNumThreads(1)  # one data worker = one core; parallelism comes from the worker processes
    return cv2
