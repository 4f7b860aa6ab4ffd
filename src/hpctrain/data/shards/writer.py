"""`prepare`: image folders packed once into shard files plus their index (see the package docstring for the
layout); `PrepareConfig` and `parse_size` are its options.

Writing is resumable: each shard is written under a temporary name, fsynced and renamed when complete; a rerun
with the same SRC and options keeps the complete shards (a prefix, checked against the index of an earlier run
when there is one) and continues from the first missing one, giving the same bytes as an uninterrupted run. The
options and a digest of the source listing are recorded (MANIFEST_NAME) when a preparation starts, so a rerun
with different ones is refused instead of mixing two preparations; a lock keeps a second `prepare` out. Each shard
this preparation completes is recorded with its sha256 (JOURNAL_NAME): a rerun keeps only shards that it (or the
index of a complete run) names with those bytes, so a shard that someone else put in OUT is never taken into the
index, but written again. A shard's temporary is made afresh (O_EXCL) and renamed. Tar
members carry no time stamps, owners or host names: the same SRC and options give the same bytes.
"""

from __future__ import annotations

import logging
import functools
import hashlib
import io
import json
import os
import re
import secrets
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpctrain.data.imagefolder import ImageSet, find_image_folders
from hpctrain.data.shards.encode import encode_image, encoder_pool
from hpctrain.data.shards.index import FORMAT, INDEX_NAME, VERSION, load_index, shard_members, shard_name
from hpctrain.data.shards.verify import Reporter, verify
from hpctrain.errors import UserError
from hpctrain.readback import read_json
from hpctrain.fsutil import (
    DirectoryInUse,
    DirectoryLock,
    LocksUnsupported,
    fsync_dir,
    is_no_space,
    remove_temporaries,
    sha256_file,
    write_atomic,
)

log = logging.getLogger(__name__)

MANIFEST_NAME = ".hpctrain-prepare.json"
JOURNAL_NAME = ".hpctrain-prepare-shards.json"  # {split: {shard name: sha256}} of the shards this preparation wrote
MAX_JOURNAL_BYTES = 1 << 24
LOCK_NAME = ".hpctrain-prepare.lock"
DEFAULT_MAX_SIDE = 320
DEFAULT_JPEG_QUALITY = 95
DEFAULT_SHARD_SIZE = 10**9
TAR_BLOCK = 512
STORED_FORMATS = ("jpeg", "raw")
"""How images are stored: jpeg (JPEGs and PNGs as they are or re-encoded, decoded at every read) or raw (decoded RGB
pixels: several times the bytes, nothing left to decode)."""


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
    format: str = "jpeg"  # "raw": decoded RGB pixels (binary PPM members), see STORED_FORMATS

    def __post_init__(self) -> None:
        if self.format not in STORED_FORMATS:
            raise UserError(f"--format {self.format!r}: choose one of {', '.join(STORED_FORMATS)}")
        if self.max_side is not None and self.max_side < 1:
            raise UserError(
                f"--max-side {self.max_side}: give the largest shorter side in pixels, e.g. 320, or --keep-size"
            )
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
        return {
            "max_side": self.max_side,
            "jpeg_quality": self.jpeg_quality if self.max_side else None,
            "shard_size": self.shard_size,
            # Recorded only when not the default, so a preparation made before the choice existed still matches.
            **({"format": self.format} if self.format != "jpeg" else {}),
        }


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


