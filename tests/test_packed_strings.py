"""`PackedStrings`, the compact image path list: behaves as the sequence of str it replaces."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from hpctrain.data.packed import PackedStrings

STRINGS = ["/data/a.jpg", "", "/data/ünïcode/b.JPEG", "/data/bad-\udcff-name.png", "/data/c.jpg"]


def test_indexing_iteration_and_pickling_give_back_the_strings() -> None:
    packed = PackedStrings.of(STRINGS)
    assert len(packed) == 5 and list(packed) == STRINGS
    assert packed[2] == STRINGS[2] and packed[np.int64(3)] == STRINGS[3] and packed[-1] == STRINGS[-1]
    assert pickle.loads(pickle.dumps(packed)) == packed
    with pytest.raises(IndexError):
        packed[5]


@pytest.mark.parametrize(
    "key",
    [np.array([4, 0, 2, 2]), np.array([True, False, True, False, True]), slice(1, 4), np.array([], dtype=np.int64)],
)
def test_subsets_are_the_strings_at_those_positions(key) -> None:
    expected = list(np.array(STRINGS, dtype=object)[key])
    assert list(PackedStrings.of(STRINGS)[key]) == expected


def test_size_is_the_utf8_bytes_plus_one_offset_each() -> None:
    packed = PackedStrings.of(STRINGS)
    assert packed.nbytes == sum(len(s.encode("utf-8", "surrogateescape")) for s in STRINGS) + 8 * (len(STRINGS) + 1)
