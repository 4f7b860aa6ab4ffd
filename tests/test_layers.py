"""The packages import one way only, and each scheduler stays in its own package: the contracts in pyproject.toml
([tool.importlinter]), checked by import-linter itself on the real source tree, each shown to catch a planted import
on a copy of it; and how many modules `hpctrain dev start` crosses on either scheduler (issue 30)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def lint_imports(src: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the package under `src`, with the project's contract; the source is parsed, not run."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    # import-linter caches the import graph in .import_linter_cache of the working directory: none here.
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; "
            "sys.argv = ['lint-imports', '--no-cache', sys.argv[1]]; lint_imports_command()",
            str(ROOT / "pyproject.toml"),
        ],
        env=env,
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_package_imports_only_from_the_layers_below_it():
    result = lint_imports(ROOT / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 kept, 0 broken" in result.stdout


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


@pytest.mark.parametrize(
    ("module", "line", "refusal"),
    [
        ("web/app.py", "from hpctrain.cli.views import show", "hpctrain.web is not allowed to import hpctrain.cli"),
        (
            "cli/status.py",
            "from hpctrain.web.safeview import view_parts",
            "hpctrain.cli is not allowed to import hpctrain.web",
        ),
    ],
)
def test_the_two_faces_do_not_import_each_other(tmp_path, module, line, refusal):
    """cli and web are side by side in the layers: either importing the other breaks the layers contract."""
    result = planted(tmp_path, module, line)
    said = " ".join(result.stdout.split())
    assert result.returncode != 0, result.stdout
    assert "hpctrain's packages import downwards only BROKEN" in said
    assert refusal in said


def planted(tmp_path: Path, module: str, line: str) -> subprocess.CompletedProcess[str]:
    """lint-imports on a copy of the tree where `module` (a path under hpctrain/) gained the import `line`."""
    copy = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "hpctrain", copy / "hpctrain", ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "hpctrain" / module
    target.write_text(target.read_text() + f"\n{line}  # noqa: E402\n")
    return lint_imports(copy)


@pytest.mark.parametrize(
    ("module", "line", "contract", "refusal"),
    [
        # The backends know nothing of each other (either way round).
        (
            "schedulers/slurm/render.py",
            "from hpctrain.schedulers.kubernetes.options import KubernetesOptions",
            "the scheduler backends are independent of each other",
            "hpctrain.schedulers.slurm is not allowed to import hpctrain.schedulers.kubernetes",
        ),
        (
            "schedulers/kubernetes/render.py",
            "from hpctrain.schedulers.slurm.gres import parse_gres",
            "the scheduler backends are independent of each other",
            "hpctrain.schedulers.kubernetes is not allowed to import hpctrain.schedulers.slurm",
        ),
        # The CLI reaches a backend through get_scheduler(name) only, never one of its modules.
        (
            "cli/dev.py",
            "from hpctrain.schedulers.slurm.services import SlurmServices",
            "above schedulers, only its interface",
            "hpctrain.cli is not allowed to import hpctrain.schedulers.slurm",
        ),
        (
            "cli/top.py",
            "from hpctrain.schedulers.kubernetes import pods",
            "above schedulers, only its interface",
            "hpctrain.cli is not allowed to import hpctrain.schedulers.kubernetes",
        ),
        # The web console is the CLI's sibling face: it reaches a backend through get_scheduler(name) only.
        (
            "web/app.py",
            "from hpctrain.schedulers.slurm.display import jobs_view",
            "above schedulers, only its interface",
            "hpctrain.web is not allowed to import hpctrain.schedulers.slurm",
        ),
        # The schedulers' old imports of the training side (stop words, exit codes) and of the recipes (the data check).
        (
            "schedulers/slurm/requeue.py",
            "from hpctrain.training.stopping import SIGNALS_FILE",
            "schedulers do not import training or recipes",
            "hpctrain.schedulers is not allowed to import hpctrain.training",
        ),
        (
            "schedulers/kubernetes/local.py",
            "from hpctrain.recipes import check_data",
            "schedulers do not import training or recipes",
            "hpctrain.schedulers is not allowed to import hpctrain.recipes",
        ),
    ],
)
def test_each_scheduler_contract_refuses_a_planted_import(tmp_path, module, line, contract, refusal):
    """Each contract can fail: a copy of the tree with one import it forbids breaks that contract (and only it; each
    of these imports goes downwards, so the layers contract alone would let it through)."""
    result = planted(tmp_path, module, line)
    said = " ".join(result.stdout.split())  # the report wraps long lines at the terminal's width
    assert result.returncode != 0, result.stdout
    assert f"{contract} BROKEN" in said
    assert refusal in said
    assert "3 kept, 1 broken" in said


CROSSINGS = r"""
import contextlib, io, json, os, sys
import hpctrain
from hpctrain.cli import main