def prepare(cfg: PrepareConfig, reporter: Reporter | None = None) -> dict:
    """Pack SRC's image folders into shards in OUT (see the package docstring); returns the index written."""
    reporter = reporter or Reporter()
    found = find_image_folders(cfg.src, cfg.val_path, cfg.val_labels)
    sets = {"train": found.train, **({"val": found.val} if found.val is not None else {})}
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "options": cfg.options(),
        "source": {split: _listing_digest(images) for split, images in sets.items()},
    }
    lock: DirectoryLock | None = None
    try:
        lock = DirectoryLock.acquire(cfg.out, LOCK_NAME, f"hpctrain prepare, pid {os.getpid()}")
    except DirectoryInUse:
        raise UserError(
            f"{cfg.out} is being written by another `hpctrain prepare`; wait for it to finish, or "
            "stop it and run this again (it continues where that one stopped)"
        ) from None
    except LocksUnsupported as err:  # as a training run does: go on, having said what is not guarded
        log.warning(str(err))
    try:
        journal = _claim(cfg.out, manifest)
        _remove_temporaries(cfg.out)
        results = {}
        with encoder_pool(cfg.workers) as pool:
            for split, images in sets.items():
                encode = functools.partial(
                    encode_image, max_side=cfg.max_side, quality=cfg.jpeg_quality, raw=cfg.format == "raw"
                )
                results[split] = _write_split(cfg, split, images, pool, encode, reporter, journal)
        index = {
            "format": FORMAT,
            "version": VERSION,
            "options": cfg.options(),
            "splits": {
                split: {"classes": list(found.classes), "shards": r.shards, "samples": r.samples, "skipped": r.skipped}
                for split, r in results.items()
            },
        }
        write_atomic(cfg.out / INDEX_NAME, json.dumps(index, separators=(",", ":")).encode())
        fsync_dir(cfg.out)
        reporter.note("verifying what was written")
        verify(cfg.out, reporter)
        return index
    except OSError as err:  # the unfinished shard is already removed (_write_split); complete ones stay
        raise _write_error(cfg.out, err) from None
    finally:
        if lock is not None:
            lock.release()


def _write_error(out: Path, err: OSError) -> UserError:
    """A one-line error for a failed write into OUT (a full disk, above all), saying how to continue."""
    again = "rerun the same command to continue from the complete shards"
    if is_no_space(err):
        return UserError(
            f"{out}: {os.strerror(err.errno)} while writing the shards; free space there (or choose an "
            f"OUT with room: about the size of SRC at most) and {again}"
        )
    where = f" ({err.filename})" if err.filename else ""
    return UserError(f"{out}: cannot write the shards{where}: {err.strerror or err}; fix that and {again}")


def _claim(out: Path, manifest: dict) -> _Journal:
    """Record what this OUT is being prepared from, or refuse if it was started with something else; returns the
    record of the shards this preparation has written (empty for a new one)."""
    path = out / MANIFEST_NAME
    if path.is_file():
        try:
            before = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            before = None
        if before != manifest:
            raise UserError(
                f"{out} holds a preparation made with other options or from other images "
                f"({_difference(before, manifest)}); rerun with the same SRC and options to finish it, "
                "or choose a new OUT directory"
            )
        return _Journal.load(out)
    if any(out.glob("*-[0-9][0-9][0-9][0-9][0-9][0-9].tar")) or (out / INDEX_NAME).exists():
        raise UserError(f"{out} already holds shards not made by this preparation; choose a new OUT directory")
    journal = _Journal(out, {})
    journal.save()  # before the manifest: a journal of an earlier preparation never counts for this one
    write_atomic(path, json.dumps(manifest, indent=1).encode())
    return journal


class _Journal:
    """The shards this preparation has completed, by split: name -> sha256 (JOURNAL_NAME, replaced atomically)."""

    def __init__(self, out: Path, written: dict[str, dict[str, str]]) -> None:
        self.out, self.written = out, written

    @classmethod
    def load(cls, out: Path) -> _Journal:
        """The journal of the preparation under way; an unreadable or malformed one records nothing (every shard
        is then written again)."""
        try:
            data = read_json(out / JOURNAL_NAME, MAX_JOURNAL_BYTES)
        except (OSError, UserError):
            data = None
        valid = isinstance(data, dict) and all(
            isinstance(split, dict) and all(isinstance(v, str) for v in split.values()) for split in data.values()
        )
        return cls(out, data if valid else {})

    def shards(self, split: str) -> dict[str, str]:
        return dict(self.written.get(split, {}))

    def add(self, split: str, name: str, sha256: str) -> None:
        self.written.setdefault(split, {})[name] = sha256
        self.save()

    def save(self) -> None:
        write_atomic(self.out / JOURNAL_NAME, json.dumps(self.written, separators=(",", ":")).encode())


def _difference(before: dict | None, now: dict) -> str:
    if not isinstance(before, dict):
        return f"unreadable {MANIFEST_NAME}"
    if before.get("options") != now["options"]:
        return f"then {before.get('options')}, now {now['options']}"
    return "the list of source images changed"


def _remove_temporaries(out: Path) -> None:
    """What an interrupted run left half-written under no final name (partial shards; the temporaries of the
    manifest, journal and index not yet renamed): removed, under the directory's lock, and written again."""
    for pattern in ("*.tar", MANIFEST_NAME, JOURNAL_NAME, INDEX_NAME):
        remove_temporaries(out, pattern)


