"""The shard index format (``index.json``): its constants, loading it, and checking its structure once.

`load_index` parses and checks an index (cached by file identity); `shard_members` lists a shard's samples from
its tar headers, for the writer (resuming) and the verifier. Nothing here writes, decodes images or opens a shard
for training: see `writer`, `reader` and `verify` beside it.
"""

from __future__ import annotations

import functools
import json
import os
import tarfile
from pathlib import Path

import numpy as np

from hpctrain.data.decode import MAX_IMAGE_BYTES
from hpctrain.errors import UserError
from hpctrain.fsutil import FileRefused, read_regular

FORMAT = "hpctrain-shards"
VERSION = 1
INDEX_NAME = "index.json"
SPLITS = ("train", "val")
PREPARE_HINT = "run `hpctrain prepare imagenet SRC OUT` to (re)build it"
MAX_INDEX_BYTES = 1 << 30  # ImageNet's index is about 100 MB


def is_prepared(path: str | os.PathLike) -> bool:
    """Whether `path` is a directory written by `hpctrain prepare` (it holds the index file)."""
    return (Path(path) / INDEX_NAME).is_file()


def load_index(root: Path) -> dict:
    """The parsed index of a prepared directory (cached by file identity: the recipe and the loader both ask)."""
    path = root / INDEX_NAME
    try:
        stat = path.stat()
    except OSError as err:
        raise UserError(f"{root}: no {INDEX_NAME} ({err.strerror}); {PREPARE_HINT}") from err
    return _load_index(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _load_index(path: str, mtime_ns: int, size: int) -> dict:
    try:
        index = json.loads(read_regular(path, MAX_INDEX_BYTES))
    except FileRefused as err:
        raise UserError(f"{path}: not a usable index ({err.reason}); {PREPARE_HINT}") from None
    except (OSError, ValueError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise UserError(f"{path}: unreadable index ({err}); {PREPARE_HINT}") from err
    except RecursionError:
        raise UserError(f"{path}: unreadable index (nested too deeply); {PREPARE_HINT}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise UserError(f"{path} is not an hpctrain shard index; {PREPARE_HINT}")
    if index.get("version") != VERSION:
        raise UserError(
            f"{path} has shard format version {_brief(index.get('version'))}, this hpctrain reads "
            f"version {VERSION}; {PREPARE_HINT} with this version"
        )
    problem = _index_problem(index)
    if problem:
        raise UserError(f"{path}: damaged index ({problem}); {PREPARE_HINT}")
    return index


def _index_problem(index: dict) -> str | None:
    """What is wrong with the structure of a parsed index (None: nothing). Everything training and --verify rely
    on is checked here, once, so that neither reads outside OUT, the wrong shard, or a short column:

    - options: a mapping; splits: a non-empty mapping of known split names, with a train split;
    - per split: classes, a non-empty list of distinct strings (the same for every split); shards, a list of
      {name, bytes, sha256, samples} whose name is a plain file name in OUT (no `/`, not `.` or `..`: never an
      absolute path or one that climbs out); samples, five columns of one length: shard (an index into shards),
      offset and size (whole numbers, the image inside its shard and at most MAX_IMAGE_BYTES), label (an index
      into classes) and path (strings); each shard's `samples` count matches the samples pointing at it;
      skipped, a list of strings when present.
    """
    if not isinstance(index.get("options"), dict):
        return "options is not a mapping"
    splits = index.get("splits")
    if not isinstance(splits, dict) or "train" not in splits:
        return "no train split"
    unknown = [name for name in splits if name not in SPLITS]
    if unknown:
        return f"unknown split {_brief(unknown[0])}"
    classes = None
    for split, entry in splits.items():
        problem = _split_problem(entry, classes)
        if problem:
            return f"{split}: {problem}"
        classes = entry["classes"]
    return None


def _split_problem(entry: object, classes: list | None) -> str | None:
    if not isinstance(entry, dict):
        return "not a mapping"
    names = entry.get("classes")
    if not isinstance(names, list) or not names or not all(isinstance(c, str) for c in names):
        return "classes is not a non-empty list of class names"
    if len(set(names)) != len(names):
        return "classes names a class twice"
    if classes is not None and names != classes:
        return "classes differ from the train split's"
    shards = entry.get("shards")
    if not isinstance(shards, list) or not all(isinstance(s, dict) for s in shards):
        return "shards is not a list of shard records"
    for number, shard in enumerate(shards):
        name = shard.get("name")
        if not isinstance(name, str) or not _plain_name(name):
            return f"shard {number} is named {_brief(name)}, not a file name inside OUT"
        if not all(_whole(shard.get(key)) for key in ("bytes", "samples")) or not isinstance(shard.get("sha256"), str):
            return f"shard {name} lacks a whole bytes/samples count or its sha256"
    skipped = entry.get("skipped", [])
    if not isinstance(skipped, list) or not all(isinstance(p, str) for p in skipped):
        return "skipped is not a list of paths"
    return _samples_problem(entry.get("samples"), shards, len(names))


def _samples_problem(samples: object, shards: list[dict], num_classes: int) -> str | None:
    columns = ("shard", "offset", "size", "label", "path")
    if not isinstance(samples, dict) or not all(isinstance(samples.get(c), list) for c in columns):
        return f"samples lacks one of the columns {', '.join(columns)}"
    lengths = {len(samples[c]) for c in columns}
    if len(lengths) != 1:
        return "the sample columns differ in length"
    for column in columns[:4]:  # set(map(type)), min and max run in C: ImageNet's 1.28M samples take milliseconds
        values = samples[column]
        if values and (set(map(type, values)) != {int} or min(values) < 0 or max(values) >= 2**62):
            return f"sample column {column} holds something other than whole numbers >= 0"
    if set(map(type, samples["path"])) - {str}:
        return "sample column path holds something other than strings"
    shard = np.asarray(samples["shard"], dtype=np.int64)
    offset = np.asarray(samples["offset"], dtype=np.int64)
    size = np.asarray(samples["size"], dtype=np.int64)
    label = np.asarray(samples["label"], dtype=np.int64)
    if len(shard) and shard.max() >= len(shards):
        return f"a sample points at shard {int(shard.max())}, but there are {len(shards)}"
    if len(label) and label.max() >= num_classes:
        return f"a sample has label {int(label.max())}, but there are {num_classes} classes"
    if len(size) and size.max() > MAX_IMAGE_BYTES:
        return f"a sample's size {int(size.max())} exceeds the {MAX_IMAGE_BYTES} bytes an image may have"
    ends = np.asarray([s["bytes"] for s in shards], dtype=np.int64)
    if len(shard) and (offset + size > ends[shard]).any():
        return "a sample lies beyond the end of its shard"
    counts = np.bincount(shard, minlength=len(shards))
    wrong = [s["name"] for s, n in zip(shards, counts.tolist()) if s["samples"] != n]
    if wrong:
        return f"shard {wrong[0]}'s sample count differs from the samples placed in it"
    return None


def _whole(value: object) -> bool:
    """A JSON whole number >= 0 that fits an int64 (a bool is not one)."""
    return type(value) is int and 0 <= value < 2**62


def _plain_name(name: str) -> bool:
    """A file name directly inside OUT: no directory part, not `.` or `..`, no NUL."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def _brief(value: object) -> str:
    """A value from the index for a message, never long."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def shard_name(split: str, number: int) -> str:
    return f"{split}-{number:06d}.tar"


def shard_members(path: Path) -> dict[int, tuple[tuple[int, int], int]]:
    """key -> ((image data offset, size), class index) for every sample of a shard, in file order."""
    samples: dict[int, tuple[tuple[int, int], int]] = {}
    image: dict[int, tuple[int, int]] = {}
    try:
        with tarfile.open(path, mode="r:") as tar:
            for member in tar:
                if not member.isfile():  # a directory, link or device: nothing hpctrain prepare writes
                    raise UserError(
                        f"{path}: member {member.name!r} is not a regular file, so this is no shard `hpctrain "
                        f"prepare` wrote; delete it and {PREPARE_HINT}"
                    )
                stem, _, extension = member.name.partition(".")
                key = int(stem)
                if extension == "cls":
                    data = tar.extractfile(member)
                    samples[key] = (image.pop(key), int(data.read() if data is not None else b""))
                else:
                    image[key] = (member.offset_data, member.size)
    except (tarfile.TarError, OSError, ValueError, KeyError) as err:
        raise UserError(f"{path}: not a readable shard ({err}); delete it and {PREPARE_HINT}") from err
    return samples