ROOT = os.path.dirname(hpctrain.__file__) + os.sep
LEAVES = {"hpctrain.errors", "hpctrain.fsutil"}


def module_of(code):
    path = code.co_filename
    if not path.startswith(ROOT):
        return None
    return "hpctrain." + path[len(ROOT):-len(".py")].replace(os.sep, ".").removesuffix(".__init__")


def wraps_callee(frame, callee):
    # a decorator's wrapper: a function in its frame is the one the next frame runs (functools.wraps style)
    return any(getattr(v, "__code__", None) is callee.f_code for v in frame.f_locals.values())


deepest = []
visited = set()


def profile(frame, event, arg):
    if event != "call":
        return
    stack = []
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    stack.reverse()
    if any(f.f_code.co_name == "<module>" and module_of(f.f_code) for f in stack):
        return  # a module's body on its first import: not a step of the command
    start = next((i for i, f in enumerate(stack) if module_of(f.f_code) == "hpctrain.cli.dev"), None)
    if start is None or not any(f.f_code.co_name == "dev_render" for f in stack[start:]):
        return
    chain = []
    for i, f in enumerate(stack[start:], start):
        name = module_of(f.f_code)
        if name is None or name in LEAVES or (i + 1 < len(stack) and wraps_callee(f, stack[i + 1])):
            continue
        if not chain or chain[-1] != name:
            chain.append(name)
    visited.update(chain)
    if len(set(chain)) > len(set(deepest)):
        deepest[:] = chain


sys.setprofile(profile)
with contextlib.redirect_stdout(io.StringIO()) as out:
    status = main(sys.argv[1:])
sys.setprofile(None)
print(json.dumps({"status": status, "chain": deepest, "visited": sorted(visited), "rendered": out.getvalue()}))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["--scheduler", "slurm", "--venv", "/opt/venv"],
        ["--scheduler", "slurm", "--service", "ssh", "--image", "/images/torch.sif", "--mount", "/data"],
        [
            "--scheduler",
            "kubernetes",
            "--namespace",
            "team-a",
            "--image",
            "img:1",
            "--volume",
            "pvc:data:/data",
            "--shm",
            "1Gi",
        ],
    ],
    ids=["slurm-jupyter", "slurm-ssh-container", "kubernetes"],
)
def test_dev_start_crosses_at_most_four_modules(tmp_path, argv):
    """`hpctrain dev start --dry-run` on either scheduler crosses at most 4 modules of hpctrain.

    Measured, not read off the code: with sys.setprofile, at every call made while the rendering runs (from the
    command's module, hpctrain.cli.dev, through the backend's Services.dev_render, which gives `--dry-run` its text,
    down to the deepest call it makes) the hpctrain modules with a frame on the call stack are listed; a module
    entered again further down counts once. The deepest such chain must name at most 4 modules. Not counted: the
    ground floor every layer uses as a leaf (hpctrain.errors, hpctrain.fsutil); a decorator's wrapper frame, which
    only calls the function it wraps (the Kubernetes backend's answer guard); a module's body run on its first
    import. Looking the backend up (get_scheduler) happens before the rendering and returns first; it is not on
    these chains. Before issue 30 this measure gave 6 on either scheduler (Slurm: cli.dev > around.slurm >
    sessions.slurm > services.slurm > jobs.spec > jobs.values; Kubernetes: cli.dev > around.kubernetes >
    sessions.kubernetes > services.kubernetes > schedulers.kubernetes.render > .options)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "HPCTRAIN_HOME": str(tmp_path / "home"),
        "KUBECONFIG": str(tmp_path / "no-kubeconfig"),
        "HPCTRAIN_SCHEDULER": "",
    }
    result = subprocess.run(
        [sys.executable, "-c", CROSSINGS, "dev", "start", "nb", "--dry-run", *argv],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    measured = json.loads(result.stdout.splitlines()[-1])
    assert measured["status"] == 0 and measured["rendered"], measured
    chain = measured["chain"]
    backend = argv[1]
    assert chain[:2] == ["hpctrain.cli.dev", f"hpctrain.schedulers.{backend}.services"], chain
    assert f"hpctrain.schedulers.{backend}.render" in measured["visited"]  # the trace saw the rendering itself
    assert len(set(chain)) <= 4, " > ".join(chain)
