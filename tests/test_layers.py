"""The packages import one way only, and each scheduler stays in its own package: the contracts in pyproject.toml
([tool.importlinter]), checked by import-linter itself on the real source tree, each shown to catch a planted import
on a copy of it; and how many modules `hpctrain dev start` crosses on either scheduler (issue 30)."""

from __future__ import annotations

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
    assert "5 kept, 0 broken" in result.stdout


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
            "schedulers/slurm/batch/script.py",
            "from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions",
            "the scheduler backends are independent of each other",
            "hpctrain.schedulers.slurm is not allowed to import hpctrain.schedulers.kubernetes",
        ),
        (
            "schedulers/kubernetes/manifests/render.py",
            "from hpctrain.schedulers.slurm.queries.gres import parse_gres",
            "the scheduler backends are independent of each other",
            "hpctrain.schedulers.kubernetes is not allowed to import hpctrain.schedulers.slurm",
        ),
        # The CLI reaches a backend through get_scheduler(name) only, never one of its modules.
        (
            "cli/dev.py",
            "from hpctrain.schedulers.slurm.services.service_jobs import SlurmServices",
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
            "from hpctrain.schedulers.slurm.queries.display import jobs_view",
            "above schedulers, only its interface",
            "hpctrain.web is not allowed to import hpctrain.schedulers.slurm",
        ),
        # The faces call the engine: a job file's scheduler section and the reading of job data are the engine's.
        (
            "cli/submit.py",
            "from hpctrain.schedulers.job_sections import read_job_file",
            "the faces call the engine and the registry",
            "hpctrain.cli is not allowed to import hpctrain.schedulers.job_sections",
        ),
        (
            "web/fit.py",
            "from hpctrain.jobs.mapping import from_mapping",
            "the faces call the engine and the registry",
            "hpctrain.web is not allowed to import hpctrain.jobs.mapping",
        ),
        # The schedulers' old imports of the training side (stop words, exit codes) and of the recipes (the data check).
        (
            "schedulers/slurm/batch/script.py",
            "from hpctrain.training.stopping import SIGNALS_FILE",
            "schedulers do not import training or recipes",
            "hpctrain.schedulers is not allowed to import hpctrain.training",
        ),
        (
            "schedulers/kubernetes/checks/submit_host.py",
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
    assert "4 kept, 1 broken" in said
