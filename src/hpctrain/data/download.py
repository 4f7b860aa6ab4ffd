"""Fetch and verify dataset files: `download` tries each mirror in turn, `check_file` says whether a file holds
a dataset file's published data.

Downloads are atomic: bytes go to a hidden temporary file next to the target, are fsynced and
verified, and only then renamed into place, so a job never sees a half-written or corrupt file
under the final name, even when several users or array tasks download into a shared directory.
What a download says (a file begun, its bytes, verified, a mirror given up) goes to a Reporter: the caller's
(the CLI's progress bar or plain lines, hpctrain.cli.download_progress), else the logging channel (hpctrain.channel);
loading the files is hpctrain.data.idx_dataset's.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import gzip
import hashlib
import logging
import http.client
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path
from typing import Iterable, Protocol

from hpctrain.data.datasets import ROLES, DatasetSpec, FileSpec
from hpctrain.data.idx import GZIP_MAGIC
from hpctrain.errors import UserError, redact
from hpctrain.fsutil import format_bytes, free_bytes, fsync_dir, is_no_space

log = logging.getLogger(__name__)


class Reporter(Protocol):
    """What a download says, as events: a face shows them (hpctrain.cli.download_progress)."""

    def info(self, message: str) -> None: ...

    def warn(self, message: str) -> None: ...

    def begin(self, name: str, url: str, total: int | None) -> None: ...

    def advance(self, n: int) -> None: ...

    def end(self, name: str, ok: bool, size: int) -> None: ...


class LoggedReporter:
    """The notes and warnings through the logging channel, the bytes unsaid: a library caller's default."""

    def __init__(self, dataset: str) -> None:
        self.dataset = dataset

    def info(self, message: str) -> None:
        log.info(f"{self.dataset}: {message}")

    def warn(self, message: str) -> None:
        log.warning(f"{self.dataset}: {message}")

    def begin(self, name: str, url: str, total: int | None) -> None:
        size = f" ({format_bytes(total)})" if total is not None else ""
        self.info(f"downloading {url}{size}")

    def advance(self, n: int) -> None:
        pass

    def end(self, name: str, ok: bool, size: int) -> None:
        if ok:
            self.info(f"{name}: {format_bytes(size)}, verified")


CHUNK = 1 << 20
SCHEMES = ("http", "https", "file")
# A live download rewrites its .part file at least every read timeout; one untouched this long was orphaned
# by a killed process (another user's download into a shared directory may be live, hence no quicker rule).
STALE_PART_AGE_S = 3600.0
# A mirror may send at most this multiple of the file's uncompressed size (the largest valid form), plus slack:
# a misconfigured server streaming without end is cut off, not allowed to fill the disk.
SIZE_CAP_FACTOR = 2
SIZE_CAP_SLACK = 64 << 10
# A transfer averaging fewer bytes per second than this over a --timeout window is abandoned (a trickle of one
# byte per second never trips the per-read timeout).
DEFAULT_MIN_RATE = 1000.0


# redact: hide URL passwords in what is printed (shared with `submit --dry-run`, hence in hpctrain.errors).
def max_download_bytes(fspec: FileSpec) -> int:
    return SIZE_CAP_FACTOR * fspec.raw_size + SIZE_CAP_SLACK


# ---------------------------------------------------------------- verification
def _md5() -> "hashlib._Hash":
    # usedforsecurity=False: a plain md5() is refused on FIPS-mode hosts, common on clusters.
    return hashlib.md5(usedforsecurity=False)


def _md5_of_stream(read, limit: int | None = None) -> tuple[str, int]:
    """md5 and length of what `read` yields, stopping once more than `limit` bytes came (a decompression bomb)."""
    digest = _md5()
    size = 0
    while block := read(CHUNK):
        digest.update(block)
        size += len(block)
        if limit is not None and size > limit:
            break
    return digest.hexdigest(), size


