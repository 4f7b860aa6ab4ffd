"""Every `hpctrain ...` command that README.md, docs/ and examples/README.md show parses with hpctrain's own parser:
no option the docs name was renamed or removed, no positional is left over, and each subcommand exists.

Parsing only (nothing runs): the commands that can run here run in their own tests (the README's Training block in
test_readme_training.py, the example job files in test_job_examples.py, the quick start in test_scripts.py); many
of the others need a GPU cluster, a registry or data that cannot exist here."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from hpctrain.cli import SUBCOMMANDS, build_parser, late_positionals, unrecognized

# The floor environment (the oldest supported Python, torch, torchvision) parses them too.
pytestmark = pytest.mark.floor

ROOT = Path(__file__).parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "examples" / "README.md"]
SHELL_BREAKS = {"|", "||", "&&", ";", ">", ">>", "&"}


def documented_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after `hpctrain`) for each hpctrain command line in the docs' fenced code blocks."""
    found = []
    for doc in DOCS:
        in_block, pending, start = False, "", 0
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_block, pending = not in_block, ""
                continue
            if not in_block:
                continue
            text = re.sub(r"^\s*\$\s+", "", line) if not pending else line
            if not pending and not text.lstrip().startswith("hpctrain "):
                continue
            start = start if pending else number
            if text.rstrip().endswith("\\"):
                pending += text.rstrip()[:-1] + " "
                continue
            found += [(f"{doc.relative_to(ROOT)}:{start}", argv) for argv in _hpctrain_commands(pending + text)]
            pending = ""
    return found


def _hpctrain_commands(line: str) -> list[list[str]]:
    """The hpctrain commands of one shell line (`a; b && c | d`), each without `hpctrain`. A synopsis' optional
    parts (`[JOB] [--json]`) are left out: the required words must parse on their own."""
    lexer = shlex.shlex(re.sub(r"\s\[[^\]]*\]", "", line), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, words = [], []
    for word in [*lexer, ";"]:
        if word in SHELL_BREAKS:
            if words[:1] == ["hpctrain"]:
                commands.append(words[1:])
            words = []
        else:
            words.append(word)
    return commands


COMMANDS = documented_commands()


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 40  # the extraction still finds them (README alone shows dozens)


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_a_documented_command_parses(where: str, argv: list[str]):
    chosen = next((a for a in argv if not a.startswith("-")), None)
    assert chosen in SUBCOMMANDS or argv[:1] in (["--help"], ["--version"]), f"{where}: no such command: {argv}"
    parser = build_parser(only=chosen)
    if "--help" in argv or "-h" in argv:
        return
    try:
        args, extras = parser.parse_known_args(argv)
    except SystemExit as err:
        pytest.fail(f"{where}: `hpctrain {shlex.join(argv)}` does not parse (exit {err.code})")
    sub: argparse.ArgumentParser = args.parser_
    extras = late_positionals(sub, args, extras)
    assert not extras, f"{where}: `hpctrain {shlex.join(argv)}`: {unrecognized(sub, extras)}"
