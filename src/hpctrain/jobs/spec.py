"""The scheduler-neutral job description: typed, frozen, validated once where it is built (CLI flags and/or a job
file).

Only what every scheduler means the same way: the command, the nodes and what each needs (processes, GPUs, CPUs,
memory in bytes), the time limit in seconds, the run directory, the restart budget, environment variables, the
name and the nodes to avoid. What only one scheduler has (a Slurm partition, GPU type, shards, software
environment or interpreter; a Kubernetes image, volumes or selectors) is that backend's typed options part
(hpctrain.schedulers.slurm.batch.options.SlurmOptions,
hpctrain.schedulers.kubernetes.manifests.options.KubernetesOptions), and
each backend checks the JobSpec against what its own forms can hold. Validation here is pure: it looks at values,
not at the file system or the cluster. The typed forms of the values (a time limit, a memory size) are read in
`values`; plain data (a job file, flags) becomes a JobSpec in `mapping`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, fields
from typing import Any

from hpctrain.errors import UserError
from hpctrain.jobs.values import (
    MAX_CPUS_PER_TASK,
    MAX_GPUS_PER_NODE,
    MAX_MEM_BYTES,
    MAX_NODES,
    MAX_PROCS_PER_NODE,
    check_node_name,
    mem_text,
    time_text,
)

_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Resources:
    """What one node (Slurm) or pod (Kubernetes) of the job needs. cpus_per_task counts CPUs per training process,
    for every launcher."""

    nodes: int = 1
    """Nodes (Slurm) or pods (Kubernetes) asked for; of an elastic job (min_nodes set), the most it trains on."""
    min_nodes: int | None = None
    """An elastic job (`--nodes MIN:MAX`): the fewest nodes it keeps training on when nodes are lost, below
    `nodes`. None: a fixed count, every node needed to the end."""
    nproc_per_node: int = 1
    """Training processes per node (torchrun workers or srun tasks)."""
    gpus_per_node: int = 0
    """Whole GPUs per node."""
    cpus_per_task: int = 1
    mem_bytes: int | None = None
    """Memory per node in bytes; 0: each node's whole memory (where the scheduler can say so); None: the
    scheduler's default."""

    def __post_init__(self) -> None:
        for name, low in (("nodes", 1), ("nproc_per_node", 1), ("cpus_per_task", 1), ("gpus_per_node", 0)):
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
        if self.mem_bytes is not None:
            value = self.mem_bytes
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_MEM_BYTES:
                raise UserError(f"--mem must be a size from 0 to {MAX_MEM_BYTES >> 40}T per node (got {value!r})")

    @property
    def elastic(self) -> bool:
        """`--nodes MIN:MAX`: the job keeps training while at least min_nodes of its nodes remain."""
        return self.min_nodes is not None

    @property
    def node_range(self) -> str:
        """--nodes as the user writes it: N, or MIN:MAX for an elastic job."""
        return f"{self.min_nodes}:{self.nodes}" if self.min_nodes is not None else str(self.nodes)

    @property
    def mem(self) -> str | None:
        """The memory as a user types it (16G), for messages and job.yaml; None: the scheduler's default."""
        return None if self.mem_bytes is None else mem_text(self.mem_bytes)


_MAXIMA = {
    "nodes": MAX_NODES,
    "nproc_per_node": MAX_PROCS_PER_NODE,
    "cpus_per_task": MAX_CPUS_PER_TASK,
    "gpus_per_node": MAX_GPUS_PER_NODE,
}


@dataclass(frozen=True)
class JobSpec:
    """One job: the command every process runs, its resources, time limit and restart budget, on any scheduler."""

    command: tuple[str, ...]
    """argv of one training process, e.g. ("hpctrain", "train", "mnist", "--epochs", "1") or ("python", "train.py")."""
    name: str = "hpctrain"
    time_limit_s: int | None = None
    """Time limit in seconds; None: the scheduler's (partition's) default. The training time of one attempt on
    either scheduler, warned signal_grace seconds before its end (Kubernetes: by the job's own timer)."""
    resources: Resources = field(default_factory=Resources)
    exclude_nodes: tuple[str, ...] = ()
    """Nodes the job must not run on, by name (Slurm: --exclude; Kubernetes: a required node affinity, the Node's
    metadata.name not in them), e.g. those a preflight found sick (RUN/bad_nodes)."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables exported before the command starts."""
    run_dir: str | None = None
    """Run directory of the job (exported as HPCTRAIN_RUN_DIR); the requeue logic reads its stop_reason."""
    signal_grace: int = 120
    """Seconds before the time limit at which the job gets SIGUSR1 to checkpoint; 0: no warning, no requeue."""
    max_restarts: int = 0
    """Restart the worker group this often after a worker dies (it resumes from its checkpoint)."""

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
        if self.time_limit_s is not None and (
            isinstance(self.time_limit_s, bool) or not isinstance(self.time_limit_s, int) or self.time_limit_s <= 0
        ):
            raise UserError(f"--time must be a positive number of seconds (got {self.time_limit_s!r})")
        for node in self.exclude_nodes:
            check_node_name(node)
        # How processes start on a node (and so whether the GPUs match them) is each backend's to check.
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
        for name in ("signal_grace", "max_restarts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"{_flag(name)} must be a whole number >= 0 (got {value!r})")
        if self.signal_grace and self.time_limit_s is not None and self.signal_grace >= self.time_limit_s:
            raise UserError(
                f"--signal-grace {self.signal_grace} s is not shorter than the time limit {self.time}: "
                "lower --signal-grace or raise --time"
            )

    @property
    def time(self) -> str | None:
        """The time limit as a user types it (30:00, 1-00:00:00), for messages and job.yaml; None: no limit given."""
        return None if self.time_limit_s is None else time_text(self.time_limit_s)

    @property
    def is_recipe(self) -> bool:
        """The command is a built-in recipe (`hpctrain train ...`)."""
        return tuple(self.command[:2]) == ("hpctrain", "train")

    def replace(self, **changes: Any) -> JobSpec:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain data in the job-file layout (flat resources, a time and a size as typed); from_mapping reads it
        back."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "resources":
                for rf in fields(Resources):
                    if rf.name == "mem_bytes":
                        out["mem"] = value.mem
                    elif rf.name != "min_nodes":
                        out[rf.name] = getattr(value, rf.name)
                if value.elastic:
                    out["nodes"] = value.node_range  # a job file's `nodes: "MIN:MAX"`
            elif f.name == "time_limit_s":
                out["time"] = self.time
            elif f.name == "env":
                out["env"] = dict(value)
            elif isinstance(value, tuple):
                out[f.name] = list(value)
            else:
                out[f.name] = value
        return out


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
