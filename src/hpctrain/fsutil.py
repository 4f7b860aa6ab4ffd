"""Small file-system helpers for writes that must never be seen half done."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, data: bytes, temporary: Path | None = None) -> None:
    """Write `data` to `path` through a temporary file, fsynced and renamed: readers see the old or the new file."""
    tmp = temporary or path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def fsync_dir(directory: Path) -> None:
    """Make renames in `directory` durable; best effort, as some file systems refuse fsync on a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
