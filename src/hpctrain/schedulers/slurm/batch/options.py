"""SlurmOptions: what a Slurm job needs beyond the scheduler-neutral JobSpec, validated once, here.

The #SBATCH-only values (partition, account, qos, output/error, extra options), Slurm's GPU requests beyond a
count of whole GPUs (a GPU type, shards of shared GPUs), where the command runs on a node (EnvironmentSpec:
modules, conda, a venv, an apptainer or enroot image with its mounts and workdir; the interpreter of a job without
one), how the processes start (the launcher, torchrun's rendezvous port) and Slurm's own restart budgets
(requeues, preemptions, hang restarts). A job file holds them in its `slurm:` section, or at its top level as job
files did before sections existed (FILE_KEYS). What needs the JobSpec too (a launcher against the resources, a GPU
type against the GPU count, the #SBATCH form of the job's name) is `check_job`'s; `checked_for_job` resolves the
options for a job and checks them, once per rendered script. The values that go on #SBATCH lines are checked here
too (check_sbatch_value, parse_sbatch_option: what sbatch's own parser can read back); script.py writes the lines.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

from hpctrain.errors import UserError, brief
from hpctrain.jobs.spec import JobSpec
from hpctrain.jobs.values import MAX_GPUS_PER_NODE

LAUNCHERS = ("torchrun", "srun", "single")
ENVIRONMENT_KINDS = ("none", "modules", "conda", "venv", "apptainer", "pyxis")
_GPU_TYPE_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_MODULE_RE = re.compile(r"^[A-Za-z0-9_.+/@-]+$")
_EXAMPLES = {"conda_env": "--conda-env myenv", "venv": "--venv ~/venvs/train", "image": "--image pytorch.sif"}


@dataclass(frozen=True)
class EnvironmentSpec:
    """Where the command runs on a node: the host as is, modules, conda, a venv, an apptainer image or an enroot
    image via pyxis."""

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

    def to_data(self) -> dict[str, Any]:
        """Plain data in the job-file layout (lists for tuples), as a job file's `environment:` holds it."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v for f in fields(self)}


_ENV_KEYS = {f.name for f in fields(EnvironmentSpec)}