def check_file(path: os.PathLike | str, fspec: FileSpec) -> str | None:
    """Return None if `path` holds `fspec`'s data, else what is wrong with it.

    Valid: the published archive bytes, or any gzip (mirrors such as Debian recompress) or
    uncompressed file whose content matches the published uncompressed md5. Gzip or not is
    decided from the content, not the name.
    """
    with open(path, "rb") as f:
        head = f.read(2)
        f.seek(0)
        digest, _ = _md5_of_stream(f.read)
    if head == GZIP_MAGIC:
        if digest == fspec.gz_md5:
            return None
        try:
            # Stream through the same gzip reader read_idx uses, so "valid" here means "readable there"
            # (multi-member archives pass; trailing garbage fails) and memory stays bounded.
            with gzip.open(path, "rb") as f:
                raw, size = _md5_of_stream(f.read, limit=fspec.raw_size)
        except EOFError:
            return "truncated gzip data"
        except (OSError, zlib.error) as err:
            return f"corrupt gzip data ({err})"
        if size > fspec.raw_size:
            return f"decompresses to more than the published {fspec.raw_size} bytes"
        if raw == fspec.raw_md5:
            return None
        return f"checksum mismatch: decompressed md5 {raw}, expected {fspec.raw_md5}"
    if digest == fspec.raw_md5:
        return None
    if head[:1] == b"<":
        return "got an HTML/XML page instead of the data file (a proxy or login page?)"
    return f"checksum mismatch: md5 {digest}, expected {fspec.raw_md5} (or archive md5 {fspec.gz_md5})"


# ---------------------------------------------------------------- download
def normalize_mirror(mirror: str) -> str:
    """Return `mirror` as a base URL ending in '/'. A local directory path becomes a file:// URL."""
    scheme = urllib.parse.urlsplit(mirror).scheme.lower()
    if scheme not in SCHEMES:
        if os.path.isdir(mirror):
            mirror = Path(mirror).resolve().as_uri()
        else:
            raise UserError(
                f"mirror {redact(repr(mirror))} is not an http://, https:// or file:// URL "
                "(nor an existing directory); "
                "pass e.g. --mirror https://host/path/ or --mirror file:///shared/datasets/mnist/"
            )
    return mirror if mirror.endswith("/") else mirror + "/"


