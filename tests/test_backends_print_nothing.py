"""The backends return data and the CLI prints it (issue 30): nothing under hpctrain/schedulers/ writes to the
terminal. An AST walk of every module there finds each call of `print`, each use of sys.stdout/sys.stderr and each
import of rich (whose Console writes to stdout); Python held in a string for another process (the batch script's
torchrun shim, the interpreter probe) is text here, not a call, and passes."""

from __future__ import annotations

import ast
from pathlib import Path

import hpctrain.schedulers

SCHEDULERS = Path(hpctrain.schedulers.__file__).parent


def terminal_writes(source: str, filename: str = "<source>") -> list[str]:
    """`file:line: what` for each way `source` writes to the terminal itself."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        what = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            what = "print()"
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in ("stdout", "stderr", "__stdout__", "__stderr__")
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        ):
            what = f"sys.{node.attr}"
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module == "sys"
            and any(a.name in ("stdout", "stderr", "__stdout__", "__stderr__") for a in node.names)
        ):
            what = "from sys import stdout/stderr"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(m == "rich" or m.startswith("rich.") for m in modules):
                what = "rich (its Console prints)"
        if what:
            found.append(f"{filename}:{node.lineno}: {what}")
    return found


def test_no_module_under_schedulers_writes_to_the_terminal() -> None:
    modules = sorted(SCHEDULERS.rglob("*.py"))
    assert len(modules) > 20  # the walk sees the backends' packages
    found = [hit for path in modules for hit in terminal_writes(path.read_text(), str(path.relative_to(SCHEDULERS)))]
    assert found == [], (
        "a backend returns data (hpctrain.schedulers.base: View, Outcome) and the CLI prints it "
        "(hpctrain.cli.views); these write to the terminal themselves:\n" + "\n".join(found)
    )


def test_the_walk_finds_each_way_of_writing_and_passes_python_in_a_string() -> None:
    writes = {
        "print('x')": "print()",
        "import sys\nsys.stdout.write('x')": "sys.stdout",
        "import sys\nprint_it(file=sys.stderr)": "sys.stderr",
        "from sys import stderr": "from sys import stdout/stderr",
        "from rich.console import Console": "rich (its Console prints)",
        "import rich": "rich (its Console prints)",
        "def f():\n    if True:\n        print(1, flush=True)": "print()",
    }
    for source, what in writes.items():
        assert [hit.split(": ", 1)[1] for hit in terminal_writes(source)] == [what], source
    assert terminal_writes("SHIM = '''\nimport sys\nprint('hpctrain: planned', file=sys.stderr)\n'''") == []
    assert terminal_writes("def say(line): pass\nsay('x')\nlines.print_it()") == []
