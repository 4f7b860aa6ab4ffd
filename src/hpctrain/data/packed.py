"""A long list of strings (image paths) stored as one UTF-8 byte array plus offsets.

Why not a NumPy unicode array: its dtype is fixed-width, 4 bytes per character of the *longest* string, so
ImageNet's 1.28 M absolute paths take hundreds of MB, and every process that receives the list by pickling (DALI's
workers are started with spawn, once per pass) gets all of it. Here each string costs its UTF-8 length plus an
8-byte offset. Why not a list of str: forked data workers touching Python objects dirty their pages (reference
counts), duplicating the list in every worker; two flat NumPy arrays stay shared.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np


class PackedStrings:
    """Immutable sequence of str: `len`, `[i] -> str`, `[array or slice] -> PackedStrings`, iteration."""

    __slots__ = ("_data", "_offsets")

    def __init__(self, data: np.ndarray, offsets: np.ndarray) -> None:
        self._data = data  # uint8, the strings' UTF-8 bytes one after another
        self._offsets = offsets  # int64, len + 1: string i is data[offsets[i]:offsets[i + 1]]

    @classmethod
    def of(cls, strings: Iterable[str]) -> PackedStrings:
        encoded = [s.encode("utf-8", "surrogateescape") for s in strings]  # file names need not be valid UTF-8
        sizes = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        return cls(np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(), offsets)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            index = int(key)
            if index < 0:
                index += len(self)
            if not 0 <= index < len(self):
                raise IndexError(f"index {key} out of range for {len(self)} strings")
            start, end = self._offsets[index], self._offsets[index + 1]
            return self._data[start:end].tobytes().decode("utf-8", "surrogateescape")
        return self._take(np.arange(len(self))[key] if isinstance(key, slice) else np.asarray(key))

    def _take(self, indices: np.ndarray) -> PackedStrings:
        """The strings at `indices` (ints, or a boolean mask), in that order, packed anew."""
        if indices.dtype == bool:
            indices = np.flatnonzero(indices)
        starts, ends = self._offsets[indices], self._offsets[indices + 1]
        sizes = ends - starts
        offsets = np.zeros(len(indices) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        # Byte positions of every kept string, built without a Python loop: each string's run of positions.
        positions = np.repeat(starts - offsets[:-1], sizes) + np.arange(offsets[-1], dtype=np.int64)
        return PackedStrings(self._data[positions], offsets)

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PackedStrings):
            return NotImplemented
        return np.array_equal(self._offsets, other._offsets) and np.array_equal(self._data, other._data)

    def __hash__(self) -> int:
        return hash((len(self), self._data.tobytes()))

    def __repr__(self) -> str:
        return f"PackedStrings({len(self)} strings, {self.nbytes} bytes)"

    @property
    def nbytes(self) -> int:
        return int(self._data.nbytes + self._offsets.nbytes)

    def __getstate__(self) -> tuple[np.ndarray, np.ndarray]:
        return self._data, self._offsets

    def __setstate__(self, state: tuple[np.ndarray, np.ndarray]) -> None:
        self._data, self._offsets = state
