"""The job description: typed, frozen, validated once where it is built (CLI flags and/or a job file).

Everything downstream (render, check, submit) trusts a JobSpec. Validation here is pure: it looks at values,
not at the file system or the cluster; `local_problems()` checks the paths that must exist before submitting.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError, brief

LAUNCHERS = ("torchrun", "srun", "single")
ENVIRONMENT_KINDS = ("none", "modules", "conda", "venv", "apptainer", "pyxis")

# Slurm's accepted time forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_TIME_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
_TIME_RE = re.compile(r"^(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$")
_MEM_RE = re.compile(r"^(?P<n>\d+)(?P<unit>[KMGT]?)B?$", re.IGNORECASE)
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_GPU_TYPE_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_MODULE_RE = re.compile(r"^[A-Za-z0-9_.+/@-]+$")
# Values written unquoted after #SBATCH; anything else is double- or single-quoted (see sbatch_value).
SBATCH_SAFE_RE = re.compile(r"^[A-Za-z0-9_.,:=/%@+-]+$")


def parse_time_limit(text: str) -> int:
    """Slurm time limit -> seconds. A bare number is minutes (as sbatch reads it)."""
    m = _TIME_RE.match(text.strip()) if isinstance(text, str) else None
    if not m:
        raise UserError(f"time limit {text!r} is not a Slurm time: use {_TIME_FORMS} (e.g. --time 01:30:00)")
    g = {k: int(v) if v is not None else None for k, v in m.groupdict().items()}
    if g["d"] is not None:
        days, hours, minutes, seconds = g["d"], g["dh"], g["dm"] or 0, g["ds"] or 0
    elif g["c"] is not None:
        days, hours, minutes, seconds = 0, g["a"], g["b"], g["c"]
    elif g["b"] is not None:
        days, hours, minutes, seconds = 0, 0, g["a"], g["b"]
    else:
        days, hours, minutes, seconds = 0, 0, g["a"], 0
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0:
        raise UserError(f"time limit {text!r} is zero: give a positive time, e.g. --time 30 (minutes) or 02:00:00")
    return total


def format_time_limit(seconds: int) -> str:
    """Seconds -> D-HH:MM:SS (or HH:MM:SS below a day), the form squeue prints."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    hms = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{hms}" if days else hms


# Upper bounds of what one job can ask for: far beyond any machine, and low enough that a typo (or a hostile job
# file) never reaches a manifest, a sbatch line or an integer overflow downstream.
MAX_NODES = 100_000
MAX_PROCS_PER_NODE = 1024
MAX_GPUS_PER_NODE = 1024
MAX_CPUS_PER_TASK = 16_384
MAX_MEM_MB = 1 << 30  # 1 PiB per node


