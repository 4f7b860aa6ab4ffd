"""Reader for the IDX format of (Fashion-)MNIST: a tiny header, then the raw uint8 array."""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from typing import TYPE_CHECKING

from hpctrain.errors import UserError

if TYPE_CHECKING:
    import torch

UINT8_TYPE_CODE = 0x08
GZIP_MAGIC = b"\x1f\x8b"
REDOWNLOAD_HINT = "re-run `hpctrain download` to fetch a fresh, verified copy"


# Deflate expands a stream at most about 1032-fold: a header promising more than that cannot be honest.
MAX_DEFLATE_RATIO = 1032
CHUNK = 1 << 24


class _Malformed(Exception):
    """What is wrong with the content (the message lacks the path and the hint)."""


def _read_up_to(stream, n: int) -> bytes:
    data = b""
    while len(data) < n and (block := stream.read(n - len(data))):
        data += block
    return data


def _read_idx_stream(stream, capacity: int) -> tuple[tuple[int, ...], bytearray]:
    """Parse the header, then read exactly the data it declares, in bounded chunks: memory never exceeds the
    declared size (itself at most `capacity`, what the file can hold), whatever the stream goes on to yield."""
    head = _read_up_to(stream, 4)
    if len(head) < 4:
        raise _Malformed(f"too short to be an IDX file ({len(head)} bytes)")
    zero, type_code, ndim = struct.unpack(">HBB", head)
    if zero != 0 or ndim == 0:
        raise _Malformed(f"not an IDX file (magic {head.hex()}, expected 0000 08 <ndim>)")
    if type_code != UINT8_TYPE_CODE:
        raise _Malformed(f"IDX element type 0x{type_code:02x} is not supported (only uint8, 0x08)")
    dims = _read_up_to(stream, 4 * ndim)
    header_size = 4 + 4 * ndim
    if len(dims) < 4 * ndim:
        raise _Malformed(f"truncated IDX header ({4 + len(dims)} bytes)")
    shape = struct.unpack(f">{ndim}I", dims)
    expected = header_size + math.prod(shape)
    if expected > capacity:
        raise _Malformed(
            f"truncated: its header (shape {tuple(shape)}) implies {expected} bytes, more than the file can hold"
        )
    data = bytearray(expected - header_size)  # a bytearray: torch.frombuffer shares it writable, without a copy
    view = memoryview(data)
    received = 0
    while received < len(data):
        n = stream.readinto(view[received : received + CHUNK])
        if not n:
            raise _Malformed(
                f"truncated: {header_size + received} bytes, but its header (shape {tuple(shape)}) implies {expected}"
            )
        received += n
    if stream.read(1):
        raise _Malformed(
            f"has trailing bytes: more than the {expected} bytes its header (shape {tuple(shape)}) implies"
        )
    return shape, data


def read_idx(path: os.PathLike | str) -> torch.Tensor:
    """Read an IDX file (gzipped or not, detected from its content) into a uint8 tensor of its shape."""
    import torch

    try:
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == GZIP_MAGIC
            raw.seek(0)
            size = os.fstat(raw.fileno()).st_size
            if gzipped:
                try:
                    with gzip.GzipFile(fileobj=raw) as stream:
                        shape, data = _read_idx_stream(stream, MAX_DEFLATE_RATIO * size)
                except (OSError, EOFError, zlib.error) as err:
                    raise UserError(f"{path}: corrupt gzip file ({err}); {REDOWNLOAD_HINT}") from err
            else:
                shape, data = _read_idx_stream(raw, size)
    except FileNotFoundError as err:
        raise UserError(f"{path}: no such file; {REDOWNLOAD_HINT}") from err
    except _Malformed as err:
        raise UserError(f"{path}: {err}; {REDOWNLOAD_HINT}") from None
    except OSError as err:  # a directory, no permission, an I/O error
        raise UserError(f"{path}: cannot be read ({err.strerror or err}); check the path and its permissions") from err
    if not data:  # frombuffer rejects an empty range
        return torch.empty(shape, dtype=torch.uint8)
    return torch.frombuffer(data, dtype=torch.uint8).reshape(shape)
