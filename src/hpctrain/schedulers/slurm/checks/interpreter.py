"""Whether the job's Python can import what the job needs: torch for a built-in recipe, and for `-- python
my_train.py` the modules the script imports at its top level, with the interpreter the job's PATH will find.

A venv that was not activated when submitting (`-- python3 mnist.py` finding the system's python3) passes every
other check and fails in the job with "No module named 'torch'". The submit host shares the nodes' file system and
passes its PATH on (sbatch), so asking that interpreter here answers for the job. The Python running hpctrain is
asked in-process (no second torch start-up); another interpreter runs a few lines that look the modules up and
import torch (a broken torch fails there too), within PROBE_TIMEOUT_S.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers.base import NOTE_PREFIX, WARNING_PREFIX
from hpctrain.schedulers.slurm.commands import run_text

PROBE_TIMEOUT_S = 120.0
SCRIPT_READ_BYTES = 1 << 20
# argv: SCRIPT_DIR MODULE...; prints the modules it cannot find (exit 3), or imports torch when asked for it.
PROBE = """\
import importlib.util, sys
sys.path.insert(0, sys.argv[1])
missing = [m for m in sys.argv[2:] if importlib.util.find_spec(m) is None]
if missing:
    print(" ".join(missing))
    sys.exit(3)
if "torch" in sys.argv[2:]:
    import torch
"""


def needed_modules(job: JobSpec) -> tuple[str | None, list[str]]:
    """(the script, its top-level imports) of a `python SCRIPT` or `python -m MODULE` command; torch for a recipe."""
    if job.is_recipe:
        return None, ["torch"]
    argv = list(job.command)
    if len(argv) < 2 or not Path(argv[0]).name.startswith("python"):
        return None, []
    if argv[1] == "-m" and len(argv) > 2:
        return None, [argv[2].split(".")[0]]
    if not argv[1].endswith(".py"):
        return None, []
    return argv[1], script_imports(Path(os.path.expanduser(argv[1])))


def script_imports(path: Path) -> list[str]:
    """The top-level packages a script imports unconditionally (module-level import statements, not inside `try`
    or a function); [] when it cannot be read or parsed (the check then has nothing to say)."""
    try:
        with open(path, "rb") as handle:
            tree = ast.parse(handle.read(SCRIPT_READ_BYTES))
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module != "__future__":
            names.append(node.module.split(".")[0])
    return [n for n in dict.fromkeys(names) if n not in sys.stdlib_module_names]


def interpreter_problems(job: JobSpec, interpreter: str, environ: Mapping[str, str]) -> list[str]:
    """One line naming the fix when `interpreter` (the job's, resolved as its PATH finds it) lacks a module the
    job needs (torch: refused; another module: a warning); a note when it could not be asked."""
    script, modules = needed_modules(job)
    if not modules:
        return []
    where = str(Path(os.path.expanduser(script)).parent) if script else os.getcwd()
    try:
        missing = _missing(interpreter, where, modules, environ)
    except BrokenTorch as err:
        return [
            f"{interpreter} (the Python the job will run) finds torch but cannot import it ({err}), so the job "
            "would fail at once: repair that environment, or run the Python of one whose torch imports"
        ]
    except (OSError, subprocess.TimeoutExpired) as err:
        return [f"{NOTE_PREFIX}could not ask {interpreter} whether it has {', '.join(modules)} ({err})"]
    if not missing:
        return []
    # Only torch blocks: a script may find its other modules in ways read here only roughly (a sys.path it extends).
    prefix = "" if "torch" in missing else WARNING_PREFIX
    what = (
        "torch, which every hpctrain training needs"
        if job.is_recipe
        else (f"{', '.join(missing)}, which {script or job.command[2]} imports")
    )
    here = (
        ""
        if _missing(sys.executable, where, missing, environ)
        else (
            f"; the Python running hpctrain has {'it' if len(missing) == 1 else 'them'}: -- {sys.executable} "
            f"{' '.join(job.command[1:2])} ..."
        )
    )
    return [
        f"{prefix}{interpreter} (the Python the job will run) cannot import {what}, so the job would fail at once with "
        f"\"No module named '{missing[0]}'\": activate the environment that has it before submitting (source "
        f"VENV/bin/activate), name it (--venv DIR or --conda-env), or run that environment's python by its "
        f"path{here}"
    ]


class BrokenTorch(Exception):
    """torch is there but does not import: the last line it printed."""


def _missing(interpreter: str, where: str, modules: list[str], environ: Mapping[str, str]) -> list[str]:
    if os.path.realpath(interpreter) == os.path.realpath(sys.executable) and environ.get(
        "PYTHONPATH"
    ) == os.environ.get("PYTHONPATH"):
        return [
            m
            for m in modules
            if importlib.util.find_spec(m) is None and importlib.machinery.PathFinder.find_spec(m, [where]) is None
        ]
    proc = run_text(
        subprocess.run,
        [interpreter, "-c", PROBE, where, *modules],
        env=dict(environ),
        timeout=PROBE_TIMEOUT_S,
        check=False,
    )
    if proc.returncode == 3:
        return proc.stdout.split()
    if proc.returncode != 0:  # torch was found but does not import (a broken install, a NumPy mismatch)
        lines = (proc.stderr or proc.stdout or "").strip().splitlines()
        raise BrokenTorch(lines[-1] if lines else f"exit status {proc.returncode}")
    return []
