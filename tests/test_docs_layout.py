"""The README's layout table names every package of src/hpctrain (and every module at its top): a package added
without a row, or a row left for one that was removed, fails here. A sub-package is named in its parent's row by
its own name (`slurm/` in the `schedulers/` row)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
SRC = ROOT / "src" / "hpctrain"


def layout_rows() -> dict[str, str]:
    """{name in the first column (`cli/`, `config.py`): the whole row} of the table under "Layout of src/hpctrain"."""
    text = (ROOT / "README.md").read_text()
    section = text.split("Layout of `src/hpctrain/`", 1)[1]
    rows = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            if rows:
                break  # the end of the first table
            continue
        first = line.split("|")[1]
        for name in re.findall(r"`([^`]+)`", first):
            rows[name] = line
    return rows


def packages() -> list[str]:
    """Every package under src/hpctrain, as its path below it (`data/shards`)."""
    return sorted(str(p.parent.relative_to(SRC)) for p in SRC.rglob("__init__.py") if p.parent != SRC)


def top_modules() -> list[str]:
    return sorted(p.name for p in SRC.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))


def test_the_layout_table_names_every_top_level_package_and_module() -> None:
    rows = layout_rows()
    tops = [f"{p}/" for p in packages() if "/" not in p] + top_modules()
    missing = [name for name in tops if name not in rows]
    assert not missing, f"README.md's layout table has no row naming {missing}"
    stale = [name for name in rows if (SRC / name.rstrip("/")).exists() is False]
    assert not stale, f"README.md's layout table names what src/hpctrain no longer has: {stale}"


def test_the_layout_table_names_every_sub_package_in_its_parents_row() -> None:
    rows = layout_rows()
    missing = []
    for package in (p for p in packages() if "/" in p):
        parent, name = package.rsplit("/", 1)
        row = rows.get(f"{parent.split('/')[0]}/", "")
        if f"`{name}/`" not in row and f"`{package}/`" not in row:
            missing.append(package)
    assert not missing, f"README.md's layout table does not name these in their parent's row: {missing}"
