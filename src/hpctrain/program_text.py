"""Programs hpctrain hands to a shell or an interpreter elsewhere (a batch script's shell functions, a pod's probe),
kept as files of their own in a `programs/` folder beside the module that renders them, so that they are read and
linted as programs (`bash -n`, shellcheck, ruff: tests/test_program_templates.py), not as code in Python strings.

A template is valid as it stands: its values are `@NAME@` words (uppercase), filled by `fill` from an explicit
mapping; a template names each value it needs, and each value given must be used. The lines that only speak to the
linters (`#!`, `# shellcheck ...` at the top) are not part of the text.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

PLACEHOLDER = re.compile(r"@([A-Z][A-Z0-9_]*)@")
_LINTER_LINE = re.compile(r"#!|# shellcheck ")


@cache
def template(package: str, name: str) -> str:
    """The text of `programs/<name>` beside `package`, less its leading linter lines (shebang, shellcheck)."""
    text = resources.files(package).joinpath("programs", name).read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    while lines and _LINTER_LINE.match(lines[0]):
        lines.pop(0)
    return "".join(lines)


def fill(package: str, name: str, **values: object) -> str:
    """`programs/<name>` with each `@NAME@` replaced by str(values[NAME]); every placeholder filled, every value
    used (a template and its renderer that disagree fail here, at import or in the tests, never in a job)."""
    text = template(package, name)
    wanted = set(PLACEHOLDER.findall(text))
    if wanted != set(values):
        raise AssertionError(f"programs/{name}: placeholders {sorted(wanted)} but values given for {sorted(values)}")
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), text)


def lines(package: str, name: str, **values: object) -> list[str]:
    """`fill`'s text as lines (a renderer that builds a script from lists of lines)."""
    return fill(package, name, **values).splitlines()


def without_comments(text: str) -> str:
    """A program as a command line carries it (`python3 -c TEXT`): full-line comments and blank lines out."""
    kept = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return "\n".join(kept) + "\n"
