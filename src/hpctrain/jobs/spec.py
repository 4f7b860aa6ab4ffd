"""The scheduler-neutral job description: typed, frozen, validated once where it is built (CLI flags and/or a job
file).

What runs (command, environment), on what (resources per node or pod), for how long, with which restart budgets
and where its run directory is. A scheduler's own options (SlurmOptions, KubernetesOptions) are its backend's, and
each backend checks what its own forms can hold (#SBATCH lines, object names). Validation here is pure: it looks
at values, not at the file system or the cluster; `missing_prerequisites()` checks what must exist before
submitting. The textual forms of the values (time, memory, gres) are read in `values`; plain data (a job file,
flags) becomes a JobSpec in `mapping`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.jobs.values import (
    MAX_CPUS_PER_TASK,
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    MAX_PROCS_PER_NODE,
    check_node_name,
    mem_problem,
    parse_mem_mb,
    parse_time_limit,
)

ENVIRONMENT_KINDS = ("none", "modules", "conda", "venv", "apptainer", "pyxis")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_GPU_TYPE_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_MODULE_RE = re.compile(r"^[A-Za-z0-9_.+/@-]+$")


@dataclass(frozen=True)
class Resources:
    """What one node of the job needs. cpus_per_task counts CPUs per training process, for every launcher."""

    nodes: int = 1
    """Nodes (Slurm) or pods (Kubernetes) asked for; of an elastic job (min_nodes set), the most it trains on."""
    min_nodes: int | None = None
    """An elastic job (`--nodes MIN:MAX`): the fewest nodes it keeps training on when nodes are lost, below
    `nodes`. None: a fixed count, every node needed to the end."""
    nproc_per_node: int = 1
    """Training processes per node (torchrun workers or srun tasks)."""
    gpus_per_node: int = 0
    gpu_type: str | None = None
    shards_per_node: int = 0
    """Slices of shared GPUs (Slurm's `shard` GRES)."""
    cpus_per_task: int = 1
    mem: str | None = None
    """Memory per node in Slurm's form (16G); None: the partition's default."""

    def __post_init__(self) -> None:
        for name, low in (
            ("nodes", 1),
            ("nproc_per_node", 1),
            ("cpus_per_task", 1),
            ("gpus_per_node", 0),
            ("shards_per_node", 0),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserError(f"{_flag(name)} must be a whole number (got {value!r})")
            if value < low:
                raise UserError(f"{_flag(name)} must be at least {low} (got {value})")
            if value > _MAXIMA[name]:
                raise UserError(
                    f"{_flag(name)} {value} is more than {_MAXIMA[name]}, beyond any cluster: check the value"
                )
        if self.min_nodes is not None:
            if isinstance(self.min_nodes, bool) or not isinstance(self.min_nodes, int) or self.min_nodes < 1:
                raise UserError(f"--nodes MIN:MAX: MIN must be a whole number >= 1 (got {self.min_nodes!r})")
            if self.min_nodes > self.nodes:
                raise UserError(f"--nodes {self.min_nodes}:{self.nodes}: MIN is more than MAX")
            if self.min_nodes == self.nodes:
                object.__setattr__(self, "min_nodes", None)  # MIN:MAX with MIN == MAX is the fixed count
        if self.gpus_per_node and self.shards_per_node:
            raise UserError("ask for whole GPUs (--gpus-per-node) or shards (--gres shard:N), not both")
        if self.gpu_type is not None:
            if not self.gpus_per_node:
                raise UserError(f"--gpu-type {self.gpu_type!r} needs --gpus-per-node N")
            if not _GPU_TYPE_RE.match(self.gpu_type):
                raise UserError(
                    f"--gpu-type {self.gpu_type!r}: use the GPU type that `sinfo -o %G` shows (letters, digits, _ . -)"
                )
        if self.mem is not None:
            parse_mem_mb(self.mem)
            if problem := mem_problem(self.mem):
                raise UserError(problem)

    @property
    def elastic(self) -> bool:
        """`--nodes MIN:MAX`: the job keeps training while at least min_nodes of its nodes remain."""
        return self.min_nodes is not None

    @property
    def node_range(self) -> str:
        """--nodes as the user writes it: N, or MIN:MAX for an elastic job."""
        return f"{self.min_nodes}:{self.nodes}" if self.min_nodes is not None else str(self.nodes)

    @property
    def mem_mb(self) -> int | None:
        return None if self.mem is None else parse_mem_mb(self.mem)

    @property
    def gres(self) -> str | None:
        """The --gres value for sbatch, or None for a CPU-only job."""
        if self.gpus_per_node:
            return f"gpu:{self.gpu_type}:{self.gpus_per_node}" if self.gpu_type else f"gpu:{self.gpus_per_node}"
        if self.shards_per_node:
            return f"shard:{self.shards_per_node}"
        return None


@dataclass(frozen=True)
class EnvironmentSpec:
    """Where the command runs: the host as is, modules, conda, a venv, an apptainer image or an enroot image via
    pyxis."""

    kind: str = "none"
    modules: tuple[str, ...] = ()
    """`module load` these first (any kind may use them: e.g. load CUDA, then activate a venv)."""
    conda_env: str | None = None
    """conda environment name or prefix path (kind conda)."""
    venv: str | None = None
    """virtual environment directory (kind venv)."""
    image: str | None = None
    """.sif file (apptainer) or enroot image / squashfs file / registry reference (pyxis)."""
    mounts: tuple[str, ...] = ()
    """Bind mounts SRC[:DST[:OPTS]] for the container."""
    workdir: str | None = None
    """Working directory inside the container."""

    def __post_init__(self) -> None:
        if self.kind not in ENVIRONMENT_KINDS:
            raise UserError(f"environment kind {self.kind!r} is unknown: use one of {', '.join(ENVIRONMENT_KINDS)}")
        for name in ("modules", "mounts"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(isinstance(v, str) and v for v in value):
                raise UserError(f"environment {name} must be a list of non-empty strings (got {value!r})")
        for module in self.modules:
            if not _MODULE_RE.match(module):
                raise UserError(f"module name {module!r} has characters a module name cannot have")
        needs = {"conda": "conda_env", "venv": "venv", "apptainer": "image", "pyxis": "image"}
        for kind, name in needs.items():
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise UserError(f"environment {name} must be a non-empty string (got {value!r})")
            if self.kind == kind and not value:
                raise UserError(f"environment kind {kind} needs {_flag(name)} (e.g. {_EXAMPLES[name]})")
            if self.kind != kind and value and not (name == "image" and self.kind in ("apptainer", "pyxis")):
                raise UserError(
                    f"{_flag(name)} is set but the environment kind is {self.kind!r}: add --env-kind {kind}"
                )
        if (self.mounts or self.workdir) and self.kind not in ("apptainer", "pyxis"):
            raise UserError("--mount/--container-workdir apply to containers: add --env-kind apptainer or pyxis")
        for mount in self.mounts:
            if "," in mount:
                raise UserError(f"mount {mount!r} contains a comma: give one mount per --mount")
        if self.workdir is not None and (not isinstance(self.workdir, str) or not self.workdir.startswith("/")):
            raise UserError(f"--container-workdir {self.workdir!r} must be an absolute path inside the container")


_MAXIMA = {
    "nodes": MAX_NODES,
    "nproc_per_node": MAX_PROCS_PER_NODE,
    "cpus_per_task": MAX_CPUS_PER_TASK,
    "gpus_per_node": MAX_GPUS_PER_NODE,
    "shards_per_node": MAX_GPUS_PER_NODE * 1024,
}
_EXAMPLES = {"conda_env": "--conda-env myenv", "venv": "--venv ~/venvs/train", "image": "--image pytorch.sif"}


@dataclass(frozen=True)
class JobSpec:
    """One job: resources, environment and the command every process runs, on any scheduler."""

    command: tuple[str, ...]
    """argv of one training process, e.g. ("hpctrain", "train", "mnist", "--epochs", "1") or ("python", "train.py")."""
    name: str = "hpctrain"
    time: str | None = None
    """Time limit in a Slurm form (HH:MM:SS, D-HH, ...); None: the partition's default. The training time of one
    attempt on either scheduler, warned signal_grace seconds before its end (Kubernetes: by the job's own timer)."""
    resources: Resources = field(default_factory=Resources)
    environment: EnvironmentSpec = field(default_factory=EnvironmentSpec)
    exclude_nodes: tuple[str, ...] = ()
    """Nodes the job must not run on, by name (Slurm: --exclude; Kubernetes: a required node affinity, the Node's
    metadata.name not in them), e.g. those a preflight found sick (RUN/bad_nodes)."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables exported before the command starts."""
    run_dir: str | None = None
    """Run directory of the job (exported as HPCTRAIN_RUN_DIR); the requeue logic reads its stop_reason."""
    signal_grace: int = 120
    """Seconds before the time limit at which the job gets SIGUSR1 to checkpoint; 0: no warning, no requeue."""
    max_hang_restarts: int = 2
    """How often the job may start again after hpctrain's hang watchdog ended an attempt (needs run_dir)."""
    max_restarts: int = 0
    """Restart the worker group this often after a worker dies (it resumes from its checkpoint)."""
    python: str | None = None
    """Environment kind none: the absolute path of the Python that runs hpctrain and torchrun in the job
    (`PYTHON -m hpctrain`, `PYTHON -m torch.distributed.run`); `hpctrain submit` sets it to its own interpreter, so
    the job finds the tools that submitted it whatever the PATH. None: find them on the job's PATH."""

    def __post_init__(self) -> None:
        if not isinstance(self.command, tuple) or not self.command or not all(isinstance(a, str) for a in self.command):
            raise UserError(
                "no command: give a recipe (`train mnist ...`) or a command after `--` (`-- python train.py`)"
            )
        if any("\0" in a for a in self.command):
            raise UserError("the command contains a NUL character, which no process argument can hold")
        # The scheduler checks what its own forms can hold (Slurm: #SBATCH lines; Kubernetes: object names).
        if not isinstance(self.name, str):
            raise UserError(f"job name must be a string (got {self.name!r})")
        if not self.name:
            raise UserError("--job-name is empty: give a name or leave the option out")
        if self.time is not None:
            if not isinstance(self.time, str):
                raise UserError(f"--time must be a string (got {self.time!r})")
            parse_time_limit(self.time)
        for node in self.exclude_nodes:
            check_node_name(node)
        # How processes start on a node (and so whether the GPUs match them) is each backend's to check.
        if self.python is not None:
            if not isinstance(self.python, str) or not self.python.startswith("/"):
                raise UserError(f"python must be the absolute path of a Python interpreter (got {self.python!r})")
            if self.environment.kind != "none":
                raise UserError(
                    f"python {self.python} is the interpreter for environment kind none; a {self.environment.kind} "
                    "environment brings its own hpctrain and torchrun: remove python from the job file"
                )
        for key, value in self.env:
            if not _ENV_NAME_RE.match(key):
                raise UserError(
                    f"environment variable name {key!r} is not valid: use letters, digits and _, not "
                    "starting with a digit"
                )
            if not isinstance(value, str) or "\0" in value:
                raise UserError(f"environment variable {key} must have a string value (got {value!r})")
        if self.run_dir is not None and (not isinstance(self.run_dir, str) or not self.run_dir):
            raise UserError(f"--run-dir must be a non-empty path (got {self.run_dir!r})")
        for name in ("signal_grace", "max_hang_restarts", "max_restarts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"{_flag(name)} must be a whole number >= 0 (got {value!r})")
        if self.signal_grace and self.time is not None and self.signal_grace >= parse_time_limit(self.time):
            raise UserError(
                f"--signal-grace {self.signal_grace} s is not shorter than the time limit {self.time}: "
                "lower --signal-grace or raise --time"
            )

    @property
    def time_limit_s(self) -> int | None:
        return None if self.time is None else parse_time_limit(self.time)

    @property
    def is_recipe(self) -> bool:
        """The command is a built-in recipe (`hpctrain train ...`)."""
        return tuple(self.command[:2]) == ("hpctrain", "train")

    def replace(self, **changes: Any) -> JobSpec:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain data in the job-file layout (flat resources, nested environment); from_mapping reads it back."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "resources":
                out.update({rf.name: getattr(value, rf.name) for rf in fields(Resources) if rf.name != "min_nodes"})
                if value.elastic:
                    out["nodes"] = value.node_range  # a job file's `nodes: "MIN:MAX"`
            elif f.name == "environment":
                out["environment"] = {
                    ef.name: list(v) if isinstance(v := getattr(value, ef.name), tuple) else v
                    for ef in fields(EnvironmentSpec)
                }
            elif f.name == "env":
                out["env"] = dict(value)
            elif isinstance(value, tuple):
                out[f.name] = list(value)
            else:
                out[f.name] = value
        return out


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def missing_prerequisites(job: JobSpec) -> list[str]:
    """The job's environment made once before the first submit (a container image file, a venv) that is not here
    yet: a real submit refuses, a --dry-run only notes it (the script can be read before the image is pulled)."""
    problems = []
    env = job.environment
    if env.kind == "apptainer" and env.image and not Path(env.image).expanduser().is_file():
        problems.append(
            f"apptainer image {env.image} does not exist: build or pull it first (apptainer pull ...) or fix --image"
        )
    if env.kind == "pyxis" and env.image and _looks_like_path(env.image) and not Path(env.image).expanduser().is_file():
        problems.append(f"enroot image {env.image} does not exist: import it first (enroot import ...) or fix --image")
    if env.kind == "venv" and env.venv and not (Path(env.venv).expanduser() / "bin" / "activate").is_file():
        problems.append(f"venv {env.venv} has no bin/activate: create it (python -m venv {env.venv}) or fix --venv")
    return problems


def _looks_like_path(image: str) -> bool:
    return image.startswith(("/", "./", "../", "~")) or image.endswith((".sqsh", ".squashfs"))
