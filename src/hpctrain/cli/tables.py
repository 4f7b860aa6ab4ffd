"""Tables for the views that can grow to thousands of rows (`hpctrain status`, `hpctrain cluster`).

A rich Table costs about 0.7 ms a row to build and lay out: 7 s for a 10,000-node cluster. `print_table` lets rich
lay out a table of up to RICH_ROWS rows and prints a longer one as plain text, never building a rich Table: the
same header and cells, columns padded with spaces, one line a row, linear in the cells. Cells are text, never read
as markup (rich_table makes each a Text), and both layouts pass each cell through the output boundary
(hpctrain.safetext.for_terminal): a name holding an escape sequence, a bidi override or a line separator shows it
escaped (`\x1b`, `\u202e`), on the rich path as on the plain one (rich's Text keeps ESC and C1 controls as they are).
The plain layout checks a column at a time, so a table of printable text costs one scan a column.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from hpctrain.safetext import for_terminal

RICH_ROWS = 200  # up to this many rows a rich table (a screenful or two); more: plain_table


def plain_table(rows: Sequence[Sequence[str]], out: TextIO | None = None) -> None:
    """rows[0] is the header. Each column as wide as its widest cell, two spaces between columns."""
    if rows:
        plain_columns(rows[0], rows[1:], out)


def plain_columns(header: Sequence[str], body: Sequence[Sequence[str]], out: TextIO | None = None) -> None:
    """The header over the body's rows, laid out a column at a time: the body's own columns when it keeps them
    (ColumnCells), else its rows transposed once. Linear in the cells, with one C-level formatting call a row."""
    data = getattr(body, "columns", None)
    if data is None:
        data = list(zip(*body)) if body else [()] * len(header)
    columns = [[head, *column] for head, column in zip(header, data)]
    for i, column in enumerate(columns):
        if not "".join(column).isprintable():  # rare: make the cells of this column only safe
            columns[i] = list(map(for_terminal, column))
    widths = [max(map(len, column)) for column in columns]
    # Each cell padded to its column's width but the last; a line loses the spaces an empty last cell leaves.
    line = "  ".join([f"%-{width}s" for width in widths[:-1]] + ["%s"])
    text = "\n".join(map(str.rstrip, map(line.__mod__, zip(*columns))))
    (out or sys.stdout).write(text + "\n")


def rich_table(columns: Sequence[str], rows: Sequence[Sequence[str]], title: str | None = None) -> Any:
    """A rich Table of these text cells (folded, not cut, when the terminal is narrow), each made safe."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title and for_terminal(title), title_justify="left")
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*(Text(for_terminal(cell)) for cell in row))
    return table


def print_table(columns: Sequence[str], rows: Sequence[Sequence[str]], console: Any, title: str | None = None) -> None:
    """Laid out by rich when short, plain when longer (see the module docstring)."""
    if len(rows) <= RICH_ROWS:
        console.print(rich_table(columns, rows, title))
        return
    if title:
        console.file.write(for_terminal(title) + "\n")
    plain_columns(columns, rows, out=console.file)


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
