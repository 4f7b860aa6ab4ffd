"""Optional dependencies: which `pip install 'hpctrain[EXTRA]'` brings a module that is not installed.

The default install (`pip install hpctrain`) leaves out what only some users need: the Kubernetes client, JupyterLab
for `dev start`, NVIDIA DALI. Code imports those where it uses them; when one is missing, the CLI turns the
ModuleNotFoundError into one line naming the install command (`missing_extra`), so no command needs its own
try/except and no user sees a traceback for a package they were never told to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from hpctrain.errors import UserError

# top-level module -> (the extra that installs it, what it is for)
EXTRAS: dict[str, tuple[str, str]] = {
    "kubernetes": ("k8s", "the Kubernetes scheduler (--scheduler kubernetes)"),
    "jsonschema": ("k8s", "the Kubernetes scheduler's manifest check"),
    "jupyterlab": ("jupyter", "JupyterLab (hpctrain dev start)"),
    "jupyter_server": ("jupyter", "JupyterLab (hpctrain dev start)"),
    "nvidia.dali": ("dali", "--data-backend dali"),
    "starlette": ("web", "the web console (hpctrain web)"),
    "uvicorn": ("web", "the web console (hpctrain web)"),
    "jinja2": ("web", "the web console (hpctrain web)"),
}


def install_command(extra: str) -> str:
    return f"pip install 'hpctrain[{extra}]'"


def missing_extra(err: ImportError) -> UserError | None:
    """The one-line error for an optional module that is not installed, or None when `err` is about another
    module (a real bug, which keeps its traceback)."""
    name = getattr(err, "name", None) or ""
    for module, (extra, purpose) in EXTRAS.items():
        # `import nvidia.dali` without any nvidia package fails on "nvidia"; with another nvidia wheel, on
        # "nvidia.dali".
        if name and (name == module or name.startswith(module + ".") or module.startswith(name + ".")):
            return UserError(
                f"{purpose} needs the Python package {module!r}, which is not installed here: {install_command(extra)}"
            )
    return None


def require(module: str) -> ModuleType:
    """import `module`, or raise missing_extra's UserError."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        error = missing_extra(err)
        if error is None:
            raise
        raise error from None
