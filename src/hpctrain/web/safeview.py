"""A scheduler's View (hpctrain.schedulers.base.View) made into what a page shows: its tables and lines as plain
JSON-able data, every string passed through hpctrain.safetext.for_terminal.

This is half of the page's output boundary for text from outside (job and node names, reasons, paths, log lines):
control, bidi-override, separator and zero-width characters become visible escapes here; the other half is HTML
escaping, done by the templates' autoescape (Jinja2) and, for what the pages' script adds, by setting textContent,
never innerHTML. Together they are hpctrain.safetext.for_html.

A job table's first column is the job's id in every scheduler's status view; the pages link it to the job's page.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

from hpctrain.safetext import for_terminal
from hpctrain.schedulers.base import Table, View


def table(part: Table) -> dict[str, Any]:
    return {
        "title": None if part.title is None else for_terminal(part.title),
        "columns": [for_terminal(c) for c in part.columns],
        "rows": rows(part.rows),
    }


def rows(cells: Sequence[Sequence[str]]) -> list[list[str]]:
    """Every cell through for_terminal. for_terminal gives back printable text as it is, and text is printable when
    each of its characters is: so where the table's cells joined are printable (nearly always) they are all given
    back as they are, after one check of the whole table (10,000 nodes of 7 cells) rather than one a cell."""
    if "".join(chain.from_iterable(cells)).isprintable():
        return [list(row) for row in cells]
    return [[for_terminal(cell) for cell in row] for row in cells]


def view_parts(view: View) -> list[dict[str, Any]]:
    """The View's text parts in order: {"table": {...}} or {"line": "..."}."""
    return [
        {"table": table(part)} if isinstance(part, Table) else {"line": for_terminal(part)}
        for part in view.text_parts()
    ]


def job_data(view: View) -> dict[str, Any]:
    """One job's view as its page polls it: its parts, and whether it has ended (the page then stops asking)."""
    return {"parts": view_parts(view), "ended": bool(view.ended)}


def line(text: str) -> str:
    return for_terminal(text)
