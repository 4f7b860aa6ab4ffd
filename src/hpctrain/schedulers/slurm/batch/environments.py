"""Environments as small strategies: each adds setup lines to the batch script, options to srun, and/or a prefix
to the command that srun starts. Pure: they produce text and argv lists, and touch nothing.

Everything returned is shell text, already quoted here: setup lines, and srun options / command prefixes as
lists of shell words.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from hpctrain.schedulers.slurm.batch.options import EnvironmentSpec


def quote_path(path: str) -> str:
    """shlex.quote, except that a leading ~/ still means the job user's home (rendered as "$HOME"/...)."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


@dataclass(frozen=True)
class Environment:
    """Base strategy: the host environment as the batch script finds it (plus optional `module load`)."""

    spec: EnvironmentSpec

    def setup_lines(self) -> list[str]:
        lines: list[str] = []
        if self.spec.modules:
            lines += [
                "if ! type module >/dev/null 2>&1; then",
                '    echo "hpctrain: the module command is not available in the batch shell;'
                ' load your modules in ~/.bashrc or drop --module" >&2',
                "    exit 1",
                "fi",
                "module load " + " ".join(shlex.quote(m) for m in self.spec.modules),
            ]
        return lines

    def srun_options(self, gpus: bool) -> list[str]:
        return []

    def command_prefix(self, gpus: bool) -> list[str]:
        return []

    def tools(self) -> list[tuple[str, str]]:
        """The commands the batch shell needs before the job can start, each with the option that asks for it;
        with modules, `module` alone (whatever else is needed may come with the modules it loads)."""
        return [("module", "--module")] if self.spec.modules else []

    def search_path(self, path: str) -> list[str] | None:
        """The directories in which the job looks up a command by name, given the PATH that sbatch passes on;
        None when that cannot be known here (modules and containers bring their own)."""
        if self.spec.modules:
            return None
        return [d for d in path.split(":") if d]


class NoEnvironment(Environment):
    pass


class Modules(Environment):
    pass


class Conda(Environment):
    def tools(self) -> list[tuple[str, str]]:
        return super().tools() or [("conda", "--conda-env")]

    def setup_lines(self) -> list[str]:
        env = self.spec.conda_env or ""
        return super().setup_lines() + [
            "if ! command -v conda >/dev/null 2>&1; then",
            '    echo "hpctrain: conda is not on PATH in the batch shell; load its module (--module) or run '
            'conda init" >&2',
            "    exit 1",
            "fi",
            'eval "$(conda shell.bash hook)"',
            f"conda activate {quote_path(env)}",
        ]

    def search_path(self, path: str) -> list[str] | None:
        env = self.spec.conda_env or ""
        base = super().search_path(path)
        if base is None or "/" not in env:  # an environment by name: its prefix is conda's business
            return None
        return [env.rstrip("/") + "/bin", *base]


class Venv(Environment):
    def setup_lines(self) -> list[str]:
        venv = self.spec.venv or ""
        return super().setup_lines() + [
            "# shellcheck source=/dev/null",
            f"source {quote_path(venv.rstrip('/') + '/bin/activate')}",
        ]

    def search_path(self, path: str) -> list[str] | None:
        base = super().search_path(path)
        return None if base is None else [(self.spec.venv or "").rstrip("/") + "/bin", *base]


class Apptainer(Environment):
    """`apptainer exec [--nv] [--bind ...] [--pwd ...] IMAGE` in front of what srun starts: torchrun (whose
    workers inherit the container) or each training process."""

    def tools(self) -> list[tuple[str, str]]:
        return super().tools() or [("apptainer", "--image")]

    def setup_lines(self) -> list[str]:
        return super().setup_lines() + [
            "if ! command -v apptainer >/dev/null 2>&1; then",
            '    echo "hpctrain: apptainer is not on PATH on the node; load its module (--module apptainer)" >&2',
            "    exit 1",
            "fi",
        ]

    def search_path(self, path: str) -> list[str] | None:
        return None

    def command_prefix(self, gpus: bool) -> list[str]:
        words = ["apptainer", "exec"]
        if gpus:
            words.append("--nv")
        if self.spec.mounts:
            words += ["--bind", shlex.quote(",".join(self.spec.mounts))]
        if self.spec.workdir:
            words += ["--pwd", shlex.quote(self.spec.workdir)]
        words.append(quote_path(self.spec.image or ""))
        return words


class Pyxis(Environment):
    """enroot images through pyxis: srun itself starts the tasks inside the container."""

    def search_path(self, path: str) -> list[str] | None:
        return None

    def srun_options(self, gpus: bool) -> list[str]:
        options = ["--container-image=" + quote_path(self.spec.image or "")]
        if self.spec.mounts:
            options.append("--container-mounts=" + shlex.quote(",".join(self.spec.mounts)))
        if self.spec.workdir:
            options.append("--container-workdir=" + shlex.quote(self.spec.workdir))
        return options


_KINDS: dict[str, type[Environment]] = {
    "none": NoEnvironment,
    "modules": Modules,
    "conda": Conda,
    "venv": Venv,
    "apptainer": Apptainer,
    "pyxis": Pyxis,
}


def get_environment(spec: EnvironmentSpec) -> Environment:
    return _KINDS[spec.kind](spec)
