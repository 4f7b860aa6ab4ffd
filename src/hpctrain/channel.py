"""hpctrain's one channel for what it tells its user: Python's `logging`, under the logger "hpctrain".

Each module logs to `logging.getLogger(__name__)` and writes to no stream itself. A library user (`import hpctrain`)
sees nothing unless they configure logging (hpctrain/__init__.py gives the "hpctrain" logger a NullHandler, so
Python's last-resort handler stays silent too); the faces decide where the lines go (hpctrain.cli.terminal: the
terminal lines of every command, `hpctrain train`'s workers included).

A record's level says what the line is, and so its form and stream on a terminal:
- INFO: the run's account of itself (`hpctrain: MESSAGE`, stdout);
- NOTE: a line for whoever reads the job's log, not a warning (`hpctrain: MESSAGE`, stderr);
- WARNING (`hpctrain: warning: MESSAGE`) and ERROR (`hpctrain COMMAND: error: MESSAGE`), stderr.
A record logged with `extra=BARE` is a line already in its final form (a progress line, another program's output,
a line that names its rank): shown as it is, on its level's stream.
"""

from __future__ import annotations

import logging
import sys

ROOT = "hpctrain"
NOTE = 25  # between INFO and WARNING: said on stderr, without "warning:"
logging.addLevelName(NOTE, "NOTE")
BARE = {"bare": True}


def note(logger: logging.Logger, message: str, *, bare: bool = False) -> None:
    """`message` at NOTE: a line for the log's reader on stderr (see the module docstring)."""
    logger.log(NOTE, message, extra=BARE if bare else None)


def flush() -> None:
    """Before os._exit: whatever the channel's handlers and the process's streams still hold goes out (os._exit
    skips the interpreter's own flushing)."""
    for handler in logging.getLogger(ROOT).handlers:
        handler.flush()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed stream or a reader that has gone: nothing more to say
            pass
