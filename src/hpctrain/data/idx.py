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


def _read_bytes(path: os.PathLike | str) -> bytearray:
    # A bytearray (not bytes) so torch.frombuffer gets a writable buffer and shares it without a copy.
    with open(path, "rb") as f:
        gzipped = f.read(2) == GZIP_MAGIC
    if not gzipped:
        with open(path, "rb") as f:
            data = bytearray(os.fstat(f.fileno()).st_size)  # read straight into it: one copy, not two
            n = f.readinto(data)
        return data[:n] if n != len(data) else data
    try:
        with gzip.open(path, "rb") as f:
            return bytearray(f.read())
    except (OSError, EOFError, zlib.error) as err:
        raise UserError(f"{path}: corrupt gzip file ({err}); {REDOWNLOAD_HINT}") from err


def read_idx(path: os.PathLike | str) -> torch.Tensor:
    """Read an IDX file (gzipped or not, detected from its content) into a uint8 tensor of its shape."""
    import torch

    try:
        data = _read_bytes(path)
    except FileNotFoundError as err:
        raise UserError(f"{path}: no such file; {REDOWNLOAD_HINT}") from err
    except OSError as err:  # a directory, no permission, an I/O error
        raise UserError(f"{path}: cannot be read ({err.strerror or err}); check the path and its permissions") from err
    if len(data) < 4:
        raise UserError(f"{path}: too short to be an IDX file ({len(data)} bytes); {REDOWNLOAD_HINT}")
    zero, type_code, ndim = struct.unpack_from(">HBB", data, 0)
    if zero != 0 or ndim == 0:
        raise UserError(
            f"{path}: not an IDX file (magic {bytes(data[:4]).hex()}, expected 0000 08 <ndim>); {REDOWNLOAD_HINT}"
        )
    if type_code != UINT8_TYPE_CODE:
        raise UserError(
            f"{path}: IDX element type 0x{type_code:02x} is not supported (only uint8, 0x08); {REDOWNLOAD_HINT}"
        )
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise UserError(f"{path}: truncated IDX header ({len(data)} bytes); {REDOWNLOAD_HINT}")
    shape = struct.unpack_from(f">{ndim}I", data, 4)
    expected = header_size + math.prod(shape)
    if len(data) != expected:
        problem = "truncated" if len(data) < expected else "has trailing bytes"
        raise UserError(
            f"{path}: {problem}: {len(data)} bytes, but its header (shape {tuple(shape)}) implies {expected}; "
            f"{REDOWNLOAD_HINT}"
        )
    if expected == header_size:  # frombuffer rejects an empty range
        return torch.empty(shape, dtype=torch.uint8)
    return torch.frombuffer(data, dtype=torch.uint8, offset=header_size).reshape(shape)