def environment_from(source: str, value: Any) -> EnvironmentSpec:
    """A job file's `environment:` (a kind, or a mapping of EnvironmentSpec fields) -> EnvironmentSpec."""
    from hpctrain.jobs.mapping import known_keys

    if isinstance(value, EnvironmentSpec):
        return value
    if isinstance(value, str):
        return EnvironmentSpec(kind=value)
    if not isinstance(value, Mapping):
        raise UserError(
            f"{source}: environment must be a kind ({', '.join(ENVIRONMENT_KINDS)}) or a mapping with "
            f"keys {', '.join(sorted(_ENV_KEYS))}"
        )
    data = known_keys(dict(value), _ENV_KEYS, f"{source}: unknown environment key(s)")
    for key in ("modules", "mounts"):
        if key in data:
            if isinstance(data[key], str):
                data[key] = [data[key]]
            if isinstance(data[key], tuple):
                data[key] = list(data[key])
            if not isinstance(data[key], list) or not all(isinstance(v, str) for v in data[key]):
                raise UserError(f"{source}: environment.{key} must be a list of strings (got {brief(data[key])})")
            data[key] = tuple(data[key])
    for key in ("kind", "conda_env", "venv", "image", "workdir"):
        if key in data and not isinstance(data[key], str):
            raise UserError(f"{source}: environment.{key} must be a string (got {brief(data[key])})")
    return EnvironmentSpec(**data)


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    output: str | None = None
    """Output file pattern (sbatch --output; %j is the job id). None: slurm-%j.out in the submit directory."""
    error: str | None = None
    sbatch_extra: tuple[str, ...] = ()
    """More sbatch options, one per #SBATCH line, e.g. "--exclusive" or "--constraint=a100"."""
    launcher: str | None = None
    """torchrun: one torchrun per node; srun: one task per process; single: one process. None: `for_job` chooses
    (single for a built-in recipe's one process, else torchrun)."""
    rdzv_port: int | None = None
    """torchrun rendezvous port; None: the first free port from a job-specific start on the head node."""
    max_requeues: int = 3
    """How often the job may requeue itself after a time-limit warning."""
    max_preemptions: int = 10
    """How often the job may start again after Slurm requeued it on its own (preemption, node failure)."""
    gpu_type: str | None = None
    """The GPU type of the job's whole GPUs, as `sinfo -o %G` shows it (`--gres gpu:TYPE:N`)."""
    shards_per_node: int = 0
    """Slices of shared GPUs (Slurm's `shard` GRES), instead of whole GPUs."""
    environment: EnvironmentSpec = field(default_factory=EnvironmentSpec)
    """Where the command runs on a node; a job file's `environment:` (a kind or a mapping) is read into it."""
    python: str | None = None
    """Environment kind none: the absolute path of the Python that runs hpctrain and torchrun in the job
    (`PYTHON -m hpctrain`, `PYTHON -m torch.distributed.run`); `hpctrain submit` sets it to its own interpreter, so
    the job finds the tools that submitted it whatever the PATH. None: find them on the job's PATH."""
    max_hang_restarts: int = 2
    """How often the job may start again after hpctrain's hang watchdog ended an attempt (needs the run dir)."""

    def __post_init__(self) -> None:
        if not isinstance(self.environment, EnvironmentSpec):
            object.__setattr__(self, "environment", environment_from("slurm options", self.environment))
        for name in ("partition", "account", "qos", "output", "error"):
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, str):
                    raise UserError(f"{_flag(name)} must be a string (got {value!r})")
                check_sbatch_value(_flag(name), value)
        if not isinstance(self.sbatch_extra, tuple):
            raise UserError(f"extra sbatch options must be a list of strings (got {self.sbatch_extra!r})")
        for line in self.sbatch_extra:
            refuse_own_option(line)
        if self.launcher is not None and self.launcher not in LAUNCHERS:
            raise UserError(f"--launcher {self.launcher!r} is unknown: use one of {', '.join(LAUNCHERS)}")
        if self.rdzv_port is not None and (
            isinstance(self.rdzv_port, bool)
            or not isinstance(self.rdzv_port, int)
            or not 1024 <= self.rdzv_port <= 65535
        ):
            raise UserError(f"--rdzv-port must be a port number between 1024 and 65535 (got {self.rdzv_port!r})")
        for name in ("max_requeues", "max_preemptions", "max_hang_restarts", "shards_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"{_flag(name)} must be a whole number >= 0 (got {value!r})")
        if self.shards_per_node > MAX_GPUS_PER_NODE * 1024:
            raise UserError(
                f"--gres shard:{self.shards_per_node} is more than {MAX_GPUS_PER_NODE * 1024}, beyond any cluster: "
                "check the value"
            )
        if self.gpu_type is not None and (not isinstance(self.gpu_type, str) or not _GPU_TYPE_RE.match(self.gpu_type)):
            raise UserError(
                f"--gpu-type {self.gpu_type!r}: use the GPU type that `sinfo -o %G` shows (letters, digits, _ . -)"
            )
        if self.python is not None:
            if not isinstance(self.python, str) or not self.python.startswith("/"):
                raise UserError(f"python must be the absolute path of a Python interpreter (got {self.python!r})")
            if self.environment.kind != "none":
                raise UserError(
                    f"python {self.python} is the interpreter for environment kind none; a {self.environment.kind} "
                    "environment brings its own hpctrain and torchrun: remove python from the job file"
                )
            check_sbatch_value("python", self.python)


FILE_KEYS: dict[str, Any] = {
    **{f.name: f.default for f in fields(SlurmOptions) if f.default is not MISSING},
    "environment": "none",
    "gres": None,
}
"""The keys of a job file's `slurm:` section, also read at the file's top level (where they were before), with
their defaults: SlurmOptions' fields, and `gres` (gpu:N, gpu:TYPE:N or shard:N), which flags.complete_job splits
into the job's GPU count and these options' GPU type and shards."""

EARLIER_DEFAULTS: dict[str, Any] = {
    "launcher": "torchrun",  # before a recipe's one process started without torchrun
    "environment": EnvironmentSpec().to_data(),  # before the environment was Slurm's: every job.yaml held it
}
"""Keys whose default has changed -> the default that job files of earlier versions hold."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def read_file_section(source: str, section: Any) -> dict[str, Any]:
    """A job file's `slurm:` section (or its top-level Slurm keys): SlurmOptions fields, lists become tuples;
    a value of the wrong type is refused naming the key. The environment stays plain data (a mapping of its
    fields) for the job's record, checked here."""
    from hpctrain.jobs.mapping import known_keys

    if not isinstance(section, dict):
        raise UserError(f"{source}: slurm must be a mapping of options ({', '.join(FILE_KEYS)})")
    data = known_keys(section, FILE_KEYS, f"{source}: unknown slurm key(s)")
    for key, value in data.items():
        got = f"(got {brief(value)}, a {type(value).__name__})"
        if key == "sbatch_extra":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise UserError(f"{source}: {key} must be a list of strings {got}")
            data[key] = tuple(value)
        elif key in ("rdzv_port", "max_requeues", "max_preemptions", "max_hang_restarts", "shards_per_node"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserError(f"{source}: {key} must be a whole number {got}")
        elif key == "environment":
            data[key] = environment_from(source, value).to_data()
        elif not isinstance(value, str):
            raise UserError(f"{source}: {key} must be a string {got}")
    return data


def for_job(options: SlurmOptions | None, job: JobSpec) -> SlurmOptions:
    """The options with the launcher chosen when none was given: a built-in recipe's single process starts
    plainly (`single`: no torchrun banner and keep-alive warnings around one process, whose stops hpctrain's loop
    says itself); anything else, a user's command included (its script may read torchrun's variables), torchrun.
    --max-restarts (which restarts torchrun's worker group) and more GPUs than processes keep torchrun (and its
    check)."""
    options = SlurmOptions() if options is None else options
    if options.launcher is not None:
        return options
    r = job.resources
    one = r.nodes == 1 and r.nproc_per_node == 1 and r.gpus_per_node <= 1 and job.is_recipe and not job.max_restarts
    return replace(options, launcher="single" if one else "torchrun")


def checked_for_job(options: SlurmOptions | None, job: JobSpec) -> SlurmOptions:
    """The options a batch script is rendered with: resolved for the job (for_job) and checked against it
    (check_job), once; what Slurm cannot run is refused here, before anything is rendered."""
    options = for_job(options, job)
    check_job(job, options)
    return options


def check_job(job: JobSpec, options: SlurmOptions) -> None:
    """What Slurm needs of the job with these options (resolved: for_job): the launcher against the resources, and
    the job's values that go on #SBATCH lines (its name, time) or into the script's interpreter call."""
    r = job.resources
    elastic = r.min_nodes is not None  # r.elastic (a plain field read keeps the call chain of `dev` short)
    if elastic and options.launcher != "torchrun":
        raise UserError(
            f"--nodes {r.node_range} is an elastic job, which torchrun re-forms when a node is lost: use --launcher "
            f"torchrun (--launcher {options.launcher} starts a fixed set of processes), or --nodes {r.nodes}"
        )
    if elastic and not job.max_restarts:
        raise UserError(
            f"--nodes {r.node_range} continues after a lost node by restarting torchrun's worker group: give the "
            "budget of such membership changes with --max-restarts N (e.g. --max-restarts 3)"
        )
    if options.launcher == "single" and (r.nodes != 1 or r.nproc_per_node != 1):
        raise UserError(
            f"--launcher single runs one process, but the job asks for {r.nodes} node(s) x {r.nproc_per_node} "
            "process(es): use --launcher torchrun or srun, or --nodes 1 --nproc-per-node 1"
        )
    if r.gpus_per_node and options.launcher != "single" and r.nproc_per_node != r.gpus_per_node:
        raise UserError(
            f"--nproc-per-node {r.nproc_per_node} does not match --gpus-per-node {r.gpus_per_node}: "
            f"DDP wants one process per GPU, so set --nproc-per-node {r.gpus_per_node} "
            "(or --launcher single for one process driving all GPUs with DataParallel)"
        )
    if job.max_restarts and options.launcher != "torchrun":
        raise UserError("--max-restarts restarts torchrun's worker group: use --launcher torchrun, or drop it")
    if options.gpu_type is not None and not r.gpus_per_node:
        raise UserError(f"--gpu-type {options.gpu_type!r} needs --gpus-per-node N")
    if r.gpus_per_node and options.shards_per_node:
        raise UserError("ask for whole GPUs (--gpus-per-node) or shards (--gres shard:N), not both")
    check_job_values(job)


def gres(job: JobSpec, options: SlurmOptions) -> str | None:
    """The --gres value for sbatch (the job's GPUs, with these options' type, or shards), or None for CPUs only: the
    form grammar.read_gres_request reads."""
    gpus = job.resources.gpus_per_node
    if gpus:
        return f"gpu:{options.gpu_type}:{gpus}" if options.gpu_type else f"gpu:{gpus}"
    return f"shard:{options.shards_per_node}" if options.shards_per_node else None


def uses_gpus(job: JobSpec, options: SlurmOptions) -> bool:
    """The job's processes use GPUs: whole ones, or shards of shared ones."""
    return bool(job.resources.gpus_per_node or options.shards_per_node)


# --- What an #SBATCH line can hold ---
#
# sbatch reads #SBATCH lines with its own parser, not a shell: a value must not hold control characters (a second
# line), backslashes or both kinds of quote, and an extra option (--sbatch) must be exactly one option. SlurmOptions
# runs these rules on its values, `check_job_values` on a JobSpec's before any line is rendered; another backend
# never sees them (it has rules of its own for the same values, e.g. a Kubernetes name). The lines themselves are
# written (and quoted) by script.py.


def check_job_values(job: JobSpec) -> None:
    """The job's own text that goes on #SBATCH lines (its name; its time limit and memory are numbers, rendered by
    Slurm's own forms): refused with the fix when sbatch could not read it back faithfully. (SlurmOptions checks
    its own values, the interpreter among them.)"""
    check_sbatch_value("--job-name", job.name)


def _check_no_control_characters(what: str, value: str) -> None:
    bad = sorted({repr(c) for c in value if ord(c) < 32 or ord(c) == 127})
    if bad:
        raise UserError(
            f"{what} {value!r} contains control characters ({', '.join(bad)}): sbatch reads it from one "
            "#SBATCH line; remove them"
        )


def check_sbatch_value(what: str, value: str) -> None:
    """#SBATCH lines are parsed by sbatch, not by a shell: refuse what cannot be written there faithfully."""
    if not value:
        raise UserError(f"{what} is empty: give a value or leave the option out")
    _check_no_control_characters(what, value)
    if "\\" in value or ('"' in value and "'" in value):
        raise UserError(
            f"{what} {value!r} cannot be written on an #SBATCH line: remove backslashes, and use only one kind of quote"
        )


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
        raise UserError(
            f"{what}: {err} (unbalanced quotes); quote a value with spaces once: --comment='two words'"
        ) from None
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
        raise UserError(
            f"{what} is {len(words)} words; give {usage} (quote a value with spaces: --comment='two words')"
        )
    raise UserError(
        f"{what} is not one sbatch option; give {usage} (a short option takes its value after a space: -C a100)"
    )


# sbatch options the script writes from hpctrain's own flags: a second #SBATCH line of one (sbatch takes the last)
# would make the job differ from what hpctrain renders around it (torchrun's --nnodes, the requeue budgets).
OWN_OPTIONS = {
    "--nodes": "--nodes N or MIN:MAX",
    "-N": "--nodes N or MIN:MAX",
    "--ntasks": "--nodes and --nproc-per-node",
    "-n": "--nodes and --nproc-per-node",
    "--ntasks-per-node": "--nproc-per-node",
    "--cpus-per-task": "--cpus-per-task",
    "-c": "--cpus-per-task",
    "--no-kill": "--nodes MIN:MAX (an elastic job keeps its allocation when a node fails)",
    "-k": "--nodes MIN:MAX (an elastic job keeps its allocation when a node fails)",
}


def refuse_own_option(text: str) -> None:
    """An extra option (accepted by parse_sbatch_option) that hpctrain writes itself is refused naming its flag."""
    name, _ = parse_sbatch_option(text)
    if name in OWN_OPTIONS:
        raise UserError(
            f"--sbatch {text!r}: hpctrain writes {name} itself from its own flags; use {OWN_OPTIONS[name]} instead"
        )
