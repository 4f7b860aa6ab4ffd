"""Packed image shards: image folders written once into large WebDataset-style tar files, read by byte offset.

Millions of small files are slow on NFS and Lustre (every open is a metadata round trip); a few hundred 1 GB
files are not. ``hpctrain prepare imagenet SRC OUT`` writes, in OUT:

- ``train-000000.tar``, ``train-000001.tar``, ... and ``val-000000.tar``, ...: plain POSIX tar files in the
  WebDataset layout (each sample is ``<key>.jpg`` or ``.png`` (the image, as its format) followed by ``<key>.cls``
  (its class index as decimal text)), readable by the ``webdataset`` library and by DALI's webdataset reader. The
  key is the sample's position in the split's sorted source list (so a skipped bad image leaves a gap). Member
  headers carry no time stamps, owners or host names: the same SRC and options give the same bytes.
- ``index.json`` (`INDEX_NAME`): format name and version, the options used, and per split the class names in
  training-index order, each shard's name, size and sha256, and per sample (as columns) its shard, the byte
  offset and size of its image data inside the shard, its label and its original path relative to SRC.

Training reads samples through the index (`ShardImages`, an `EncodedImages`): one ``os.pread`` at a known offset
per sample, from shard files each data worker process opens once and keeps open. pread never moves a shared file
offset, so forked workers cannot disturb one another. Sample i of a split is the i-th packed sample, which, with
``--keep-size`` and no skipped image, is sample i of the image folders too: the same seed then gives the same
batches and crops from either.

Writing (`prepare`) is resumable: each shard is written under a temporary name and renamed when complete; a rerun
with the same SRC and options keeps the shards that exist and continues from the first missing one, giving the
same bytes as an uninterrupted run. The options and the source listing are recorded (`MANIFEST_NAME`) when a
preparation starts, so a rerun with different ones is refused instead of mixing two preparations.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import multiprocessing
import os
import re
import signal
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpctrain.data.decode import MAX_IMAGE_BYTES, BadImageError, read_image_file
from hpctrain.data.imagefolder import ImageSet, find_image_folders
from hpctrain.data.packed import PackedStrings
from hpctrain.errors import UserError
from hpctrain.fsutil import FileRefused, fsync_dir, is_no_space, read_regular, write_atomic

FORMAT = "hpctrain-shards"
VERSION = 1
INDEX_NAME = "index.json"
MANIFEST_NAME = ".hpctrain-prepare.json"
LOCK_NAME = ".hpctrain-prepare.lock"
SPLITS = ("train", "val")
DEFAULT_MAX_SIDE = 320
DEFAULT_JPEG_QUALITY = 95
DEFAULT_SHARD_SIZE = 10**9
TAR_BLOCK = 512
OPEN_SHARDS = 256  # shard files one process keeps open at most (the least recently opened is closed first)
PREPARE_HINT = "run `hpctrain prepare imagenet SRC OUT` to (re)build it"
MAX_INDEX_BYTES = 1 << 30  # ImageNet's index is about 100 MB


def is_prepared(path: str | os.PathLike) -> bool:
    """Whether `path` is a directory written by `hpctrain prepare` (it holds the index file)."""
    return (Path(path) / INDEX_NAME).is_file()


# ---------------------------------------------------------------- reading


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
        return dataclasses.replace(self, shards=self.shards[keep], offsets=self.offsets[keep],
                                   sizes=self.sizes[keep], labels=self.labels[keep], paths=self.paths[keep],
                                   _files={})

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
            raise UserError(f"{root}: {len(missing)} shard(s) listed in {INDEX_NAME} are missing, e.g. "
                            f"{missing[0]}; copy them back or {PREPARE_HINT}")
        resized = [s["name"] for s in entry["shards"] if (root / s["name"]).stat().st_size != s["bytes"]]
        if resized:  # a sample's read would then end early, or read another sample's bytes
            raise UserError(f"{root / resized[0]}: its size differs from the one {INDEX_NAME} records (a truncated "
                            f"or replaced copy?); copy it again, check with `hpctrain prepare imagenet --verify "
                            f"{root}`, or {PREPARE_HINT}")
        samples = entry["samples"]
        splits[split] = ShardImages(
            str(root), names, np.asarray(samples["shard"], dtype=np.int32),
            np.asarray(samples["offset"], dtype=np.int64), np.asarray(samples["size"], dtype=np.int64),
            np.asarray(samples["label"], dtype=np.int64), PackedStrings.of(samples["path"]),
            tuple(entry["classes"]))
    if "train" not in splits:
        raise UserError(f"{root}/{INDEX_NAME} has no train split; {PREPARE_HINT}")
    return PreparedData(str(root), splits["train"].classes, splits["train"], splits.get("val"), index["options"])


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
        raise UserError(f"{path} has shard format version {_brief(index.get('version'))}, this hpctrain reads "
                        f"version {VERSION}; {PREPARE_HINT} with this version")
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


# ---------------------------------------------------------------- writing


@dataclass(frozen=True)
class PrepareConfig:
    src: Path
    out: Path
    max_side: int | None = DEFAULT_MAX_SIDE  # None: keep every image as it is (--keep-size)
    jpeg_quality: int = DEFAULT_JPEG_QUALITY
    shard_size: int = DEFAULT_SHARD_SIZE
    val_path: Path | None = None
    val_labels: Path | None = None
    skip_bad_images: bool = False
    workers: int = 1

    def __post_init__(self) -> None:
        if self.max_side is not None and self.max_side < 1:
            raise UserError(f"--max-side {self.max_side}: give the largest shorter side in pixels, e.g. 320, "
                            "or --keep-size")
        if not 1 <= self.jpeg_quality <= 100:
            raise UserError(f"--jpeg-quality {self.jpeg_quality}: use 1..100 (default {DEFAULT_JPEG_QUALITY})")
        if self.shard_size < 1:
            raise UserError(f"--shard-size {self.shard_size}: use a positive size such as 1GB or 500MB")
        if self.workers < 1:
            raise UserError(f"--workers {self.workers}: use 1 or more encoding processes")
        if self.out.exists() and not self.out.is_dir():
            raise UserError(f"{self.out} exists and is not a directory; choose a new OUT directory")
        src, out = self.src.resolve(), self.out.resolve()
        if src == out:
            raise UserError(f"OUT {self.out} is SRC; write the shards to a directory of their own")
        if out.is_relative_to(src):  # SRC would gain a class (or split) folder of shards
            raise UserError(f"OUT {self.out} lies inside SRC {self.src}; write the shards to a directory outside it")
        if src.is_relative_to(out):
            raise UserError(f"SRC {self.src} lies inside OUT {self.out}; write the shards to a directory of their own")
        if self.val_path is not None and out.is_relative_to(self.val_path.resolve()):
            raise UserError(f"OUT {self.out} lies inside --val-path {self.val_path}; write the shards outside it")

    def options(self) -> dict:
        """What decides the output's bytes, recorded in the manifest and the index."""
        return {"max_side": self.max_side, "jpeg_quality": self.jpeg_quality if self.max_side else None,
                "shard_size": self.shard_size}


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'1GB' (10**9), '512MiB' (2**29), '64k', '1000' (bytes) -> bytes."""
    match = _SIZE.match(text)
    if not match:
        raise UserError(f"--shard-size {text!r}: give a size such as 1GB, 500MB, 256MiB or a number of bytes")
    number, unit, binary = match.groups()
    factor = (1024 if binary else 1000) ** "_kmgt".find(unit.lower() or "_")
    size = int(float(number) * factor)
    if size < 1:
        raise UserError(f"--shard-size {text!r}: must be at least one byte, e.g. 1GB")
    return size


@dataclass
class SplitResult:
    samples: dict[str, list]  # the index's columns
    shards: list[dict]  # name, bytes, sha256, samples
    skipped: list[str]  # relative paths of bad images left out


class Reporter:
    """What `prepare` tells the user; the CLI's rich progress bar implements it, tests pass a silent one."""

    def start(self, split: str, total: int, done: int) -> None: ...

    def advance(self, n: int) -> None: ...

    def note(self, message: str) -> None: ...