def parse_mem_mb(text: str) -> int:
    """Slurm memory (per node): 4000, 4000M, 16G, 1T -> megabytes (0: the whole node). Units K/M/G/T; default M."""
    m = _MEM_RE.match(text.strip()) if isinstance(text, str) else None
    if not m or len(m["n"]) > 30:
        raise UserError(f"memory {text!r} is not a Slurm size: use a number with an optional unit K, M, G or T (e.g. --mem 16G)")
    n = int(m["n"])
    if n == 0:
        return 0  # sbatch's --mem=0: all the memory of each node
    unit = m["unit"].upper()
    mb = -(-n // 1024) if unit == "K" else n * {"": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[unit]  # integers only
    if mb > MAX_MEM_MB:
        raise UserError(f"memory {text!r} is more than {MAX_MEM_MB >> 20}T per node, far beyond any machine: give the "
                        "memory of one node (e.g. --mem 64G)")
    return mb


def parse_gres(text: str) -> tuple[int, str | None, int]:
    """`gpu:2`, `gpu:a100:2`, `shard:16` (comma-separated to combine) -> (gpus, gpu type, shards) per node."""
    gpus, gpu_type, shards = 0, None, 0
    for item in str(text).split(","):
        parts = item.strip().split(":")
        ok = len(parts) in (2, 3) and parts[-1].isdigit() and int(parts[-1]) > 0 and parts[0] in ("gpu", "shard")
        if ok and parts[0] == "gpu":
            gpus = int(parts[-1])
            gpu_type = parts[1] if len(parts) == 3 else None
        elif ok and len(parts) == 2:
            shards = int(parts[1])
        else:
            raise UserError(
                f"--gres {text!r}: use gpu:N, gpu:TYPE:N or shard:N with N >= 1 (e.g. --gres gpu:a100:2 or --gres shard:16); "
                "other generic resources go in an extra #SBATCH line (--sbatch '--gres=...')"
            )
    if gpus and shards:
        raise UserError(f"--gres {text!r} asks for both whole GPUs and shards: choose gpu:N or shard:N")
    return gpus, gpu_type, shards


def _check_no_control_characters(what: str, value: str) -> None:
    bad = sorted({repr(c) for c in value if ord(c) < 32 or ord(c) == 127})
    if bad:
        raise UserError(f"{what} {value!r} contains control characters ({', '.join(bad)}): sbatch reads it from one #SBATCH line; remove them")


def check_sbatch_value(what: str, value: str) -> None:
    """#SBATCH lines are parsed by sbatch, not by a shell: refuse what cannot be written there faithfully."""
    if not value:
        raise UserError(f"{what} is empty: give a value or leave the option out")
    _check_no_control_characters(what, value)
    if "\\" in value or ('"' in value and "'" in value):
        raise UserError(f"{what} {value!r} cannot be written on an #SBATCH line: remove backslashes, and use only one kind of quote")


_LONG_OPTION_RE = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9-]*$")
_SHORT_OPTION_RE = re.compile(r"^-[A-Za-z]$")


def parse_sbatch_option(text: str) -> tuple[str, str | None]:
    """One extra sbatch option, as the user would type it after sbatch, -> (option, value or None).

    Exactly one option: `--flag`, `--name=VALUE`, `--name VALUE`, `-X` or `-X VALUE` (shell quoting allowed:
    `--comment='two words'`). A separate VALUE must not start with '-' (write `--nice=-5`); a short option with
    its value attached (`-Ca100`) is refused, because `-vH` would be two options. Anything else, e.g.
    `--comment --output=/x`, would put a second option on the #SBATCH line and is refused."""
    what = f"--sbatch {text!r}"
    if not isinstance(text, str):
        raise UserError(f"extra sbatch option {text!r} must be a string such as --exclusive or --constraint=a100")
    _check_no_control_characters("--sbatch", text)
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise UserError(f"{what}: {err} (unbalanced quotes); quote a value with spaces once: --comment='two words'") from None
    usage = "one sbatch option per --sbatch: --flag, --name=VALUE, --name VALUE or -X VALUE"
    if not words:
        raise UserError(f"{what} is empty: give {usage}")
    first, rest = words[0], words[1:]
    if first.startswith("--") and "=" in first and not rest:
        name, _, value = first.partition("=")
        if _LONG_OPTION_RE.match(name):
            check_sbatch_value(f"{what}: the value", value)
            return name, value
    elif _LONG_OPTION_RE.match(first) or _SHORT_OPTION_RE.match(first):
        if not rest:
            return first, None
        if len(rest) == 1 and not rest[0].startswith("-"):
            check_sbatch_value(f"{what}: the value", rest[0])
            return first, rest[0]
    if not first.startswith("-"):
        raise UserError(f"{what} must start with - (e.g. --sbatch=--exclusive or --sbatch=--constraint=a100)")
    looks_like_option = [bool(_LONG_OPTION_RE.match(w.partition("=")[0]) or _SHORT_OPTION_RE.match(w)) for w in words]
    if len(words) == 2 and looks_like_option[0] and not looks_like_option[1] and "=" not in first:
        raise UserError(f"{what}: the value {rest[0]!r} starts with '-'; attach it with = ({first}={rest[0]})")
    if len(words) > 1 and all(w.startswith("-") for w in words):
        raise UserError(f"{what} holds {len(words)} options; give {usage}, and repeat --sbatch for each one")
    if len(words) > 2 or (len(words) == 2 and "=" in first):
        raise UserError(f"{what} is {len(words)} words; give {usage} (quote a value with spaces: --comment='two words')")
    raise UserError(f"{what} is not one sbatch option; give {usage} (a short option takes its value after a space: -C a100)")