def _apply_umask(path: Path) -> None:
    # mkstemp creates 0600 files; a dataset in a shared directory should get the usual permissions.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _open(url: str, timeout: float):
    """urlopen, sending an http(s) URL's user:password as Basic authentication (urllib itself ignores them)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or "@" not in parts.netloc:
        return urllib.request.urlopen(url, timeout=timeout)
    credentials, _, host = parts.netloc.rpartition("@")
    user, _, password = credentials.partition(":")
    token = base64.b64encode(f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}".encode()).decode()
    request = urllib.request.Request(urllib.parse.urlunsplit(parts._replace(netloc=host)))
    request.add_unredirected_header("Authorization", f"Basic {token}")  # never sent on to where a redirect points
    return urllib.request.urlopen(request, timeout=timeout)


def _write_error(final: Path, fspec: FileSpec, err: OSError, received: int) -> UserError:
    """A failure to write here is not the mirror's fault: say what it is, and stop trying other mirrors."""
    where = final.parent
    if is_no_space(err):
        what = "the file system is full" if err.errno == errno.ENOSPC else "the disk quota is used up"
        room = free_bytes(where)
        free = f", {format_bytes(room)} free" if room is not None else ""
        return UserError(
            f"cannot write {final.name} into {where}: {what} ({err.strerror}{free}) after {format_bytes(received)}; "
            f"the file needs up to {format_bytes(fspec.raw_size)}: free space there, or pass --data-dir on a file "
            "system with room"
        )
    return UserError(
        f"cannot write {final.name} into {where}: {err.strerror or err}; pass --data-dir with a writable directory"
    )


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fetch_one(
    url: str, fspec: FileSpec, final: Path, timeout: float, min_rate: float, reporter: Reporter
) -> str | None:
    """Try one URL; on success `final` holds a verified copy. Return None, or what went wrong with the mirror.
    Raises UserError for what no other mirror can fix (this side cannot write the file)."""
    try:
        fd, tmp_name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".part")
    except OSError as err:
        raise _write_error(final, fspec, err, 0) from None
    tmp = Path(tmp_name)
    limit = max_download_bytes(fspec)
    received = 0
    started = False
    try:
        try:
            with _open(url, timeout) as response:
                length = response.headers.get("Content-Length")
                total = int(length) if length and length.isdigit() else None
                if total is not None and total > limit:
                    return (
                        f"announces {total} bytes, more than the {limit} a {fspec.raw_size}-byte file may take: "
                        "not the data file"
                    )
                reporter.begin(final.name, redact(url), total)
                started = True
                window_start, window_bytes = time.monotonic(), 0
                # read1: whatever has arrived, so that a trickle returns here and is measured (read() would wait
                # for CHUNK).
                while chunk := response.read1(CHUNK):
                    try:
                        _write_all(fd, chunk)
                    except OSError as err:
                        raise _write_error(final, fspec, err, received) from None
                    received += len(chunk)
                    reporter.advance(len(chunk))
                    if received > limit:
                        return (
                            f"sent more than {limit} bytes for a {fspec.raw_size}-byte file: not the data file; stopped"
                        )
                    window_bytes += len(chunk)
                    elapsed = time.monotonic() - window_start
                    if min_rate and elapsed >= timeout:
                        if window_bytes < min_rate * elapsed:
                            return (
                                f"too slow: {window_bytes / elapsed:.0f} bytes/s over {elapsed:.1f} s, "
                                f"below --min-rate {min_rate:g}; "
                                "use a faster --mirror, fetch the files on another machine, or lower --min-rate"
                            )
                        window_start, window_bytes = time.monotonic(), 0
        except urllib.error.HTTPError as err:
            return f"HTTP error {err.code} {err.reason}"
        except urllib.error.URLError as err:
            return f"cannot connect: {err.reason}"
        except TimeoutError:
            return f"timed out after {timeout:g} s (raise it with --timeout)"
        except ValueError as err:  # http.client.InvalidURL: a bad port, a space in the host
            return f"invalid URL: {err}"
        except (OSError, http.client.HTTPException) as err:
            return f"transfer failed after {received} bytes: {err!r}"
        if total is not None and received != total:
            return f"incomplete transfer: got {received} of {total} bytes"
        try:
            os.fsync(fd)
        except OSError as err:
            raise _write_error(final, fspec, err, received) from None
        problem = check_file(tmp, fspec)
        if problem is not None:
            return problem
        _apply_umask(tmp)
        os.replace(tmp, final)
        fsync_dir(final.parent)
        return None
    finally:
        os.close(fd)
        ok = not tmp.exists() and final.exists()
        if started:
            reporter.end(final.name, ok, received)
        tmp.unlink(missing_ok=True)  # no-op after a successful rename


def _failure_message(spec: DatasetSpec, fspec: FileSpec, failures: list[tuple[str, str]], target: Path) -> str:
    tried = "\n".join(f"  - {redact(url)}: {redact(problem)}" for url, problem in failures)
    base = spec.mirrors[0] if spec.mirrors else ""
    urls = "\n".join(f"  {base}{f.archive_name}" for f in spec.files.values())
    data_dir = target.parent
    return (
        f"could not download {spec.name} file {fspec.archive_name}; mirrors tried:\n{tried}\n"
        f"If this machine has no internet access (compute nodes often have none), fetch the "
        f"{len(spec.files)} files on a machine that has it:\n{urls}\n"
        f"copy them into {target}/ (DATA_DIR/{spec.name}/), then run "
        f"`hpctrain download {spec.name} --data-dir {data_dir}` to verify them. "
        f"Or pass --mirror URL (repeatable) naming a server or directory (file:///path/) that has them."
    )