def prepare(cfg: PrepareConfig, reporter: Reporter | None = None) -> dict:
    """Pack SRC's image folders into shards in OUT (see the module docstring); returns the index written."""
    from hpctrain.fsutil import DirectoryInUse, DirectoryLock

    reporter = reporter or Reporter()
    found = find_image_folders(cfg.src, cfg.val_path, cfg.val_labels)
    sets = {"train": found.train, **({"val": found.val} if found.val is not None else {})}
    manifest = {"format": FORMAT, "version": VERSION, "options": cfg.options(),
                "source": {split: _listing_digest(images) for split, images in sets.items()}}
    try:
        lock = DirectoryLock.acquire(cfg.out, LOCK_NAME, f"hpctrain prepare, pid {os.getpid()}")
    except DirectoryInUse:
        raise UserError(f"{cfg.out} is being written by another `hpctrain prepare`; wait for it to finish, or "
                        "stop it and run this again (it continues where that one stopped)") from None
    try:
        _claim(cfg.out, manifest)
        _remove_temporaries(cfg.out)
        results = {}
        with _encoder_pool(cfg.workers) as pool:
            for split, images in sets.items():
                encode = functools.partial(_encode, max_side=cfg.max_side, quality=cfg.jpeg_quality)
                results[split] = _write_split(cfg, split, images, pool, encode, reporter)
        index = {"format": FORMAT, "version": VERSION, "options": cfg.options(),
                 "splits": {split: {"classes": list(found.classes), "shards": r.shards, "samples": r.samples,
                                    "skipped": r.skipped} for split, r in results.items()}}
        write_atomic(cfg.out / INDEX_NAME, json.dumps(index, separators=(",", ":")).encode())
        fsync_dir(cfg.out)
        reporter.note("verifying what was written")
        verify(cfg.out, reporter)
        return index
    except OSError as err:  # the unfinished shard is already removed (_write_split); complete ones stay
        raise _write_error(cfg.out, err) from None
    finally:
        lock.release()