def render_sbatch_option(text: str) -> str:
    """An extra option as written after #SBATCH (text was accepted by parse_sbatch_option)."""
    name, value = parse_sbatch_option(text)
    if value is None:
        return name
    return f"{name}={sbatch_value(value)}" if name.startswith("--") else f"{name} {sbatch_value(value)}"


def mem_warning(mem: str | None) -> str | None:
    """A warning for a memory size without a unit that is surely not meant as megabytes (--mem 16 is 16 MB)."""
    m = _MEM_RE.match(mem.strip()) if isinstance(mem, str) else None
    if m is None or m["unit"] or not 0 < int(m["n"]) < 1024:
        return None
    n = int(m["n"])
    return f"--mem {mem} means {n} MB (sbatch reads a size without a unit as megabytes); for {n} GB write --mem {n}G"


def sbatch_value(value: str) -> str:
    """Quote a checked value for an #SBATCH line the way sbatch's own parser undoes it."""
    if SBATCH_SAFE_RE.match(value):
        return value
    return f"'{value}'" if '"' in value else f'"{value}"'


@dataclass(frozen=True)
class Resources:
    """What one node of the job needs. cpus_per_task counts CPUs per training process, for every launcher."""

    nodes: int = 1
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
        for name, low in (("nodes", 1), ("nproc_per_node", 1), ("cpus_per_task", 1), ("gpus_per_node", 0), ("shards_per_node", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserError(f"{_flag(name)} must be a whole number (got {value!r})")
            if value < low:
                raise UserError(f"{_flag(name)} must be at least {low} (got {value})")
            if value > _MAXIMA[name]:
                raise UserError(f"{_flag(name)} {value} is more than {_MAXIMA[name]}, beyond any cluster: check the value")
        if self.gpus_per_node and self.shards_per_node:
            raise UserError("ask for whole GPUs (--gpus-per-node) or shards (--gres shard:N), not both")
        if self.gpu_type is not None:
            if not self.gpus_per_node:
                raise UserError(f"--gpu-type {self.gpu_type!r} needs --gpus-per-node N")
            if not _GPU_TYPE_RE.match(self.gpu_type):
                raise UserError(f"--gpu-type {self.gpu_type!r}: use the GPU type that `sinfo -o %G` shows (letters, digits, _ . -)")
        if self.mem is not None:
            parse_mem_mb(self.mem)

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
    """Where the command runs: the host as is, modules, conda, a venv, an apptainer image or an enroot image via pyxis."""

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
                raise UserError(f"{_flag(name)} is set but the environment kind is {self.kind!r}: add --env-kind {kind}")
        if (self.mounts or self.workdir) and self.kind not in ("apptainer", "pyxis"):
            raise UserError("--mount/--container-workdir apply to containers: add --env-kind apptainer or pyxis")
        for mount in self.mounts:
            if "," in mount:
                raise UserError(f"mount {mount!r} contains a comma: give one mount per --mount")
        if self.workdir is not None and (not isinstance(self.workdir, str) or not self.workdir.startswith("/")):
            raise UserError(f"--container-workdir {self.workdir!r} must be an absolute path inside the container")


_MAXIMA = {"nodes": MAX_NODES, "nproc_per_node": MAX_PROCS_PER_NODE, "cpus_per_task": MAX_CPUS_PER_TASK,
           "gpus_per_node": MAX_GPUS_PER_NODE, "shards_per_node": MAX_GPUS_PER_NODE * 1024}
_EXAMPLES = {"conda_env": "--conda-env myenv", "venv": "--venv ~/venvs/train", "image": "--image pytorch.sif"}


@dataclass(frozen=True)
class JobSpec:
    """One job: resources, environment, launcher and the command every process runs (see hpctrain.jobs for the
    fields only Slurm reads)."""

    command: tuple[str, ...]
    """argv of one training process, e.g. ("hpctrain", "train", "mnist", "--epochs", "1") or ("python", "train.py")."""
    name: str = "hpctrain"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    """Time limit in a Slurm form (HH:MM:SS, D-HH, ...); None: the partition's default."""
    resources: Resources = field(default_factory=Resources)
    environment: EnvironmentSpec = field(default_factory=EnvironmentSpec)
    launcher: str = "torchrun"
    output: str | None = None
    """Output file pattern (sbatch --output; %j is the job id). None: slurm-%j.out in the submit directory."""
    error: str | None = None
    sbatch_extra: tuple[str, ...] = ()
    """More sbatch options, one per #SBATCH line, e.g. "--exclusive" or "--constraint=a100"."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables exported before the command starts."""
    run_dir: str | None = None
    """Run directory of the job (exported as HPCTRAIN_RUN_DIR); the requeue logic reads its stop_reason."""
    rdzv_port: int | None = None
    """torchrun rendezvous port; None: the first free port from a job-specific start on the head node."""
    signal_grace: int = 120
    """Seconds before the time limit at which the job gets SIGUSR1 to checkpoint; 0: no warning, no requeue."""
    max_requeues: int = 3
    """How often the job may requeue itself after a time-limit warning."""
    max_preemptions: int = 10
    """How often the job may start again after Slurm requeued it on its own (preemption, node failure)."""
    max_restarts: int = 0
    """torchrun only: restart the worker group this often after a worker dies (it resumes from its checkpoint)."""
    python: str | None = None
    """Environment kind none: the absolute path of the Python that runs hpctrain and torchrun in the job
    (`PYTHON -m hpctrain`, `PYTHON -m torch.distributed.run`); `hpctrain submit` sets it to its own interpreter, so
    the job finds the tools that submitted it whatever the PATH. None: find them on the job's PATH."""

    def __post_init__(self) -> None:
        if not isinstance(self.command, tuple) or not self.command or not all(isinstance(a, str) for a in self.command):
            raise UserError("no command: give a recipe (`train mnist ...`) or a command after `--` (`-- python train.py`)")
        if any("\0" in a for a in self.command):
            raise UserError("the command contains a NUL character, which no process argument can hold")
        if not isinstance(self.name, str):
            raise UserError(f"job name must be a string (got {self.name!r})")
        check_sbatch_value("--job-name", self.name)
        for name in ("partition", "account", "qos", "output", "error", "time"):
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, str):
                    raise UserError(f"{_flag(name)} must be a string (got {value!r})")
                check_sbatch_value(_flag(name), value)
        if self.time is not None:
            parse_time_limit(self.time)
        if self.launcher not in LAUNCHERS:
            raise UserError(f"--launcher {self.launcher!r} is unknown: use one of {', '.join(LAUNCHERS)}")
        r = self.resources
        if self.launcher == "single" and (r.nodes != 1 or r.nproc_per_node != 1):
            raise UserError(
                f"--launcher single runs one process, but the job asks for {r.nodes} node(s) x {r.nproc_per_node} process(es): "
                "use --launcher torchrun or srun, or --nodes 1 --nproc-per-node 1"
            )
        if r.gpus_per_node and self.launcher != "single" and r.nproc_per_node != r.gpus_per_node:
            raise UserError(
                f"--nproc-per-node {r.nproc_per_node} does not match --gpus-per-node {r.gpus_per_node}: "
                f"DDP wants one process per GPU, so set --nproc-per-node {r.gpus_per_node} "
                "(or --launcher single for one process driving all GPUs with DataParallel)"
            )
        for line in self.sbatch_extra:
            parse_sbatch_option(line)
        if self.python is not None:
            if not isinstance(self.python, str) or not self.python.startswith("/"):
                raise UserError(f"python must be the absolute path of a Python interpreter (got {self.python!r})")
            check_sbatch_value("python", self.python)
            if self.environment.kind != "none":
                raise UserError(
                    f"python {self.python} is the interpreter for environment kind none; a {self.environment.kind} "
                    "environment brings its own hpctrain and torchrun: remove python from the job file"
                )
        for key, value in self.env:
            if not _ENV_NAME_RE.match(key):
                raise UserError(f"environment variable name {key!r} is not valid: use letters, digits and _, not starting with a digit")
            if not isinstance(value, str) or "\0" in value:
                raise UserError(f"environment variable {key} must have a string value (got {value!r})")
        if self.run_dir is not None and (not isinstance(self.run_dir, str) or not self.run_dir):
            raise UserError(f"--run-dir must be a non-empty path (got {self.run_dir!r})")
        if self.rdzv_port is not None and (isinstance(self.rdzv_port, bool) or not isinstance(self.rdzv_port, int) or not 1024 <= self.rdzv_port <= 65535):
            raise UserError(f"--rdzv-port must be a port number between 1024 and 65535 (got {self.rdzv_port!r})")
        for name in ("signal_grace", "max_requeues", "max_preemptions", "max_restarts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"{_flag(name)} must be a whole number >= 0 (got {value!r})")
        if self.max_restarts and self.launcher != "torchrun":
            raise UserError("--max-restarts restarts torchrun's worker group: use --launcher torchrun, or drop it")
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
                out.update({rf.name: getattr(value, rf.name) for rf in fields(Resources)})
            elif f.name == "environment":
                out["environment"] = {ef.name: list(v) if isinstance(v := getattr(value, ef.name), tuple) else v for ef in fields(EnvironmentSpec)}
            elif f.name == "env":
                out["env"] = dict(value)
            elif isinstance(value, tuple):
                out[f.name] = list(value)
            else:
                out[f.name] = value
        return out


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# ---- building a JobSpec from plain data (a job file and/or CLI flags) ---------------------------------------

_RESOURCE_KEYS = {f.name for f in fields(Resources)}
_ENV_KEYS = {f.name for f in fields(EnvironmentSpec)}
_JOB_KEYS = {f.name for f in fields(JobSpec)} - {"resources", "environment"}
VALID_KEYS = sorted(_JOB_KEYS | _RESOURCE_KEYS | {"environment", "gres"})
_INT_KEYS = {"nodes", "nproc_per_node", "gpus_per_node", "shards_per_node", "cpus_per_task", "rdzv_port", "signal_grace",
             "max_requeues", "max_preemptions", "max_restarts"}
_STR_KEYS = {"name", "partition", "account", "qos", "time", "launcher", "output", "error", "run_dir", "gpu_type", "mem", "gres",
             "python"}
_LIST_KEYS = {"command", "sbatch_extra"}


def known_keys(values: dict[Any, Any], valid: Iterable[str], unknown_message: str) -> dict[str, Any]:
    """`values` with '-' in keys read as '_' and null values dropped (null means "the default"); keys outside
    `valid` are a UserError that starts with `unknown_message` and lists the valid ones."""
    valid = sorted(valid)
    data = {str(k).replace("-", "_"): v for k, v in values.items() if v is not None}
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise UserError(f"{unknown_message} {', '.join(unknown)}; valid keys: {', '.join(valid)}")
    return data


def from_mapping(values: dict[str, Any], source: str = "job") -> JobSpec:
    """Build a JobSpec from job-file data (keys as in VALID_KEYS; '-' may stand for '_'). Unknown keys and wrong
    types are UserErrors that name the key and the fix."""
    if not isinstance(values, dict):
        raise UserError(f"{source}: expected a mapping of job options (e.g. `nodes: 2`), got {type(values).__name__}")
    # A key set to null means "the default", so a written-out description (to_dict) reads back unchanged.
    data = known_keys(values, VALID_KEYS, f"{source}: unknown key(s)")
    for key, value in data.items():
        _check_type(source, key, value)
    if "time" in data and isinstance(data["time"], int):
        data["time"] = str(data["time"])  # a bare number is minutes, as sbatch reads it
    if "mem" in data and isinstance(data["mem"], int):
        data["mem"] = str(data["mem"])
    res = {k: data.pop(k) for k in list(data) if k in _RESOURCE_KEYS}
    gres = data.pop("gres", None)
    if gres is not None:
        if any(k in res for k in ("gpus_per_node", "gpu_type", "shards_per_node")):
            raise UserError(f"{source}: give gres or gpus_per_node/gpu_type/shards_per_node, not both")
        res["gpus_per_node"], res["gpu_type"], res["shards_per_node"] = parse_gres(gres)
    env_data = data.pop("environment", None)
    if env_data is not None:
        data["environment"] = _environment_from(source, env_data)
    if "env" in data:
        data["env"] = tuple((str(k), _env_value(source, k, v)) for k, v in data["env"].items())
    for key in _LIST_KEYS & set(data):
        data[key] = tuple(data[key])
    data.setdefault("command", ())
    return JobSpec(resources=Resources(**res), **data)


def _environment_from(source: str, value: Any) -> EnvironmentSpec:
    if isinstance(value, str):
        return EnvironmentSpec(kind=value)
    if not isinstance(value, dict):
        raise UserError(f"{source}: environment must be a kind ({', '.join(ENVIRONMENT_KINDS)}) or a mapping with keys {', '.join(sorted(_ENV_KEYS))}")
    data = known_keys(value, _ENV_KEYS, f"{source}: unknown environment key(s)")
    for key in ("modules", "mounts"):
        if key in data:
            if isinstance(data[key], str):
                data[key] = [data[key]]
            if not isinstance(data[key], list) or not all(isinstance(v, str) for v in data[key]):
                raise UserError(f"{source}: environment.{key} must be a list of strings (got {brief(data[key])})")
            data[key] = tuple(data[key])
    for key in ("kind", "conda_env", "venv", "image", "workdir"):
        if key in data and not isinstance(data[key], str):
            raise UserError(f"{source}: environment.{key} must be a string (got {brief(data[key])})")
    return EnvironmentSpec(**data)


def _check_type(source: str, key: str, value: Any) -> None:
    def bad(expected: str) -> UserError:
        return UserError(f"{source}: {key} must be {expected} (got {brief(value)}, a {type(value).__name__})")

    if key in _INT_KEYS and (isinstance(value, bool) or not isinstance(value, int)):
        raise bad("a whole number")
    if key in _STR_KEYS and not isinstance(value, str) and not (key in ("time", "mem") and isinstance(value, int) and not isinstance(value, bool)):
        raise bad("a string")
    if key in _LIST_KEYS and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
        raise bad("a list of strings")
    if key == "env" and not isinstance(value, dict):
        raise bad("a mapping of NAME: value")


def _env_value(source: str, key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UserError(f"{source}: env.{key} must be a string or a number (got {brief(value)})")
    return str(value)


def missing_prerequisites(job: JobSpec) -> list[str]:
    """The job's environment made once before the first submit (a container image file, a venv) that is not here
    yet: a real submit refuses, a --dry-run only notes it (the script can be read before the image is pulled)."""
    problems = []
    env = job.environment
    if env.kind == "apptainer" and env.image and not Path(env.image).expanduser().is_file():
        problems.append(f"apptainer image {env.image} does not exist: build or pull it first (apptainer pull ...) or fix --image")
    if env.kind == "pyxis" and env.image and _looks_like_path(env.image) and not Path(env.image).expanduser().is_file():
        problems.append(f"enroot image {env.image} does not exist: import it first (enroot import ...) or fix --image")
    if env.kind == "venv" and env.venv and not (Path(env.venv).expanduser() / "bin" / "activate").is_file():
        problems.append(f"venv {env.venv} has no bin/activate: create it (python -m venv {env.venv}) or fix --venv")
    return problems


def local_problems(job: JobSpec) -> list[str]:
    """Paths that must exist here before submitting (the submit host shares the file system with the nodes)."""
    problems = missing_prerequisites(job)
    for flag, pattern in (("--output", job.output), ("--error", job.error)):
        parent = Path(pattern).expanduser().parent if pattern else None
        if parent is not None and "%" not in str(parent) and not parent.is_dir():
            problems.append(f"{flag} {pattern}: directory {parent} does not exist and sbatch will not create it; mkdir -p {parent}")
    return problems


def _looks_like_path(image: str) -> bool:
    return image.startswith(("/", "./", "../", "~")) or image.endswith((".sqsh", ".squashfs"))