def _listing_digest(images: ImageSet) -> str:
    digest = hashlib.sha256()
    for path, label in zip(images.paths, images.labels):
        digest.update(os.fsencode(f"{os.path.relpath(path, images.root)}\0{label}\n"))  # any file name's bytes
    digest.update(os.fsencode("\0".join(images.classes)))
    return digest.hexdigest()


def _write_split(
    cfg: PrepareConfig,
    split: str,
    images: ImageSet,
    pool,
    encode: Callable,
    reporter: Reporter,
    journal: _Journal,
) -> SplitResult:
    """Keep the complete shards already in OUT that this preparation wrote (a prefix), then encode and write the
    rest in order."""
    result = SplitResult({"shard": [], "offset": [], "size": [], "label": [], "path": []}, [], [])
    relative = [os.path.relpath(p, images.root) for p in images.paths]
    recorded = {**journal.shards(split), **_recorded_checksums(cfg.out, split)}
    number, start = 0, 0
    while (cfg.out / shard_name(split, number)).is_file():
        path = cfg.out / shard_name(split, number)
        checksum = sha256_file(path).sha256
        if recorded.get(path.name) != checksum:
            why = "this preparation did not write it" if path.name not in recorded else "its sha256 differs"
            reporter.note(
                f"{path.name}: {why} ({JOURNAL_NAME}, {INDEX_NAME}); writing it and the shards after it again"
            )
            break
        members = _read_shard(path, checksum, result, relative)
        keys = [key for key, _, _ in members]
        if not keys or keys[0] < start:
            raise UserError(
                f"{cfg.out / shard_name(split, number)} does not continue the shards before it; "
                "delete it and those after it, and rerun to rebuild them"
            )
        result.skipped.extend(relative[start : keys[0]])  # bad images between the shards were skipped
        result.skipped.extend(relative[i] for a, b in zip(keys, keys[1:]) for i in range(a + 1, b))
        start = keys[-1] + 1
        number += 1
    reporter.start(split, len(images), start)
    if start == len(images):
        return result
    work = [(str(images.paths[i]),) for i in range(start, len(images))]
    writer = _ShardWriter(cfg.out, split, number, cfg.shard_size, result, journal)
    try:
        for i, encoded in enumerate(pool.imap(encode, work, chunksize=8), start=start):
            reporter.advance(1)
            if isinstance(encoded, str):
                if not cfg.skip_bad_images:
                    raise UserError(
                        f"{images.paths[i]}: cannot decode this image ({encoded}); replace or delete "
                        "the file, or pass --skip-bad-images to leave it out of the shards"
                    )
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

    def __init__(self, out: Path, split: str, number: int, limit: int, result: SplitResult, journal: _Journal) -> None:
        self.out, self.split, self.number, self.limit, self.result = out, split, number, limit, result
        self.journal = journal
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
        for column, value in (
            ("shard", len(self.result.shards)),
            ("offset", offset),
            ("size", len(data)),
            ("label", label),
            ("path", path),
        ):
            columns[column].append(value)

    def _open(self) -> None:
        name = shard_name(self.split, self.number)
        self.temporary = self.out / f".{name}.tmp-{secrets.token_hex(8)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW  # a fresh file: never a planted link or FIFO
        self.file = os.fdopen(os.open(self.temporary, flags, 0o666), "wb")
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
        checksum = sha256_file(final).sha256
        self.result.shards.append(
            {"name": final.name, "bytes": final.stat().st_size, "sha256": checksum, "samples": self.count}
        )
        self.journal.add(self.split, final.name, checksum)
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
    members = shard_members(path)
    images = []
    for key, (image, cls) in members.items():
        if key >= len(relative):
            raise UserError(f"{path}: sample {key} is not in the source listing; delete the shard and rerun")
        columns = result.samples
        for column, value in (
            ("shard", len(result.shards)),
            ("offset", image[0]),
            ("size", image[1]),
            ("label", cls),
            ("path", relative[key]),
        ):
            columns[column].append(value)
        images.append((key, image[0], image[1]))
    result.shards.append({"name": path.name, "bytes": path.stat().st_size, "sha256": checksum, "samples": len(members)})
    return images