def _write_error(out: Path, err: OSError) -> UserError:
    """A one-line error for a failed write into OUT (a full disk, above all), saying how to continue."""
    again = "rerun the same command to continue from the complete shards"
    if is_no_space(err):
        return UserError(f"{out}: {os.strerror(err.errno)} while writing the shards; free space there (or choose an "
                         f"OUT with room: about the size of SRC at most) and {again}")
    where = f" ({err.filename})" if err.filename else ""
    return UserError(f"{out}: cannot write the shards{where}: {err.strerror or err}; fix that and {again}")


def _claim(out: Path, manifest: dict) -> None:
    """Record what this OUT is being prepared from, or refuse if it was started with something else."""
    path = out / MANIFEST_NAME
    if path.is_file():
        try:
            before = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            before = None
        if before != manifest:
            raise UserError(f"{out} holds a preparation made with other options or from other images "
                            f"({_difference(before, manifest)}); rerun with the same SRC and options to finish it, "
                            "or choose a new OUT directory")
        return
    if any(out.glob("*-[0-9][0-9][0-9][0-9][0-9][0-9].tar")) or (out / INDEX_NAME).exists():
        raise UserError(f"{out} already holds shards not made by this preparation; choose a new OUT directory")
    write_atomic(path, json.dumps(manifest, indent=1).encode())


