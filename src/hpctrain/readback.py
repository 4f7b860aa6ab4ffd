"""Reading back what other processes wrote into a run directory: bounded, without following links, validated.

A run directory is written by other ranks, other attempts, other users and crashed processes, often on a shared file
system: every file hpctrain reads back from it is untrusted input. All such reads go through here:

    read_bytes(path, limit, within=RUN_DIR)   the bytes of a regular file, at most `limit` of them
    open_regular(path, within=RUN_DIR)        ... or an open descriptor of it, to read a part (a log as it grows)
    read_tail(path, limit, within=RUN_DIR)    ... its last `limit` bytes, from the first whole line (a log's end)
    read_text(path, limit, within=RUN_DIR)    ... decoded as strict UTF-8
    read_json(path, limit, within=RUN_DIR)    ... parsed as JSON (no NaN or Infinity, nesting at most MAX_DEPTH)
    read_json_lines(path, limit, within=...)  ... a JSON value per line (metrics.jsonl), each line decoded on its own;
                                              an unfinished last line dropped
    parse_json(text, source), parse_json_lines(data, source)   the same for text (or bytes) that came another way
    parse_record(cls, value, what)            a JSON object -> the dataclass `cls`, every field's type checked
    check_value(value, annotation)            why a value does not fit a type annotation (None if it does)

Each raises `BadRunFile` (a UserError, so the CLI prints its one line naming the file) for a file that exists but
cannot be used: not a regular file (a FIFO is never waited on, a directory or device never read), a symbolic link
(in the last component, or, with `within`, in any folder below `within`), larger than `limit` (never more than
`limit` + 1 bytes are read, however large or sparse the file), not UTF-8, not JSON, nested too deep, holding a
string that is not text (a lone surrogate such as "\\ud800", which JSON's escapes can spell but no file, terminal
or encoder can take), or of the wrong shape. A missing file raises FileNotFoundError, which callers usually treat as
"not written yet".

Records are dataclasses: `parse_record` checks each field against its annotation (int, float, str, bool, `X | None`,
list[...], dict[str, ...]; bool is not an int, floats must be finite, strings are text without control characters)
and the bounds in its metadata (`bounds(lo, hi)`), then calls the class's `check()` (if it has one) for relations
between fields. Unknown keys are ignored (a newer hpctrain may add fields); a missing field takes its default.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import json
import math
import os
import re
import stat
import types
import typing
from pathlib import Path
from typing import Any, TypeVar, Union

from hpctrain.fsutil import FileRefused, file_kind, read_open_file

MAX_DEPTH = 32
"""JSON nesting deeper than this is refused (hpctrain's own records nest three levels at most)."""
MAX_STRING = 4096
"""The longest string a record field may hold (host names, phases, collective names)."""

T = TypeVar("T")


class BadRunFile(FileRefused):
    """A file read back from a run directory that cannot be used; the message names it and says why."""


def _opened(path: Path, within: str | os.PathLike | None) -> int:
    """`_open` with its refusals (a link, a FIFO, ...) as BadRunFile; a missing file stays FileNotFoundError."""
    try:
        return _open(path, Path(within) if within is not None else None)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise BadRunFile(path, _why(err)) from None


def read_bytes(path: str | os.PathLike, limit: int, within: str | os.PathLike | None = None) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them. Never follows a symbolic link at `path`,
    nor (with `within`, a folder above `path`) in any folder between `within` and `path`; never blocks on a FIFO."""
    path = Path(path)
    fd = _opened(path, within)
    try:
        return read_open_file(fd, path, limit, BadRunFile, hint="")
    except BadRunFile:
        raise
    except OSError as err:
        raise BadRunFile(path, _why(err)) from None


def open_regular(path: str | os.PathLike, within: str | os.PathLike | None = None) -> int:
    """An open file descriptor (the caller closes it) of the regular file `path`, opened as `read_bytes` opens it,
    for a reader that takes only part of a large file (the tail of a log)."""
    path = Path(path)
    fd = _opened(path, within)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise BadRunFile(path, f"not a regular file ({file_kind(info.st_mode)})")
    return fd


def read_tail(path: str | os.PathLike, limit: int, within: str | os.PathLike | None = None) -> bytes:
    """The end of the regular file `path` (opened as `open_regular` opens it): its last `limit` bytes, from the first
    line that starts within them when the file is longer. For the end of a log, however large the log."""
    fd = open_regular(path, within)
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - limit), os.SEEK_SET)
        data = os.read(fd, limit)
    except OSError as err:
        raise BadRunFile(path, _why(err)) from None
    finally:
        os.close(fd)
    if size > limit:  # cut in the middle of a line: from the next one (none when no line starts in it)
        data = data[data.index(b"\n") + 1 :] if b"\n" in data else b""
    return data


def read_text(path: str | os.PathLike, limit: int, within: str | os.PathLike | None = None) -> str:
    """`read_bytes`, decoded as UTF-8 (BadRunFile for any invalid byte)."""
    return _decode(Path(path), read_bytes(path, limit, within))


def read_json(path: str | os.PathLike, limit: int, within: str | os.PathLike | None = None) -> Any:
    """`read_text`, parsed as one JSON value."""
    return parse_json(read_text(path, limit, within), path)


def read_json_lines(
    path: str | os.PathLike, limit: int, within: str | os.PathLike | None = None, allow_nan: bool = False
) -> list[tuple[int, Any | BadRunFile]]:
    """`read_bytes`, parsed by `parse_json_lines` line by line: a line that is not UTF-8 is one bad line, not a
    bad file (an appender killed mid-character, a stray byte must not make every other line unreadable)."""
    return parse_json_lines(read_bytes(path, limit, within), path, allow_nan)


def parse_json_lines(
    data: str | bytes, source: str | os.PathLike, allow_nan: bool = False
) -> list[tuple[int, Any | BadRunFile]]:
    """(line number, value) for each non-blank line of JSON-lines `data`; a line that is not JSON (or, given bytes,
    not UTF-8) gives its BadRunFile as the value (the caller skips or keeps it). A last line without its newline is
    an append cut short (a killed writer) and left out. `allow_nan`: NaN and Infinity are numbers (Python's json
    writes them)."""
    lines = split_lines(data)
    found: list[tuple[int, Any | BadRunFile]] = []
    for number, line in enumerate(lines, 1):
        where = f"{os.fspath(source)}, line {number}"
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as err:
                found.append((number, BadRunFile(where, f"not UTF-8 text (byte {err.start})")))
                continue
        if line.strip():
            try:
                found.append((number, parse_json(line, where, allow_nan)))
            except BadRunFile as err:
                found.append((number, err))
    return found


def split_lines(data: T) -> list[T]:
    """The finished lines of `data` (text or bytes), without their newlines: a last line without its newline is an
    append cut short and left out."""
    lines = data.split(b"\n" if isinstance(data, bytes) else "\n")
    lines.pop()  # "" after a final newline, else the unfinished last line
    return lines


def parse_json(text: str, source: str | os.PathLike, allow_nan: bool = False) -> Any:
    """`text` as JSON, refusing NaN and Infinity (not JSON, though Python writes them; `allow_nan` takes them) and
    nesting beyond MAX_DEPTH. `source` names where the text came from in the BadRunFile."""
    depth = _max_depth(text)
    if depth > MAX_DEPTH:
        raise BadRunFile(source, f"JSON nested {depth} levels deep, more than the {MAX_DEPTH} allowed")
    try:
        value = json.loads(text, parse_constant=None if allow_nan else _no_constant)
    except (ValueError, RecursionError) as err:
        raise BadRunFile(source, f"not valid JSON ({_first_line(err)})") from None
    if _MAYBE_SURROGATE.search(text) and (lone := _lone_surrogate(value)) is not None:
        raise BadRunFile(source, f"holds a string that is not text ({_short(lone)}: a lone surrogate)")
    return value


def parse_record(cls: type[T], value: Any, source: str | os.PathLike) -> T:
    """The JSON object `value` as the dataclass `cls`, each field checked against its annotation and bounds (see
    the module's docstring). BadRunFile naming `source` and the first wrong field otherwise."""
    if not isinstance(value, dict):
        raise BadRunFile(source, f"a JSON {_json_kind(value)} where an object was expected")
    hints = _hints(cls)
    given = {}
    for field in dataclasses.fields(cls):
        if field.name not in value:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise BadRunFile(source, f"has no {field.name!r}")
            continue
        problem = _check_type(
            value[field.name], hints[field.name], field.metadata.get("readback_multiline", False)
        ) or _check_bounds(value[field.name], field)
        if problem:
            raise BadRunFile(source, f"{field.name!r} {problem}")
        given[field.name] = value[field.name]
    record = cls(**given)
    check = getattr(record, "check", None)
    problem = check() if callable(check) else None
    if problem:
        raise BadRunFile(source, problem)
    return record


def check_value(value: Any, annotation: Any) -> str | None:
    """Why `value` does not fit `annotation` (as `parse_record` checks a field: "is a string ('3'), not a whole
    number"); None when it does. For values read back some other way (a checkpoint's recorded settings)."""
    return _check_type(value, annotation)


def bounds(lo: float | None = None, hi: float | None = None, multiline: bool = False) -> dict[str, Any]:
    """Field metadata for `parse_record`: the value (a number, or a string's or list's length) lies in [lo, hi];
    `multiline`: a string may hold newlines and tabs (an error message), else no control character at all."""
    return {"readback_bounds": (lo, hi), "readback_multiline": multiline}


# ---------------------------------------------------------------- internals


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    """A record class's field annotations, resolved once (records are parsed by the thousand)."""
    return typing.get_type_hints(cls)


def _open(path: Path, within: Path | None) -> int:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    if within is None:
        return os.open(path, flags)
    try:
        parts = path.relative_to(within).parts
    except ValueError:
        raise BadRunFile(path, f"not inside {within}") from None
    if not parts or ".." in parts:
        raise BadRunFile(path, f"not a file inside {within}")
    folder = os.open(within, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the run directory itself may be a link
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
            os.close(folder)
            folder = inner
        return os.open(parts[-1], flags, dir_fd=folder)
    finally:
        os.close(folder)


def _why(err: OSError) -> str:
    if err.errno == errno.ELOOP:  # O_NOFOLLOW met a link
        return "a symbolic link (hpctrain does not follow links in a run directory)"
    if err.errno == errno.ENOTDIR:  # a folder on the way is a file, or a link (O_DIRECTORY | O_NOFOLLOW)
        return "a folder on its path is a symbolic link or not a folder"
    return os.strerror(err.errno or 0) if err.errno else str(err)


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRunFile(path, f"not UTF-8 text (byte {err.start})") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?')
_BRACKET = re.compile(r"[\[\]{}]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL, C1: a terminal's escapes among them
_CONTROL_IN_TEXT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # the same, but for newline and tab


# A UTF-16 surrogate: never a character of its own. JSON may spell one as an escape ("\\ud800"); a pair of them
# decodes to one character, a lone one stays in the string and fails whatever encodes it later (a print, a write).
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_MAYBE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")  # in JSON text: an escape, or raw


def _lone_surrogate(value: Any) -> str | None:
    """The first string (or key) in parsed JSON `value` that holds a lone surrogate; None when every one is text.
    Iterative: the value may nest MAX_DEPTH levels."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return item
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return None


def _max_depth(text: str) -> int:
    """The deepest nesting of brackets in JSON `text` (outside strings), counted without recursion."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return 0  # cannot be deeper than allowed
    deepest = depth = 0
    for bracket in _BRACKET.findall(_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _first_line(err: BaseException) -> str:
    return (str(err).splitlines() or [type(err).__name__])[0][:200]


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def _check_type(value: Any, hint: Any, multiline: bool = False) -> str | None:
    """Why `value` (parsed JSON) does not fit the annotation `hint`; None when it does."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        problems = [_check_type(value, option, multiline) for option in options if option is not type(None)]
        return None if any(p is None for p in problems) else problems[0]
    if hint is Any:
        return None
    if hint is bool:
        return None if isinstance(value, bool) else f"is a {_json_kind(value)}, not true or false"
    if hint is int:
        return (
            None
            if isinstance(value, int) and not isinstance(value, bool)
            else f"is a {_json_kind(value)} ({_short(value)}), not a whole number"
        )
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"is a {_json_kind(value)} ({_short(value)}), not a number"
        return None if math.isfinite(value) else f"is {value}, not a finite number"
    if hint is str:
        if not isinstance(value, str):
            return f"is a {_json_kind(value)} ({_short(value)}), not a string"
        if len(value) > MAX_STRING:
            return f"is a string of {len(value)} characters, more than {MAX_STRING}"
        control = _CONTROL_IN_TEXT if multiline else _CONTROL
        if control.search(value):
            return f"holds control characters ({_short(value)})"
        return None if not _SURROGATE.search(value) else f"is not text ({_short(value)}: a lone surrogate)"
    if origin is list:
        if not isinstance(value, list):
            return f"is a {_json_kind(value)}, not an array"
        (item,) = typing.get_args(hint) or (Any,)
        for index, element in enumerate(value):
            if problem := _check_type(element, item, multiline):
                return f"item {index} {problem}"
        return None
    if origin is dict:
        if not isinstance(value, dict):
            return f"is a {_json_kind(value)}, not an object"
        _, item = typing.get_args(hint) or (str, Any)
        for key, element in value.items():
            if problem := _check_type(element, item, multiline):
                return f"key {_short(key)} {problem}"
        return None
    raise TypeError(f"parse_record cannot check the annotation {hint!r}")  # a programming error, not bad input


def _check_bounds(value: Any, field: dataclasses.Field) -> str | None:
    lo, hi = field.metadata.get("readback_bounds", (None, None))
    if value is None or (lo is None and hi is None):
        return None
    size = len(value) if isinstance(value, (str, list, dict)) else value
    if (lo is not None and size < lo) or (hi is not None and size > hi):
        what = "length" if size is not value else "value"
        return f"{what} {_short(size)} is outside [{_short(lo)}, {_short(hi)}]"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
