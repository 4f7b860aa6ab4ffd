"""Encoding images for the shards, in a pool of worker processes: what `prepare` stores for each source file.

`encode_image` keeps a JPEG or PNG byte for byte when it is small enough, otherwise shrinks and re-encodes it,
and checks every stored image with the training decoder. `encoder_pool` runs it in forked processes (or, for
one worker, in this process); the pool is terminated, not joined, when left by an exception or Ctrl-C.
"""

from __future__ import annotations

import functools
import io
import multiprocessing
import signal
from collections.abc import Callable, Iterator

import numpy as np

from hpctrain.data.decode import BadImageError, read_image_file


class _SerialPool:
    """`multiprocessing.Pool`'s imap in this process, for --workers 1 (no fork, errors surface directly)."""

    def imap(self, function: Callable, work, chunksize: int = 1) -> Iterator:
        return (function(*item) if isinstance(item, tuple) else function(item) for item in work)

    def __enter__(self) -> _SerialPool:
        return self

    def __exit__(self, *exc) -> None:
        pass


class _StarPool:
    """A process pool whose imap unpacks argument tuples, terminated (not joined) when left by an exception."""

    def __init__(self, workers: int) -> None:
        self.pool = multiprocessing.get_context("fork").Pool(workers, initializer=_plain_signals)

    def imap(self, function: Callable, work, chunksize: int = 1) -> Iterator:
        return self.pool.imap(functools.partial(_star, function), work, chunksize)

    def __enter__(self) -> _StarPool:
        return self

    def __exit__(self, *exc) -> None:
        self.pool.terminate()
        self.pool.join()


def _plain_signals() -> None:
    """In an encoding process: SIGTERM (the pool's terminate) just ends it, Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _star(function: Callable, item: tuple):
    return function(*item)


def encoder_pool(workers: int) -> _SerialPool | _StarPool:
    return _SerialPool() if workers <= 1 else _StarPool(workers)


def encode_image(path: str, max_side: int | None, quality: int, raw: bool = False) -> tuple[bytes, str] | str:
    """The bytes to store for the image file `path` and their extension, or why it cannot be read (a str).

    `raw` (``--format raw``): the decoded RGB pixels, shrunk as below, as a binary PPM, whatever the source format:
    training then decodes nothing. Otherwise kept byte for byte when its shorter side is at most `max_side` (or
    always, without `max_side`) and it is a JPEG or PNG; otherwise decoded, shrunk so the shorter side is `max_side`
    (Lanczos), and re-encoded: JPEG at `quality` for JPEG sources, PNG (lossless) for the other formats. Every
    stored image is checked with the training decoder, so a file training could not read is reported now, by name.
    """
    from PIL import Image

    try:
        data = read_image_file(path)
    except BadImageError as err:
        return err.reason
    try:
        with Image.open(io.BytesIO(data)) as img:
            kind = img.format
            width, height = img.size
            if raw:
                stored, extension = _raw(img, max_side), "ppm"
            elif kind in ("JPEG", "PNG") and (max_side is None or min(width, height) <= max_side):
                stored, extension = data, ("jpg" if kind == "JPEG" else "png")
            else:
                stored, extension = _reencode(img, max_side, quality)
        _check_decodes(stored, path)
    except BadImageError as err:
        cause = err.__cause__ or err
        return f"{type(cause).__name__}: {cause}"
    except Exception as err:  # Pillow raises OSError, ValueError, DecompressionBombError...: all "bad file"
        return f"{type(err).__name__}: {err}"
    return stored, extension


def _shrunk_size(width: int, height: int, max_side: int | None) -> tuple[int, int]:
    """(width, height) with the shorter side scaled down to `max_side` if it is longer, aspect ratio kept."""
    if max_side is None or min(width, height) <= max_side:
        return width, height
    factor = max_side / min(width, height)
    return max(1, round(width * factor)), max(1, round(height * factor))


def _raw(img, max_side: int | None) -> bytes:
    """The image as RGB pixels (shorter side at most `max_side`, Lanczos) in a binary PPM."""
    from PIL import Image

    size = _shrunk_size(*img.size, max_side)
    if img.format == "JPEG":
        img.draft("RGB", size)  # DCT-domain shrink, never below size
    image = img.convert("RGB")
    if image.size != size:
        image = image.resize(size, Image.LANCZOS)
    out = io.BytesIO()
    image.save(out, "PPM")
    return out.getvalue()


def _reencode(img, max_side: int | None, quality: int) -> tuple[bytes, str]:
    from PIL import Image

    size = _shrunk_size(*img.size, max_side)
    jpeg = img.format == "JPEG"
    if jpeg:
        img.draft(img.mode if img.mode in ("RGB", "L") else "RGB", size)  # DCT-domain shrink, never below size
    mode = "L" if img.mode in ("L", "I;16", "1") else "RGB"
    image = img.convert(mode)
    if image.size != size:
        image = image.resize(size, Image.LANCZOS)
    out = io.BytesIO()
    if jpeg:
        image.save(out, "JPEG", quality=quality)
        return out.getvalue(), "jpg"
    image.save(out, "PNG")
    return out.getvalue(), "png"


def _check_decodes(data: bytes, path: str) -> None:
    """Decode `data` with the training decoder (at a small output size, so JPEGs decode at 1/8 scale)."""
    from hpctrain.data.decode import decode_crop
    from hpctrain.data.transforms import CenterCrop

    decode_crop(data, path, CenterCrop((8, 8), 8), 0, 0, 0, np.empty((8, 8, 3), dtype=np.uint8))