def _difference(before: dict | None, now: dict) -> str:
    if not isinstance(before, dict):
        return f"unreadable {MANIFEST_NAME}"
    if before.get("options") != now["options"]:
        return f"then {before.get('options')}, now {now['options']}"
    return "the list of source images changed"


def _remove_temporaries(out: Path) -> None:
    """Partial shards of an interrupted run (never under a final name): removed, the run starts them again."""
    for path in out.glob(".*.tar.tmp-*"):
        path.unlink(missing_ok=True)


def _listing_digest(images: ImageSet) -> str:
    digest = hashlib.sha256()
    for path, label in zip(images.paths, images.labels):
        digest.update(os.fsencode(f"{os.path.relpath(path, images.root)}\0{label}\n"))  # any file name's bytes
    digest.update(os.fsencode("\0".join(images.classes)))
    return digest.hexdigest()


def shard_name(split: str, number: int) -> str:
    return f"{split}-{number:06d}.tar"


def _write_split(cfg: PrepareConfig, split: str, images: ImageSet, pool, encode: Callable,
                 reporter: Reporter) -> SplitResult:
    """Keep the complete shards already in OUT (a prefix), then encode and write the rest in order."""
    result = SplitResult({"shard": [], "offset": [], "size": [], "label": [], "path": []}, [], [])
    relative = [os.path.relpath(p, images.root) for p in images.paths]
    recorded = _recorded_checksums(cfg.out, split)
    number, start = 0, 0
    while (cfg.out / shard_name(split, number)).is_file():
        path = cfg.out / shard_name(split, number)
        checksum = _sha256(path)
        if recorded.get(path.name, checksum) != checksum:
            reporter.note(f"{path.name}: its sha256 differs from {INDEX_NAME}; writing it and the shards after it "
                          "again")
            break
        members = _read_shard(path, checksum, result, relative)
        keys = [key for key, _, _ in members]
        if not keys or keys[0] < start:
            raise UserError(f"{cfg.out / shard_name(split, number)} does not continue the shards before it; "
                            "delete it and those after it, and rerun to rebuild them")
        result.skipped.extend(relative[start:keys[0]])  # bad images between the shards were skipped
        result.skipped.extend(relative[i] for a, b in zip(keys, keys[1:]) for i in range(a + 1, b))
        start = keys[-1] + 1
        number += 1
    reporter.start(split, len(images), start)
    if start == len(images):
        return result
    work = [(str(images.paths[i]),) for i in range(start, len(images))]
    writer = _ShardWriter(cfg.out, split, number, cfg.shard_size, result)
    try:
        for i, encoded in enumerate(pool.imap(encode, work, chunksize=8), start=start):
            reporter.advance(1)
            if isinstance(encoded, str):
                if not cfg.skip_bad_images:
                    raise UserError(f"{images.paths[i]}: cannot decode this image ({encoded}); replace or delete "
                                    "the file, or pass --skip-bad-images to leave it out of the shards")
                result.skipped.append(relative[i])
                continue
            data, extension = encoded
            writer.add(i, data, extension, int(images.labels[i]), relative[i])
        writer.finish()
    finally:
        writer.abandon()
    return result


