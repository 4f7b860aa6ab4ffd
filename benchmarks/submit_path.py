"""The path one `hpctrain submit` takes through hpctrain's modules, as a reader following it would walk it.

Runs `hpctrain submit ARGS...` in this process (on the cluster the environment names: the local Slurm cluster in
docs/benchmarks.md) with a profile hook that records each call into a function of another hpctrain module than
the caller's, and prints: the modules the call passes through, how deep the call stack goes in them, and how
often it comes back to a module it had already left (a reader's "return to a file"). The job it queues is
cancelled at the end. `slurm_*`: the same, counted within the Slurm backend's modules.

    python benchmarks/submit_path.py -- train mnist --epochs 1 --data-dir data --run-dir runs/path
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout


def trace(argv: list[str]) -> dict:
    from hpctrain.cli import main

    path: list[str] = []  # the module of each call that changes module, in call order

    def profile(frame, event, arg):
        if event != "call" or frame.f_code.co_name == "<module>":  # a call, not a module's import
            return
        module = frame.f_globals.get("__name__", "")
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        if module.startswith("hpctrain") and module != caller and (not path or path[-1] != module):
            path.append(module)

    out, err = io.StringIO(), io.StringIO()
    sys.setprofile(profile)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            status = main(["submit", *argv])
    finally:
        sys.setprofile(None)
    job_id = out.getvalue().split()[-1] if status == 0 and out.getvalue().split() else None
    if job_id and job_id.isdigit():
        subprocess.run(["scancel", job_id], check=False)
    visited, returns = walk(path)
    backend = [m for m in path if m.startswith("hpctrain.schedulers.slurm")]
    backend = [m for i, m in enumerate(backend) if i == 0 or backend[i - 1] != m]
    backend_visited, backend_returns = walk(backend)
    return {
        "status": status,
        "modules": len(visited),
        "returns_to_a_module_left": returns,
        "transitions": len(path),
        "slurm_modules": len(backend_visited),
        "slurm_returns": backend_returns,
        "visited": visited,
        "stderr": err.getvalue()[-400:],
    }


def walk(path: list[str]) -> tuple[list[str], int]:
    """The modules in the order first entered, and how often the path came back to one it had left."""
    visited: list[str] = []
    returns = 0
    for module in path:
        if module in visited:
            returns += 1
        else:
            visited.append(module)
    return visited, returns


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    print(json.dumps(trace(args), indent=1))
