"""How the CLI prints what a scheduler returns: a View (`hpctrain status`, `cluster`) as JSON or as tables and
lines, and an Outcome (`cancel`, `debug preempt`) as its lines and exit status. The backends return these records
(hpctrain.schedulers.base) and never write to stdout; every byte the user reads is written here.

A View's tables go through hpctrain.cli.tables: rich lays out up to RICH_ROWS rows, a longer table is printed as
plain aligned text (rich costs about 0.7 ms a row), and a plain View (kubectl's look) always is. Its --json is
json_text: indented, or one compact record a line for a long list. Cells and lines are text, never markup.

This is the output boundary for what a scheduler says: every cell, line and progress message passes through
hpctrain.safetext.for_terminal here (tables in hpctrain.cli.tables), so a job, node or host name, a label, a reason
or a termination message holding an escape sequence, a bidi override or a line separator shows it escaped. --json
is left as it is (json.dumps escapes every control character, and a program reads it). A job's own log (`hpctrain
logs`) is the user's program's output and is printed raw.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from hpctrain.cli.tables import RICH_ROWS, json_text, plain_columns, print_table
from hpctrain.safetext import for_terminal
from hpctrain.schedulers.base import Outcome, Table, View

if TYPE_CHECKING:
    from rich.console import Console


def console() -> Console:
    """stdout console; when piped or captured, wide enough that no cell is cut (logs and CI read it whole)."""
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    return Console(width=200, no_color=True, soft_wrap=False)


def show(view: View, as_json: bool) -> None:
    """Print `view`: its records as JSON, or its parts in order (tables and lines)."""
    if as_json:
        print(json_text(view.json_records()))
        return
    parts = view.text_parts()
    if view.plain:
        for part in parts:
            if isinstance(part, Table):
                plain_columns(part.columns, part.rows)
            else:
                print(for_terminal(part))
        return
    if all(isinstance(part, Table) and len(part.rows) > RICH_ROWS for part in parts):
        for part in parts:  # only long tables (`status --all-users`): plain text as print_table's, rich not imported
            if part.title:
                sys.stdout.write(for_terminal(part.title) + "\n")
            plain_columns(part.columns, part.rows)
        return
    from rich.text import Text

    out = console()
    for part in parts:
        if isinstance(part, Table):
            print_table(part.columns, part.rows, out, title=part.title)
        else:
            out.print(Text(for_terminal(part)), soft_wrap=True)


def tell(outcome: Outcome) -> int:
    """Print what became of the action; its exit status."""
    for line in outcome.lines:
        print(for_terminal(line))
    return outcome.exit_code


def progress_to_stderr(command: str) -> Callable[[str], None]:
    """A `say` for a backend's progress lines: `hpctrain COMMAND: ...` on stderr, at once."""

    def say(text: str) -> None:
        print(f"hpctrain {command}: {for_terminal(text)}", file=sys.stderr, flush=True)

    return say


def progress_to_stdout(text: str) -> None:
    """A `say` whose lines are part of the command's output (`debug preempt`: the warning sent, each new state)."""
    print(for_terminal(text), flush=True)