class _ShardWriter:
    """Fills shards one after another: a sample that would make the shard exceed `limit` starts the next one."""

    def __init__(self, out: Path, split: str, number: int, limit: int, result: SplitResult) -> None:
        self.out, self.split, self.number, self.limit, self.result = out, split, number, limit, result
        self.tar: tarfile.TarFile | None = None
        self.file = None
        self.temporary: Path | None = None
        self.count = 0

    def add(self, key: int, data: bytes, extension: str, label: int, path: str) -> None:
        cls = str(label).encode()
        needed = 2 * TAR_BLOCK + _padded(len(data)) + _padded(len(cls))
        if self.tar is not None and self.count and _closed_size(self.tar.offset + needed) > self.limit:
            self.finish()
        if self.tar is None:
            self._open()
        assert self.tar is not None
        offset = _add_member(self.tar, f"{key:08d}.{extension}", data)
        _add_member(self.tar, f"{key:08d}.cls", cls)
        self.count += 1
        columns = self.result.samples
        for column, value in (("shard", len(self.result.shards)), ("offset", offset), ("size", len(data)),
                              ("label", label), ("path", path)):
            columns[column].append(value)

    def _open(self) -> None:
        name = shard_name(self.split, self.number)
        self.temporary = self.out / f".{name}.tmp-{os.getpid()}"
        self.file = open(self.temporary, "wb")
        self.tar = tarfile.open(fileobj=self.file, mode="w", format=tarfile.USTAR_FORMAT)
        self.count = 0

    def finish(self) -> None:
        """Close the open shard and give it its final name (fsynced first, so a crash never leaves half of it)."""
        if self.tar is None:
            return
        assert self.file is not None and self.temporary is not None
        self.tar.close()
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        final = self.out / shard_name(self.split, self.number)
        os.replace(self.temporary, final)
        fsync_dir(self.out)
        self.result.shards.append({"name": final.name, "bytes": final.stat().st_size, "sha256": _sha256(final),
                                   "samples": self.count})
        self.tar = self.file = self.temporary = None
        self.number += 1

    def abandon(self) -> None:
        """After an error or an interruption: the unfinished shard is removed (complete ones stay for a rerun)."""
        if self.file is not None:
            try:
                self.file.close()
            except OSError:
                pass  # flushing the rest fails on a full disk; the file goes anyway
        if self.temporary is not None:
            self.temporary.unlink(missing_ok=True)
        self.tar = self.file = self.temporary = None


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> int:
    """Append one member with fixed metadata (no time stamp, owner or host); returns its data's offset."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = len(data), 0, 0o444, 0, 0, "", ""
    tar.addfile(info, io.BytesIO(data))
    return tar.offset - _padded(len(data))


def _closed_size(offset: int) -> int:
    """The file size of a tar closed at `offset`: two zero blocks, then padding to whole records."""
    return -(-(offset + 2 * TAR_BLOCK) // tarfile.RECORDSIZE) * tarfile.RECORDSIZE


def _padded(n: int) -> int:
    return -(-n // TAR_BLOCK) * TAR_BLOCK


def _recorded_checksums(out: Path, split: str) -> dict[str, str]:
    """Shard name -> sha256 from the index of an earlier complete run (none when there is none)."""
    try:
        index = load_index(out)
    except UserError:
        return {}
    return {shard["name"]: shard["sha256"] for shard in index["splits"].get(split, {}).get("shards", [])}


def _read_shard(path: Path, checksum: str, result: SplitResult, relative: list[str]) -> list[tuple[int, int, int]]:
    """Take a complete shard left by an earlier run into `result`; returns its (key, offset, size) images."""
    members = _shard_members(path)
    images = []
    for key, (image, cls) in members.items():
        if key >= len(relative):
            raise UserError(f"{path}: sample {key} is not in the source listing; delete the shard and rerun")
        columns = result.samples
        for column, value in (("shard", len(result.shards)), ("offset", image[0]), ("size", image[1]),
                              ("label", cls), ("path", relative[key])):
            columns[column].append(value)
        images.append((key, image[0], image[1]))
    result.shards.append({"name": path.name, "bytes": path.stat().st_size, "sha256": checksum,
                          "samples": len(members)})
    return images


def _shard_members(path: Path) -> dict[int, tuple[tuple[int, int], int]]:
    """key -> ((image data offset, size), class index) for every sample of a shard, in file order."""
    samples: dict[int, tuple[tuple[int, int], int]] = {}
    image: dict[int, tuple[int, int]] = {}
    try:
        with tarfile.open(path, mode="r:") as tar:
            for member in tar:
                stem, _, extension = member.name.partition(".")
                key = int(stem)
                if extension == "cls":
                    data = tar.extractfile(member)
                    assert data is not None
                    samples[key] = (image.pop(key), int(data.read()))
                else:
                    image[key] = (member.offset_data, member.size)
    except (tarfile.TarError, OSError, ValueError, KeyError) as err:
        raise UserError(f"{path}: not a readable shard ({err}); delete it and {PREPARE_HINT}") from err
    return samples


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------- encoding (in worker processes)


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


def _star(function: Callable, item: tuple):  # type: ignore[no-untyped-def]
    return function(*item)


def _encoder_pool(workers: int) -> _SerialPool | _StarPool:
    return _SerialPool() if workers <= 1 else _StarPool(workers)


def _encode(path: str, max_side: int | None, quality: int) -> tuple[bytes, str] | str:
    """The bytes to store for the image file `path` and their extension, or why it cannot be read (a str).

    Kept byte for byte when its shorter side is at most `max_side` (or always, without `max_side`) and it is a
    JPEG or PNG; otherwise decoded, shrunk so the shorter side is `max_side` (Lanczos), and re-encoded: JPEG at
    `quality` for JPEG sources, PNG (lossless) for the other formats. Every stored image is checked with the
    training decoder, so a file training could not read is reported now, by name.
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
            if kind in ("JPEG", "PNG") and (max_side is None or min(width, height) <= max_side):
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


