"""The packages import one way only: the layers contract in pyproject.toml ([tool.importlinter]), checked by
import-linter itself on the real source tree, and shown to catch an upward import on a copy of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(src: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the package under `src`, with the project's contract; the source is parsed, not run."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    # import-linter caches the import graph in .import_linter_cache of the working directory: none here.
    return subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                               "sys.argv = ['lint-imports', '--no-cache', sys.argv[1]]; lint_imports_command()",
         str(ROOT / "pyproject.toml")],
        env=env, cwd=src, capture_output=True, text=True, timeout=300,
    )


def test_every_package_imports_only_from_the_layers_below_it():
    result = lint_imports(ROOT / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    """The check can fail: a copy of the tree where a low module (the data package) imports the CLI."""
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "hpctrain", copy / "hpctrain", ignore=shutil.ignore_patterns("__pycache__"))
    loader = copy / "hpctrain" / "data" / "__init__.py"
    loader.write_text(loader.read_text() + "\nfrom hpctrain.cli import main as _upwards  # noqa: E402\n")
    result = lint_imports(copy)
    assert result.returncode != 0, result.stdout
    assert "hpctrain.data is not allowed to import hpctrain.cli" in result.stdout
    assert "hpctrain.data -> hpctrain.cli" in result.stdout