def download(
    spec: DatasetSpec,
    data_dir: os.PathLike | str,
    mirrors: Iterable[str] | None = None,
    *,
    reporter: Reporter | None = None,
    timeout: float = 30.0,
    min_rate: float = DEFAULT_MIN_RATE,
) -> list[Path]:
    """Make sure `data_dir/<spec.name>/` holds verified copies of the dataset's files.

    Files already there and valid are kept without any request. Otherwise each mirror is tried in
    order (`mirrors`, if given, replace the dataset's defaults: an operating system's copy when installed, then
    the public mirrors). What it does is told to
    `reporter` (None: the logging channel, LoggedReporter); a reporter that is a context manager is entered for the
    download (a progress bar drawn meanwhile). Returns the paths of
    the files in ROLES order; raises UserError, saying how to get the files, if a file cannot be had.
    `timeout` bounds each connection and read; a transfer averaging under `min_rate` bytes/s over `timeout`
    seconds is abandoned too (0: no minimum). A mirror may send at most `max_download_bytes` per file.
    """
    if not mirrors:
        mirrors = [d for d in spec.local_copies if os.path.isdir(d)] + list(spec.mirrors)
    bases = [normalize_mirror(m) for m in mirrors]
    if not bases:
        raise UserError(f"no mirrors known for {spec.name}; pass --mirror URL")
    target_dir = Path(data_dir).absolute() / spec.name
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"cannot create {target_dir}: {err.strerror}; pass --data-dir with a writable directory")

    paths: list[Path] = []
    if reporter is None:
        reporter = LoggedReporter(spec.name)
    with reporter if isinstance(reporter, contextlib.AbstractContextManager) else contextlib.nullcontext():
        for role in ROLES:
            fspec = spec.files[role]
            final = target_dir / fspec.archive_name
            existing = _existing_valid(target_dir, fspec, reporter)
            if existing is not None:
                paths.append(existing)
                continue
            if final.exists() and not final.is_file():
                what = "a directory" if final.is_dir() else "not a regular file"
                raise UserError(
                    f"{final} is {what}, where the downloaded file must go; move or remove it, "
                    "or pass --data-dir naming another directory"
                )
            _remove_stale_parts(final)
            failures: list[tuple[str, str]] = []
            for i, base in enumerate(bases):
                url = base + fspec.archive_name
                problem = _fetch_one(url, fspec, final, timeout, min_rate, reporter)
                if problem is None:
                    break
                failures.append((url, problem))
                more = "; trying the next mirror" if i + 1 < len(bases) else ""
                reporter.warn(f"{redact(url)}: {redact(problem)}{more}")
            else:
                raise UserError(_failure_message(spec, fspec, failures, target_dir))
            paths.append(final)
        torchvision_layout(spec, target_dir.parent, paths, reporter)
    return paths


# ---------------------------------------------------------------- torchvision's layout
def torchvision_raw_dir(spec: DatasetSpec, data_dir: os.PathLike | str) -> Path | None:
    """Where torchvision.datasets.MNIST/FashionMNIST(root=data_dir) looks for the files: root/<Class>/raw/."""
    if spec.torchvision_folder is None:
        return None
    return Path(data_dir).absolute() / spec.torchvision_folder / "raw"


def torchvision_layout(spec: DatasetSpec, data_dir: Path, paths: list[Path], reporter: Reporter) -> None:
    """Lay the verified files (`paths`, in ROLES order) out as torchvision's own download leaves them, so that a
    script's `torchvision.datasets.FashionMNIST(DATA)` loads them on an offline node: torchvision reads (and its
    `_check_exists` looks for) only the uncompressed files in DATA/<Class>/raw/. Each is written as a download is
    (a temporary file, its content verified, renamed into place), or hard linked where our copy is uncompressed
    already; the archive is hard linked beside it (no second copy on disk). A valid file already there is kept; an
    invalid one is moved aside, as in our own folder."""
    raw_dir = torchvision_raw_dir(spec, data_dir)
    if raw_dir is None:
        return
    try:
        raw_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"cannot create {raw_dir}: {err.strerror}; pass --data-dir with a writable directory")
    for role, source in zip(ROLES, paths):
        fspec = spec.files[role]
        final = raw_dir / fspec.name
        if _is_uncompressed_copy(final, fspec):
            continue
        _move_aside(final, reporter, "torchvision reads only the uncompressed data there")
        _write_uncompressed(source, final, fspec)
        if source.name == fspec.archive_name:
            try:  # where torchvision's own download leaves the archive; optional: torchvision never reads it
                os.link(source, raw_dir / fspec.archive_name)
            except OSError:
                pass  # there already, or a file system without hard links
    fsync_dir(raw_dir)
    reporter.info(f"torchvision.datasets.{spec.torchvision_folder}(root={data_dir}) reads them from {raw_dir}/")


