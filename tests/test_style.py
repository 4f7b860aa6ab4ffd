"""The style of pyproject.toml's [tool.ruff] holds over src, tests and benchmarks: ruff's lint rules (no line over
120 columns, pyflakes' rules, no `# noqa` that suppresses nothing) and its formatter (`ruff format --check` would
change nothing). ruff itself does the checking, with the project's configuration; the tests on a small file show
that each check can fail. No type checker runs, so no comment may speak to one: no `# type: ignore`. A module holds
one idea: past a soft ceiling of 700 lines it most likely holds two, and is split by idea (never to fit a count)."""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("src", "tests", "benchmarks")
# One idea per module: a module split to fit a count scatters its idea, so this is a ceiling, not a target. A module
# past it most likely holds two ideas; split it where the ideas part (README's Development section says so).
MODULE_CEILING = 700


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """ruff from this interpreter's environment (the dev extra installs it), with pyproject.toml's settings."""
    if importlib.util.find_spec("ruff") is None:
        pytest.fail("ruff is not installed here: it comes with the dev extra (pip install -e '.[dev]')")
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--config", str(ROOT / "pyproject.toml")],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_ruff_lint_rules_hold():
    result = ruff("check", "--no-cache", *CHECKED)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_would_change_nothing():
    result = ruff("format", "--check", "--no-cache", *CHECKED)
    assert result.returncode == 0, (
        result.stdout + result.stderr + "\nformat them with: python -m ruff format src tests benchmarks"
    )


def type_ignores(text: str) -> list[int]:
    """The lines of `text` (Python source) with a `# type: ignore` comment."""
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return [t.start[0] for t in tokens if t.type == tokenize.COMMENT and "type: ignore" in t.string]


def test_no_type_ignore_without_a_type_checker():
    """hpctrain runs no type checker (mypy, pyright): a `# type: ignore` would answer to nothing and go stale."""
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for folder in CHECKED
        for path in sorted((ROOT / folder).rglob("*.py"))
        for line in type_ignores(path.read_text(encoding="utf-8"))
    ]
    assert found == [], "remove these `# type: ignore` comments (no type checker runs):\n" + "\n".join(found)
    assert type_ignores("x = y  # type: ignore[attr-defined]\ns = '# type: ignore'\n") == [1]


def test_the_lint_check_catches_a_long_line_and_an_unused_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import os\n\nLONG = '" + "x" * 112 + "'\nFITS = '" + "x" * 111 + "'\n")  # 121 and 120 columns
    result = ruff("check", "--no-cache", "--output-format", "concise", sample.name, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "sample.py:3:121: E501 Line too long (121 > 120)" in result.stdout
    assert "sample.py:4:" not in result.stdout
    assert "sample.py:1:8: F401" in result.stdout


def test_the_lint_check_catches_a_noqa_that_suppresses_nothing(tmp_path):
    """A `# noqa` for a rule ruff does not run here (BLE001), or for a rule not broken on its line, is RUF100."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os  # noqa: F401\n\ntry:\n    pass\nexcept Exception:  # noqa: BLE001\n    pass\nx = 1  # noqa: F401\n"
    )
    result = ruff("check", "--no-cache", "--output-format", "concise", sample.name, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "sample.py:5:" in result.stdout and "sample.py:7:" in result.stdout and "RUF100" in result.stdout
    assert "sample.py:1:" not in result.stdout


def test_the_format_check_catches_unformatted_code(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("x = {  'a':1 }\n")
    result = ruff("format", "--check", "--no-cache", sample.name, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "sample.py" in result.stdout and "1 file would be reformatted" in result.stdout


def modules_past_the_ceiling(root: Path) -> list[str]:
    """The modules under `root` longer than MODULE_CEILING lines, each with its length."""
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MODULE_CEILING:
            found.append(f"{path.relative_to(root)}: {lines} lines")
    return found


def test_each_module_stays_under_the_soft_ceiling():
    found = modules_past_the_ceiling(ROOT / "src")
    assert found == [], (
        f"these modules are past {MODULE_CEILING} lines, so likely hold more than one idea; split each where its "
        "ideas part (one idea per module, a name that says which):\n" + "\n".join(found)
    )


def test_the_ceiling_catches_a_long_module(tmp_path):
    (tmp_path / "long.py").write_text("x = 1\n" * (MODULE_CEILING + 1))
    (tmp_path / "fits.py").write_text("x = 1\n" * MODULE_CEILING)
    assert modules_past_the_ceiling(tmp_path) == [f"long.py: {MODULE_CEILING + 1} lines"]
