"""A missing optional dependency (hpctrain[k8s], [jupyter], [dali]) is one line naming its install command, from
every command, through one mechanism (hpctrain.extras, applied by the CLI's entry point)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.extras import missing_extra, require

ROOT = Path(__file__).resolve().parents[1]

# A test-only startup file: Python imports `sitecustomize` at start, and this one hides the named top-level modules,
# as if their packages were not installed (the default `pip install hpctrain` leaves them out).
BLOCKER = """
import os, sys
from importlib.abc import MetaPathFinder

class _Hide(MetaPathFinder):
    hidden = set(os.environ["HIDE_MODULES"].split(","))

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.hidden or name in self.hidden:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Hide())
"""


def run_without(modules: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    startup = cwd / "startup"
    startup.mkdir(exist_ok=True)
    (startup / "sitecustomize.py").write_text(BLOCKER)
    env = {
        **os.environ,
        "HIDE_MODULES": modules,
        "PYTHONPATH": os.pathsep.join([str(startup), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    "args",
    [
        ("status", "--scheduler", "kubernetes"),
        ("cluster", "--scheduler", "kubernetes"),
        ("cancel", "job-1", "--scheduler", "kubernetes"),
        ("check", "--scheduler", "kubernetes", "--image", "example.invalid/x:1", "--", "python", "-c", "pass"),
        ("submit", "--scheduler", "kubernetes", "--image", "example.invalid/x:1", "--", "python", "-c", "pass"),
    ],
)
def test_kubernetes_commands_without_the_client_name_the_extra(tmp_path: Path, args: tuple[str, ...]) -> None:
    proc = run_without("kubernetes", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"hpctrain {args[0]}: error: ") and "pip install 'hpctrain[k8s]'" in lines[0], (
        proc.stderr
    )


@pytest.mark.parametrize(
    ("module", "extra"),
    [
        ("kubernetes", "k8s"),
        ("kubernetes.client.rest", "k8s"),
        ("jsonschema", "k8s"),
        ("jupyterlab", "jupyter"),
        ("nvidia.dali", "dali"),
        ("nvidia", "dali"),
    ],
)
def test_every_optional_module_maps_to_its_extra(module: str, extra: str) -> None:
    error = missing_extra(ModuleNotFoundError(f"No module named {module!r}", name=module))
    assert error is not None and f"pip install 'hpctrain[{extra}]'" in str(error)


def test_other_missing_modules_keep_their_traceback() -> None:
    assert missing_extra(ModuleNotFoundError("No module named 'numpyy'", name="numpyy")) is None
    with pytest.raises(ModuleNotFoundError):
        require("hpctrain_no_such_module")
