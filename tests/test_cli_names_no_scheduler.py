"""The CLI names no scheduler and branches on no backend's value (issue 30): each backend adds its own flags, reads
its own job-file section, completes its jobs and answers what differs. An AST walk over src/hpctrain/cli/ finds
every string that names a scheduler or one of its own words, outside the help text a user reads."""

from __future__ import annotations

import argparse
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
    """The CLI and the engine under both faces (hpctrain.engine: choosing the scheduler, the job flags, submission)."""
    paths = [*sorted(CLI.glob("*.py")), *sorted((CLI.parent / "engine").glob("*.py"))]
    named = {path.name: words for path in paths if (words := scheduler_words(path.read_text()))}
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
from hpctrain.schedulers.kubernetes.manifests.options import APIS

def run(args, parser):
    parser.add_argument("--x", help="Slurm: the partition")
    group = parser.add_argument_group("kubernetes options")
    rank = os.environ.get("SLURM_LOCALID")
    if args.scheduler == "slurm":
        parser.add_argument("--k8s-api", choices=("pytorchjob", "trainjob"))
'''
    assert scheduler_words(source) == [
        (3, "import hpctrain.schedulers.kubernetes.manifests.options"),
        (9, "slurm"),
        (10, "--k8s-api"),
        (10, "pytorchjob"),
        (10, "trainjob"),
    ]


# ---- issue 40 item 2: each backend declares its own flags; the CLI matches no backend's message text ----------------

SCHEDULERS_DIR = CLI.parent / "schedulers"


def backend_declarations(monkeypatch) -> tuple[set[str], set[int], list[argparse.ArgumentParser]]:
    """Every long flag a backend owns (its INFO.flags, and what its add_arguments adds for any role), and the ids of
    the argparse actions its add_arguments added while the real CLI parsers were built."""
    import dataclasses
    import importlib

    from hpctrain.cli import SUBCOMMANDS, build_parser
    from hpctrain.schedulers import SCHEDULERS, backend_info
    from hpctrain.schedulers.base import ROLES

    owned: set[str] = set()
    added: set[int] = set()
    infos = {name: backend_info(name) for name in SCHEDULERS}
    for info in infos.values():
        owned.update(flag for flag in info.flags.values() if flag.startswith("--"))
        for role in ROLES:
            parser = argparse.ArgumentParser(add_help=False)
            info.add_arguments(parser, parser.add_argument_group("scheduler"), role)
            owned.update(o for a in parser._actions for o in a.option_strings if o.startswith("--"))

    def recording(info):
        def add_arguments(parser, group, role):
            before = {id(a) for a in parser._actions}
            info.add_arguments(parser, group, role)
            added.update(id(a) for a in parser._actions if id(a) not in before)

        return dataclasses.replace(info, add_arguments=add_arguments)

    scheduling = importlib.import_module("hpctrain.engine.scheduling")
    monkeypatch.setattr(scheduling, "backend_info", lambda name: recording(infos[name]))
    parsers = [build_parser(name) for name in SUBCOMMANDS]
    return owned, added, parsers


def flags_the_cli_declares(parsers, owned: set[str], added: set[int]) -> list[tuple[str, str]]:
    """(command, flag) for each backend's flag that a parser of a command that talks to a scheduler (one with
    --scheduler) got from the CLI rather than from the backend's add_arguments."""
    found = []

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{path} {name}")
        if "--scheduler" not in parser._option_string_actions:
            return
        for action in parser._actions:
            flags = [o for o in action.option_strings if o in owned]
            if flags and id(action) not in added:
                found.append((path.strip(), flags[0]))

    for parser in parsers:
        walk(parser, "")
    return sorted(set(found))


def test_the_cli_declares_no_flag_that_only_a_backend_understands(monkeypatch) -> None:
    owned, added, parsers = backend_declarations(monkeypatch)
    assert {"--partition", "--gres", "--venv", "--replica", "--namespace"} <= owned  # the walk sees declarations
    assert flags_the_cli_declares(parsers, owned, added) == []


def test_the_flag_walk_finds_a_backend_flag_the_cli_declares(monkeypatch) -> None:
    """It can fail: a command's own --partition, beside what the backends add, is found."""
    owned, added, parsers = backend_declarations(monkeypatch)
    extra = argparse.ArgumentParser(prog="x")
    extra.add_argument("--scheduler")
    extra.add_argument("--partition")
    assert flags_the_cli_declares([extra], owned, added) == [("", "--partition")]


def backend_texts() -> list[str]:
    """Every string literal of the backends, with the literal parts of their f-strings: what they say."""
    texts = []
    for path in sorted(SCHEDULERS_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                texts.append(node.value)
    return texts


def message_matches(source: str, texts: list[str], shortest: int = 12) -> list[tuple[int, str]]:
    """Literals tested against a message (`"..." in x`, `x.startswith("...")`, `re.search("...", x)`) that are a
    part of what a backend says: a face that reads a backend's message by its text."""
    tree = ast.parse(source)
    probes: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            probes.append(node.left)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("startswith", "endswith", "find", "index", "count", "search", "match", "fullmatch"):
                probes.extend(node.args)
    found = []
    for probe in probes:
        for sub in ast.walk(probe):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and len(sub.value) >= shortest:
                if any(sub.value in text for text in texts):
                    found.append((sub.lineno, sub.value))
    return sorted(found)


FACES = [*sorted(CLI.glob("*.py")), *sorted(WEB.glob("*.py")), *sorted((CLI.parent / "engine").glob("*.py"))]


def test_no_face_matches_a_backends_message_by_its_text() -> None:
    """What a backend means by a message it says in its types and fields (hpctrain.schedulers.base.Prerequisite),
    never in words a face (or the engine under both) looks for."""
    texts = backend_texts()
    found = {path.name: m for path in FACES if (m := message_matches(path.read_text(), texts))}
    assert found == {}, "a face reads a backend's message by its text: " + repr(found)


def test_the_message_walk_finds_a_match_of_a_backends_text() -> None:
    """It can fail: the check cli/submit.py made of a Slurm message before, and its forms, are found."""
    source = """
def notes(problems, venv_missing):
    a = [p for p in problems if venv_missing and "is not on the PATH the job will have" in p]
    b = [p for p in problems if p.startswith(("is not on the PATH the job", "warning: "))]
    return a + b
"""
    assert message_matches(source, backend_texts()) == [
        (3, "is not on the PATH the job will have"),
        (4, "is not on the PATH the job"),
    ]


# ---- issue 40: a face names no backend's flag dest (each backend reads its own from what it declared) ---------------


def backend_dests() -> set[str]:
    """The argparse dests of every flag a backend declares, for any role (hpctrain.engine.scheduling.role_dests),
    less the parameters of the interface's own methods (Scheduler, Services: `status_view(all_users=...)`,
    `cancel_and_wait(signal=...)`) and what every backend's create() takes (`context`), which a face passes on by the
    interface's name for them, and the dests of flags the CLI declares itself (`image --output`)."""
    import importlib
    import inspect

    from hpctrain.engine.scheduling import role_dests
    from hpctrain.cli import SUBCOMMANDS, build_parser
    from hpctrain.schedulers import SCHEDULERS
    from hpctrain.schedulers.base import ROLES, Scheduler
    from hpctrain.schedulers.service_api import Services

    methods = [m for protocol in (Scheduler, Services) for _, m in inspect.getmembers(protocol, inspect.isfunction)]
    creates = [importlib.import_module(module).create for module in SCHEDULERS.values()]  # what every one is built with
    common = set.intersection(*({*inspect.signature(create).parameters} for create in creates))
    interface = common | {name for method in methods for name in inspect.signature(method).parameters}
    declared = {dest for name in SCHEDULERS for role in ROLES for dest in role_dests(name, role)}
    own = set()  # the CLI's own flags: on a command that talks to no scheduler (no --scheduler)

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)
        if "--scheduler" not in parser._option_string_actions:
            own.update(action.dest for action in parser._actions)

    for command in SUBCOMMANDS:
        walk(build_parser(command))
    return declared - interface - own


def dest_uses(source: str, dests: set[str]) -> list[tuple[int, str]]:
    """Where `source` reads one of `dests` from parsed flags: `args.conda_env`, `getattr(args, "shm", None)`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "args":
            if node.attr in dests:
                found.append((node.lineno, node.attr))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            named = node.args[1] if len(node.args) > 1 else None
            if isinstance(named, ast.Constant) and named.value in dests:
                found.append((node.lineno, named.value))
    return sorted(found)


def test_the_cli_names_no_backends_flag_dest() -> None:
    """The CLI passes a backend's flags on by what the backend declared (engine.scheduling.backend_flag_values: a
    service's Placement), never by their names: adding a flag to a backend needs no line in the CLI."""
    dests = backend_dests()
    assert {"conda_env", "venv", "volumes", "shm", "gpu_type", "login_host", "modules"} <= dests
    paths = [*sorted(CLI.glob("*.py")), *sorted((CLI.parent / "engine").glob("*.py"))]
    named = {path.name: uses for path in paths if (uses := dest_uses(path.read_text(), dests))}
    assert named == {}, "a backend's flag dest named in the CLI (the backend should read its own): " + repr(named)


def test_the_dest_walk_finds_a_backends_dest_in_a_face() -> None:
    """It can fail: the placement the CLI built by naming each backend's dest before is found."""
    source = """
def placement_from_args(args):
    given = {"conda_env": args.conda_env, "shm": getattr(args, "shm", None), "image": args.image}
    return Placement(image=args.image, options={**given, "volumes": tuple(args.volumes)})
"""
    assert dest_uses(source, backend_dests()) == [(3, "conda_env"), (3, "shm"), (4, "volumes")]
