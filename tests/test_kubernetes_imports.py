"""Where the Kubernetes client may be imported (README, Layout): only in schedulers/kubernetes/, each on first use,
so that a Slurm user never loads it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from around_helpers import ROOT, cli_env

SRC = ROOT / "src" / "hpctrain"


def imports_kubernetes(path: Path) -> list[int]:
    """Line numbers of `import kubernetes...` / `from kubernetes... import` in a module (anywhere in it)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else ([node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
        )
        if any(n == "kubernetes" or n.startswith("kubernetes.") for n in names):
            lines.append(node.lineno)
    return lines


def allowed(path: Path) -> bool:
    rel = path.relative_to(SRC)
    return rel.parts[:2] == ("schedulers", "kubernetes")


def test_only_the_kubernetes_modules_import_the_client() -> None:
    found = {str(p.relative_to(SRC)): imports_kubernetes(p) for p in sorted(SRC.rglob("*.py"))}
    assert {p for p, lines in found.items() if lines and not allowed(SRC / p)} == set()
    assert (
        found["schedulers/kubernetes/services/pods.py"] and found["schedulers/kubernetes/services/service_pods.py"]
    )  # the check sees imports


def test_the_commands_around_the_job_on_slurm_never_load_the_client(tmp_path: Path) -> None:
    """`dev start --dry-run --scheduler slurm` (JupyterLab, sshd) goes through the schedulers' registry
    (hpctrain.schedulers), which loads only the chosen backend: the Kubernetes client stays unloaded."""
    code = (
        "import sys\nfrom hpctrain.cli import main\n"
        "assert main(['dev', 'start', 'nb', '--scheduler', 'slurm', '--dry-run']) == 0\n"
        "assert main(['dev', 'start', 'nb', '--scheduler', 'slurm', '--service', 'ssh', '--dry-run']) == 0\n"
        "print('loaded' if any(m == 'kubernetes' or m.startswith('kubernetes.') for m in sys.modules) "
        "else 'not loaded')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=cli_env(tmp_path / "home"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "not loaded"
