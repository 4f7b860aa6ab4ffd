"""Where the channel's lines go for a command (hpctrain.channel): the terminal, in the forms hpctrain has always
printed. `hpctrain train`'s own processes and the workers it starts install it too (cli.train_start.train_here).

INFO on stdout as `hpctrain: MESSAGE`; NOTE on stderr as `hpctrain: MESSAGE`; WARNING as `hpctrain: warning:
MESSAGE` and ERROR as `hpctrain COMMAND: error: MESSAGE`, both on stderr; a BARE record as it is. Each line is
flushed as it is written (a batch job's log shows it at once) and passes through safetext.for_terminal: a name
from outside in a message shows its escapes, never runs them."""

from __future__ import annotations

import logging
import sys

from hpctrain.channel import NOTE, ROOT
from hpctrain.safetext import for_terminal


class TerminalLines(logging.Handler):
    """The streams are looked up at each line (sys.stdout and sys.stderr as they are then), not kept."""

    def __init__(self, command: str | None) -> None:
        super().__init__(logging.INFO)
        self.command = command

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if getattr(record, "bare", False):
            return message
        if record.levelno >= logging.ERROR:
            return f"hpctrain{' ' + self.command if self.command else ''}: error: {message}"
        if record.levelno >= logging.WARNING:
            return f"hpctrain: warning: {message}"
        return f"hpctrain: {message}"

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stdout if record.levelno < NOTE else sys.stderr
            stream.write(for_terminal(self.format(record), newlines=True) + "\n")
            stream.flush()
        except BrokenPipeError:  # the reader has gone: the command ends as any Unix tool does (cli.main)
            raise
        except Exception:
            self.handleError(record)


def install(command: str | None) -> None:
    """The terminal as where the channel's lines go, for `hpctrain COMMAND` (the name in its error lines); once per
    process, a later call only renames the command."""
    logger = logging.getLogger(ROOT)
    logger.setLevel(logging.INFO)
    for handler in logger.handlers:
        if isinstance(handler, TerminalLines):
            handler.command = command
            return
    logger.addHandler(TerminalLines(command))
