"""The programs hpctrain hands to a shell or an interpreter (src/hpctrain/**/programs/*) are linted as programs:
every shell template passes `bash -n` and shellcheck as it stands (its `@NAME@` values unfilled), every Python one
ruff (tests/test_style.py's run covers src), and each is shipped (a package-data glob in pyproject.toml names it).
A planted syntax error, or a shellcheck finding, fails the same check."""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys

try:
    import tomllib  # novm: Python 3.11's; the floor's 3.10 reads pyproject.toml with tomli
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from pathlib import Path

import pytest

from hpctrain import program_text

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "hpctrain"
TEMPLATES = sorted(p for p in PACKAGE.rglob("programs/*") if p.is_file() and p.suffix != ".pyc")
SHELL = [p for p in TEMPLATES if p.suffix == ".sh"]


def shell_problems(path: Path) -> str:
    """What `bash -n` and shellcheck say of the template at `path` ("" when both pass)."""
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"bash -n {path.name}: {proc.stderr}"
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed: apt-get install shellcheck")
    proc = subprocess.run(["shellcheck", "--shell=bash", str(path)], capture_output=True, text=True)
    return "" if proc.returncode == 0 else proc.stdout + proc.stderr


def test_there_are_templates_of_each_kind() -> None:
    assert {p.suffix for p in TEMPLATES} >= {".sh", ".py", ".awk"}
    assert not any((p.parent / "__init__.py").exists() for p in TEMPLATES)  # a folder of programs, not a package


@pytest.mark.parametrize("path", SHELL, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_shell_template_passes_bash_n_and_shellcheck(path: Path) -> None:
    assert shell_problems(path) == ""


def test_the_shell_check_catches_a_syntax_error_and_a_shellcheck_finding(tmp_path: Path) -> None:
    source = SHELL[0].read_text()
    broken = tmp_path / "broken.sh"
    broken.write_text(source + "if [ -f x ]; then\n")  # no `fi`
    assert "bash -n broken.sh" in shell_problems(broken)
    unquoted = tmp_path / "unquoted.sh"
    unquoted.write_text(source + "f() {\n    rm -f $1\n}\n")
    assert "SC2086" in shell_problems(unquoted)


def awk_problems(path: Path) -> str:
    """What awk (POSIX awk, as the images have) says of the program at `path`, run on no input."""
    proc = subprocess.run(["awk", "-f", str(path), "/dev/null"], capture_output=True, text=True)
    return "" if proc.returncode == 0 else proc.stderr


@pytest.mark.parametrize("path", [p for p in TEMPLATES if p.suffix == ".awk"], ids=lambda p: p.name)
def test_each_awk_program_parses(path: Path, tmp_path: Path) -> None:
    filled = tmp_path / path.name
    filled.write_text(program_text.PLACEHOLDER.sub("1", path.read_text()))  # awk has no unparsed form: fill them
    assert awk_problems(filled) == ""
    broken = tmp_path / "broken.awk"
    broken.write_text(filled.read_text() + "{ print (\n")
    assert awk_problems(broken) != ""


def test_the_python_templates_are_ruffs_to_check() -> None:
    python = [p for p in TEMPLATES if p.suffix == ".py"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--no-cache",
            "--config",
            str(ROOT / "pyproject.toml"),
            *map(str, python),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_template_is_package_data() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["hpctrain"]
    unshipped = [
        str(p.relative_to(PACKAGE))
        for p in TEMPLATES
        if not any(fnmatch.fnmatch(str(p.relative_to(PACKAGE)), g) for g in globs)
    ]
    assert unshipped == []


def test_fill_refuses_a_missing_or_an_unused_value() -> None:
    package = "hpctrain.schedulers.slurm.batch"
    with pytest.raises(AssertionError, match="NODE_LIST_MAX_BYTES"):
        program_text.fill(package, "run_dir_files.sh")
    with pytest.raises(AssertionError, match="EXTRA"):
        program_text.fill(package, "run_dir_files.sh", NODE_LIST_MAX_BYTES=1, EXTRA=2)
    assert "head -c 7 --" in program_text.fill(package, "run_dir_files.sh", NODE_LIST_MAX_BYTES=7)
    assert not program_text.fill(package, "run_dir_files.sh", NODE_LIST_MAX_BYTES=7).startswith("# shellcheck")
