"""Reading a prepared directory for training: `open_prepared` gives each split as a `ShardImages`.

A `ShardImages` is an `EncodedImages`: sample i is one ``os.pread`` at the offset the index records, from shard
files each data worker process opens once and keeps open (at most OPEN_SHARDS at a time). pread never moves a
shared file offset, so forked workers cannot disturb one another; a forked or spawned worker opens its own
descriptors.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpctrain.data.decode import BadImageError
from hpctrain.data.packed import PackedStrings
from hpctrain.data.shards.index import INDEX_NAME, PREPARE_HINT, load_index
from hpctrain.errors import UserError

OPEN_SHARDS = 256  # shard files one process keeps open at most (the least recently opened is closed first)


@dataclass(frozen=True)
class ShardImages:
    """One split of a prepared directory: encoded images read from the tar shards by offset (an `EncodedImages`)."""

    root: str
    shard_names: tuple[str, ...]
    shards: np.ndarray  # int32, index into shard_names
    offsets: np.ndarray  # int64, byte offset of the image data in its shard
    sizes: np.ndarray  # int64
    labels: np.ndarray  # int64, index into `classes`
    paths: PackedStrings  # the original path relative to SRC
    classes: tuple[str, ...]
    stored: str = "jpeg"  # how images are stored (`prepare --format`): jpeg, or raw (decoded pixels)
    _files: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)  # pid -> {shard: fd}

    def __len__(self) -> int:
        return len(self.labels)

    def name(self, index: int) -> str:
        """How sample `index` is named in messages: its shard and original path."""
        return f"{os.path.join(self.root, self.shard_names[self.shards[index]])}:{self.paths[index]}"

    def read(self, index: int) -> bytes:
        shard = int(self.shards[index])
        size = int(self.sizes[index])
        try:
            data = os.pread(self._fd(shard), size, int(self.offsets[index]))
        except OSError as err:
            raise BadImageError(self.name(index), f"{err.strerror or err}; {PREPARE_HINT}") from err
        if len(data) != size:
            raise BadImageError(self.name(index), f"the shard ends early (truncated copy?); {PREPARE_HINT}")
        return data

    def subset(self, keep: np.ndarray) -> ShardImages:
        return dataclasses.replace(
            self,
            shards=self.shards[keep],
            offsets=self.offsets[keep],
            sizes=self.sizes[keep],
            labels=self.labels[keep],
            paths=self.paths[keep],
            _files={},
        )

    def _fd(self, shard: int) -> int:
        """This process's descriptor for `shard`, opened on first use; a forked worker opens its own."""
        pid = os.getpid()
        files = self._files.get(pid)
        if files is None:
            for inherited in self._files.values():  # a parent's, copied into this forked process
                for fd in inherited.values():
                    os.close(fd)
            self._files.clear()
            files = self._files[pid] = {}
        fd = files.get(shard)
        if fd is None:
            if len(files) >= OPEN_SHARDS:
                os.close(files.pop(next(iter(files))))
            fd = files[shard] = os.open(os.path.join(self.root, self.shard_names[shard]), os.O_RDONLY)
        return fd

    def __getstate__(self) -> dict:  # spawned workers get no descriptors; they open their own
        state = dict(self.__dict__)
        state["_files"] = {}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


@dataclass(frozen=True)
class PreparedData:
    root: str
    classes: tuple[str, ...]
    train: ShardImages
    val: ShardImages | None
    options: dict


def open_prepared(path: str | os.PathLike) -> PreparedData:
    """The splits of a prepared directory, after checking the index's format version and that its shards exist."""
    root = Path(path)
    index = load_index(root)
    splits = {}
    for split, entry in index["splits"].items():
        names = tuple(shard["name"] for shard in entry["shards"])
        missing = [name for name in names if not (root / name).is_file()]
        if missing:
            raise UserError(
                f"{root}: {len(missing)} shard(s) listed in {INDEX_NAME} are missing, e.g. "
                f"{missing[0]}; copy them back or {PREPARE_HINT}"
            )
        resized = [s["name"] for s in entry["shards"] if (root / s["name"]).stat().st_size != s["bytes"]]
        if resized:  # a sample's read would then end early, or read another sample's bytes
            raise UserError(
                f"{root / resized[0]}: its size differs from the one {INDEX_NAME} records (a truncated "
                f"or replaced copy?); copy it again, check with `hpctrain prepare imagenet --verify "
                f"{root}`, or {PREPARE_HINT}"
            )
        samples = entry["samples"]
        splits[split] = ShardImages(
            str(root),
            names,
            np.asarray(samples["shard"], dtype=np.int32),
            np.asarray(samples["offset"], dtype=np.int64),
            np.asarray(samples["size"], dtype=np.int64),
            np.asarray(samples["label"], dtype=np.int64),
            PackedStrings.of(samples["path"]),
            tuple(entry["classes"]),
            stored=index["options"].get("format", "jpeg"),
        )
    if "train" not in splits:
        raise UserError(f"{root}/{INDEX_NAME} has no train split; {PREPARE_HINT}")
    return PreparedData(str(root), splits["train"].classes, splits["train"], splits.get("val"), index["options"])
