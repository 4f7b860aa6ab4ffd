"""Tables for the views that can grow to thousands of rows (`hpctrain status`, `hpctrain cluster`).

A rich Table costs about 0.7 ms a row to lay out: 7 s for a 10,000-node cluster. `print_table` prints a table of
up to RICH_ROWS rows as rich lays it out, and a longer one as plain text: the same header and cells, columns padded
with spaces, one line a row, linear in the cells. Cells are printed as text, never read as markup; control
characters (a name holding an escape sequence) are shown as `?`, as rich strips them from its Text.
"""

from __future__ import annotations

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
    cleaned = [[clean(str(c)) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cleaned) for i in range(len(cleaned[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cleaned]
    (out or sys.stdout).write("\n".join(lines) + "\n")


def _text(cell: Any) -> str:
    return cell.plain if hasattr(cell, "plain") else str(cell)  # rich Text: its characters, markup never parsed


def print_table(table: Any, console: Any) -> None:
    """A rich Table (its cells str or rich Text): laid out by rich when it is short, as plain_table when longer."""
    if table.row_count <= RICH_ROWS:
        console.print(table)
        return
    columns = table.columns
    header = [_text(c.header) for c in columns]
    cells = [list(c.cells) for c in columns]
    if table.title:
        console.file.write(_text(table.title) + "\n")
    plain_table([header, *([_text(col[i]) for col in cells] for i in range(table.row_count))], out=console.file)
