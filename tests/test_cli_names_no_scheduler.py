"""The CLI names no scheduler and branches on no backend's value (issue 30): each backend adds its own flags, reads
its own job-file section, completes its jobs and answers what differs. An AST walk over src/hpctrain/cli/ finds
every string that names a scheduler or one of its own words, outside the help text a user reads."""

from __future__ import annotations

import ast
import re
from pathlib import Path

CLI = Path(__file__).resolve().parents[1] / "src" / "hpctrain" / "cli"
WORDS = re.compile(r"slurm|kubernetes|pytorchjob|trainjob|sbatch|squeue|scontrol|kubectl|k8s", re.IGNORECASE)
HELP_KEYWORDS = {"help", "description", "epilog", "metavar", "usage"}
HELP_NAMES = {"DESCRIPTION", "SUBCOMMANDS"}  # cli/__init__.py: the top-level parser's description, each command's help
# Environment variables srun sets for the processes it starts: what `hpctrain train` and `hpctrain env` read about
# their launcher (hpctrain.distributed's concern, as torchrun's RANK is), not the scheduler backend.
LAUNCHER_VARIABLE = re.compile(r"^SLURM_[A-Z_]+$")


def help_text_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes that are help text: docstrings, help=/description=/metavar=/..._help= values, argument
    group titles, and the values of HELP_NAMES."""
    exempt: set[int] = set()

    def mark(node: ast.AST) -> None:
        exempt.update(id(sub) for sub in ast.walk(node))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                mark(first.value)
        if (
            isinstance(node, ast.keyword)
            and node.arg is not None
            and (node.arg in HELP_KEYWORDS or node.arg.endswith("_help"))
        ):
            mark(node.value)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument_group"
            and node.args
        ):
            mark(node.args[0])
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id in HELP_NAMES for t in targets) and node.value is not None:
                mark(node.value)
        if isinstance(node, ast.FunctionDef) and node.name.endswith("_help"):
            mark(node)  # a function that builds a help text (scheduling.chosen_scheduler_help)
    return exempt


def scheduler_words(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    exempt = help_text_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in exempt:
            if WORDS.search(node.value) and not LAUNCHER_VARIABLE.match(node.value):
                found.append((node.lineno, node.value))
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found += [(node.lineno, f"import {n}") for n in names if re.search(r"schedulers\.(slurm|kubernetes)", n)]
        if isinstance(node, (ast.Name, ast.Attribute, ast.arg, ast.FunctionDef)):
            name = {ast.Name: "id", ast.Attribute: "attr", ast.arg: "arg", ast.FunctionDef: "name"}[type(node)]
            text = getattr(node, name)
            if re.search(r"kubernetes|pytorchjob|trainjob|k8s", text, re.IGNORECASE):
                found.append((node.lineno, text))
    return sorted(found)


def test_the_cli_names_no_scheduler_outside_its_help_text() -> None:
    named = {path.name: words for path in sorted(CLI.glob("*.py")) if (words := scheduler_words(path.read_text()))}
    assert named == {}, "backend words in the CLI (a backend's BackendInfo should answer instead): " + repr(named)


WEB = CLI.parent / "web"


def test_the_web_console_names_no_scheduler() -> None:
    """The other face too (hpctrain.web): its modules outside their help text, and its templates, script and style
    sheet, name no scheduler; what a page shows of one is what the backend returned."""
    named = {path.name: words for path in sorted(WEB.glob("*.py")) if (words := scheduler_words(path.read_text()))}
    assets = [path for folder in ("templates", "static") for path in sorted((WEB / folder).iterdir())]
    named.update({path.name: WORDS.findall(path.read_text()) for path in assets if WORDS.search(path.read_text())})
    assert len(assets) >= 4
    assert named == {}, "backend words in the web console: " + repr(named)


def test_the_walk_finds_a_scheduler_branch_and_an_argument_of_one() -> None:
    """The check can fail: a branch on a scheduler's name, a backend's own value and its import are found; help
    text and launcher variables are not."""
    source = '''
"""Docstrings may say Slurm."""
from hpctrain.schedulers.kubernetes.options import APIS

def run(args, parser):
    parser.add_argument("--x", help="Slurm: the partition")
    group = parser.add_argument_group("kubernetes options")
    rank = os.environ.get("SLURM_LOCALID")
    if args.scheduler == "slurm":
        parser.add_argument("--k8s-api", choices=("pytorchjob", "trainjob"))
'''
    assert scheduler_words(source) == [
        (3, "import hpctrain.schedulers.kubernetes.options"),
        (9, "slurm"),
        (10, "--k8s-api"),
        (10, "pytorchjob"),
        (10, "trainjob"),
    ]