def _reencode(img, max_side: int | None, quality: int) -> tuple[bytes, str]:  # type: ignore[no-untyped-def]
    from PIL import Image

    width, height = img.size
    size = (width, height)
    if max_side is not None and min(width, height) > max_side:
        factor = max_side / min(width, height)
        size = (max(1, round(width * factor)), max(1, round(height * factor)))
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


# ---------------------------------------------------------------- verification


def verify(root: str | os.PathLike, reporter: Reporter | None = None) -> int:
    """Check a prepared directory against its index: every shard's size and sha256, and that each sample's offset
    and size are those of its image member (and its class member says its label). Returns the samples checked."""
    reporter = reporter or Reporter()
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: no such directory; give the OUT directory of `hpctrain prepare imagenet SRC OUT`")
    index = load_index(root)
    checked = 0
    for split, entry in index["splits"].items():
        samples = entry["samples"]
        reporter.start(f"verify {split}", len(samples["shard"]), 0)
        by_shard: dict[int, list[int]] = {}
        for i, shard in enumerate(samples["shard"]):
            by_shard.setdefault(shard, []).append(i)
        for number, shard in enumerate(entry["shards"]):
            path = root / shard["name"]
            fix = (f"delete it and rerun `hpctrain prepare imagenet SRC {root}` with the same options "
                   "(it rebuilds from the first missing shard), or copy the shard again")
            if not path.is_file():
                raise UserError(f"{path}: shard missing; {fix}")
            if path.stat().st_size != shard["bytes"] or _sha256(path) != shard["sha256"]:
                raise UserError(f"{path}: corrupted shard (its size or sha256 differs from {INDEX_NAME}); {fix}")
            members = {offset: (size, label) for (offset, size), label in _shard_members(path).values()}
            for i in by_shard.get(number, []):
                if members.get(samples["offset"][i]) != (samples["size"][i], samples["label"][i]):
                    raise UserError(f"{path}: {INDEX_NAME} places sample {samples['path'][i]} at byte "
                                    f"{samples['offset'][i]}, where the shard holds no such member; {fix}")
            if len(members) != shard["samples"]:
                raise UserError(f"{path}: holds {len(members)} samples, {INDEX_NAME} says {shard['samples']}; {fix}")
            reporter.advance(len(by_shard.get(number, [])))
            checked += len(by_shard.get(number, []))
    return checked


__all__ = [
    "INDEX_NAME",
    "PrepareConfig",
    "PreparedData",
    "Reporter",
    "ShardImages",
    "is_prepared",
    "open_prepared",
    "parse_size",
    "prepare",
    "verify",
]