def _is_uncompressed_copy(path: Path, fspec: FileSpec) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        digest, size = _md5_of_stream(f.read, limit=fspec.raw_size)
    return size == fspec.raw_size and digest == fspec.raw_md5


def _move_aside(path: Path, reporter: Reporter, why: str, then: str = "") -> None:
    """Move an invalid file aside as NAME.corrupt (not delete: it is the user's file), so that, whatever happens
    next, no invalid file stays under a name the loader would pick up."""
    if not os.path.lexists(path):
        return
    aside = path.with_name(path.name + ".corrupt")
    try:
        os.replace(path, aside)
    except OSError as err:
        raise UserError(
            f"{path} is not the verified data ({why}) and cannot be moved aside ({err.strerror}); "
            "delete it, or pass --data-dir with a writable directory"
        ) from err
    reporter.warn(f"{path} is not the verified data ({why}); moved it to {aside.name}{then}")


def _write_uncompressed(source: Path, final: Path, fspec: FileSpec) -> None:
    """`final` becomes the uncompressed content of the verified `source`: written to a temporary file beside it,
    checked against the published uncompressed md5, then renamed; a hard link when `source` is uncompressed."""
    try:
        fd, tmp_name = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.", suffix=".part")
    except OSError as err:
        raise _write_error(final, fspec, err, 0) from None
    tmp = Path(tmp_name)
    written = 0
    try:
        with open(source, "rb") as raw:
            gzipped = raw.read(2) == GZIP_MAGIC
        if not gzipped:
            os.close(fd)
            fd = -1
            tmp.unlink()  # its name, now for a hard link to our copy (one file on disk), else a copy of it
            try:
                os.link(source, tmp)
            except OSError:
                shutil.copyfile(source, tmp)
        else:
            digest = _md5()
            with gzip.open(source, "rb") as stream:
                while block := stream.read(CHUNK):
                    digest.update(block)
                    _write_all(fd, block)
                    written += len(block)
                    if written > fspec.raw_size:
                        break
            if written != fspec.raw_size or digest.hexdigest() != fspec.raw_md5:
                raise UserError(f"{source} changed while it was being unpacked into {final}; run the download again")
            os.fsync(fd)
            _apply_umask(tmp)
        os.replace(tmp, final)
    except OSError as err:
        raise _write_error(final, fspec, err, written) from None
    finally:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)  # no-op after the rename


def _remove_stale_parts(final: Path) -> None:
    now = time.time()
    for part in final.parent.glob(f".{final.name}.*.part"):
        try:
            if now - part.stat().st_mtime > STALE_PART_AGE_S:
                part.unlink()
        except OSError:
            pass  # gone already, or not ours to delete


def _existing_valid(target_dir: Path, fspec: FileSpec, reporter: Reporter) -> Path | None:
    # An uncompressed copy counts too: some users gunzip the files, and load_dataset reads either.
    for path in (target_dir / fspec.archive_name, target_dir / fspec.name):
        if not path.is_file():
            continue
        problem = check_file(path, fspec)
        if problem is None:
            reporter.info(f"{path.name}: already present and verified")
            return path
        _move_aside(path, reporter, problem, then=", downloading it again")
    return None
