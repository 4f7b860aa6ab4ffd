"""Commands that only describe, check or render a job start without importing torch (seconds of CPU each):
help texts, `submit --dry-run`, `check`, `status`. Each runs as users run it, in a fresh interpreter, whose first
`import torch` (if any) is recorded with the stack that asked for it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from training_helpers import clean_environ

# Runs hpctrain's main; then says on its last stderr line whether torch was imported, and from where.
RUN_AND_REPORT = '''
import json, sys, traceback

class _WatchTorch:
    """Records the stack of the first `import torch`; the import itself goes on as usual."""
    stack = None

    def find_spec(self, name, path=None, target=None):
        if name == "torch" and _WatchTorch.stack is None:
            _WatchTorch.stack = [f"{f.filename}:{f.lineno} {f.line}" for f in traceback.extract_stack()
                                 if "/hpctrain/" in f.filename]
        return None

sys.meta_path.insert(0, _WatchTorch())
from hpctrain.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
print("REPORT " + json.dumps({"code": code, "torch": "torch" in sys.modules, "stack": _WatchTorch.stack}),
      file=sys.stderr)
'''


def run_reporting(tmp_path: Path, *args: str) -> dict:
    env = {**clean_environ(), "HOME": str(tmp_path / "home")}  # no kubeconfig or dev sessions of the user's
    proc = subprocess.run(
        [sys.executable, "-c", RUN_AND_REPORT, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("REPORT "), proc.stderr
    return {**json.loads(last.removeprefix("REPORT ")), "stdout": proc.stdout, "stderr": proc.stderr}


def assert_no_torch(report: dict) -> None:
    assert not report["torch"], "torch was imported by:\n" + "\n".join(report["stack"] or ["(unknown)"])


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["train", "--help"],
        ["train", "mnist", "--help"],
        ["train", "imagenet", "--help"],
        ["prepare", "--help"],
        ["submit", "--help"],
        ["check", "--help"],
        ["status", "--help"],
    ],
    ids=" ".join,
)
def test_help_does_not_import_torch(tmp_path: Path, args: list[str]) -> None:
    report = run_reporting(tmp_path, *args)
    assert report["code"] == 0 and "usage: hpctrain" in report["stdout"], report["stderr"]
    assert_no_torch(report)


def test_submit_dry_run_of_a_recipe_does_not_import_torch(tmp_path: Path, fashion_data_dir: Path) -> None:
    report = run_reporting(
        tmp_path,
        "submit",
        "--scheduler",
        "slurm",
        "--dry-run",
        "--nodes",
        "2",
        "train",
        "mnist",
        "--dataset",
        "fashion-mnist",
        "--data-dir",
        str(fashion_data_dir),
        "--epochs",
        "1",
    )
    assert report["code"] == 0, report["stderr"]
    assert "hpctrain train mnist --dataset fashion-mnist" in report["stdout"]
    assert_no_torch(report)


def test_a_recipe_whose_dataset_is_missing_is_refused_without_torch(tmp_path: Path) -> None:
    """The dataset check (recipes.check_data) and the recipe's name check (recipes.recipe_info) need no recipe
    module."""
    report = run_reporting(
        tmp_path,
        "submit",
        "--scheduler",
        "slurm",
        "--dry-run",
        "train",
        "mnist",
        "--data-dir",
        str(tmp_path / "nothing"),
    )
    assert report["code"] == 2 and "hpctrain download mnist" in report["stderr"], report["stderr"]
    assert_no_torch(report)
    report = run_reporting(
        tmp_path, "submit", "--scheduler", "slurm", "--dry-run", "train", "mnist", "--recipe", "tutorial"
    )
    assert report["code"] == 2 and "unknown --recipe 'tutorial' for mnist" in report["stderr"], report["stderr"]
    assert_no_torch(report)


def test_check_and_status_do_not_import_torch(tmp_path: Path, fashion_data_dir: Path) -> None:
    """Whether or not a Slurm cluster answers here: neither the job's checks nor the queue's view need torch."""
    report = run_reporting(
        tmp_path,
        "check",
        "--scheduler",
        "slurm",
        "train",
        "mnist",
        "--dataset",
        "fashion-mnist",
        "--data-dir",
        str(fashion_data_dir),
    )
    assert report["code"] in (0, 2), report["stderr"]
    assert_no_torch(report)
    report = run_reporting(tmp_path, "status", "--scheduler", "slurm")
    assert report["code"] in (0, 2), report["stderr"]
    assert_no_torch(report)


def test_prepare_help_shows_the_shard_writers_defaults() -> None:
    """cli/prepare repeats two defaults of the shard writer so that its help needs no torch: they must agree."""
    from hpctrain.cli import prepare
    from hpctrain.data import shards

    from hpctrain.data.shards import writer

    assert (prepare.DEFAULT_MAX_SIDE, prepare.DEFAULT_JPEG_QUALITY, prepare.STORED_FORMATS) == (
        shards.DEFAULT_MAX_SIDE,
        shards.DEFAULT_JPEG_QUALITY,
        writer.STORED_FORMATS,
    )


def test_importing_the_recipes_package_imports_no_recipe(tmp_path: Path) -> None:
    code = (
        "import sys; import hpctrain.recipes as r; assert r.WORKLOADS; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('hpctrain.recipes.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=clean_environ(), capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.strip() == "['hpctrain.recipes.catalog']"
