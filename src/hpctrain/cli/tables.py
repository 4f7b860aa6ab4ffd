"""Tables for the views that can grow to thousands of rows (`hpctrain status`, `hpctrain cluster`).

A rich Table costs about 0.7 ms a row to build and lay out: 7 s for a 10,000-node cluster. `print_table` lets rich
lay out a table of up to RICH_ROWS rows and prints a longer one as plain text, never building a rich Table: the
same header and cells, columns padded with spaces, one line a row, linear in the cells. Cells are text, never read
as markup (rich_table makes each a Text); control characters (a name holding an escape sequence) are shown as `?`,
as rich strips them from its Text.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

RICH_ROWS = 200  # up to this many rows a rich table (a screenful or two); more: plain_table
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def clean(cell: str) -> str:
    return cell if cell.isprintable() else _CONTROL_RE.sub("?", cell)


def plain_table(rows: Sequence[Sequence[str]], out: TextIO | None = None) -> None:
    """rows[0] is the header. Each column as wide as its widest cell, two spaces between columns."""
    if not rows:
        return
    columns = [list(column) for column in zip(*rows)]
    for column in columns:
        if not all(map(str.isprintable, column)):  # rare: clean the cells of this column only
            column[:] = map(clean, column)
    widths = [max(map(len, column)) for column in columns]
    line = "  ".join(f"{{:<{width}}}" for width in widths)  # one format a row: linear, no per-cell calls
    (out or sys.stdout).write("\n".join(line.format(*row).rstrip() for row in zip(*columns)) + "\n")


def rich_table(columns: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None) -> Any:
    """A rich Table of these text cells (folded, not cut, when the terminal is narrow)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def print_table(columns: Sequence[str], rows: Sequence[Sequence[str]], console: Any, title: str | None = None) -> None:
    """Laid out by rich when short, plain when longer (see the module docstring)."""
    if len(rows) <= RICH_ROWS:
        console.print(rich_table(columns, rows, title))
        return
    if title:
        console.file.write(title + "\n")
    plain_table([tuple(columns), *rows], out=console.file)


def json_text(value: Any) -> str:
    """`value` as JSON for --json: indented as json.dumps(indent=2) prints it, except that a list of more than
    RICH_ROWS records gets one compact record a line (json's indented printer is pure Python, several times slower
    than its compact one: 1.6 s for 100,000 jobs). The same data either way; only the spacing differs."""
    if isinstance(value, list) and len(value) > RICH_ROWS:
        return "[\n  " + ",\n  ".join(json.dumps(item) for item in value) + "\n]" if value else "[]"
    if isinstance(value, dict) and any(isinstance(v, list) and len(v) > RICH_ROWS for v in value.values()):
        parts = [f"  {json.dumps(k)}: " + json_text(v).replace("\n", "\n  ") for k, v in value.items()]
        return "{\n" + ",\n".join(parts) + "\n}"
    return json.dumps(value, indent=2)
