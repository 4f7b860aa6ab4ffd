"""SlurmOptions: what a Slurm job needs beyond the scheduler-neutral JobSpec, validated once, here.

The #SBATCH-only values (partition, account, qos, output/error, extra options), how the processes start (the
launcher, torchrun's rendezvous port) and Slurm's own requeue budgets. A job file holds them in its `slurm:`
section, or at its top level as job files did before sections existed (FILE_KEYS). What needs the JobSpec too
(a launcher against the resources, the #SBATCH form of the job's name) is `check_job`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from hpctrain.errors import UserError
from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers.slurm.directives import check_sbatch_value, refuse_own_option

LAUNCHERS = ("torchrun", "srun", "single")


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

    def __post_init__(self) -> None:
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
        for name in ("max_requeues", "max_preemptions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"{_flag(name)} must be a whole number >= 0 (got {value!r})")


FILE_KEYS = {f.name: f.default for f in fields(SlurmOptions)}
"""The keys of a job file's `slurm:` section, also read at the file's top level (where they were before), with
their defaults."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def read_file_section(source: str, section: Any) -> dict[str, Any]:
    """A job file's `slurm:` section (or its top-level Slurm keys): SlurmOptions fields, lists become tuples;
    a value of the wrong type is refused naming the key."""
    from hpctrain.errors import brief
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
        elif key in ("rdzv_port", "max_requeues", "max_preemptions"):
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserError(f"{source}: {key} must be a whole number {got}")
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


def check_job(job: JobSpec, options: SlurmOptions) -> None:
    """What Slurm needs of the job with these options: the launcher against the resources, and the job's values
    that go on #SBATCH lines (its name, time) or into the script's interpreter call."""
    from hpctrain.schedulers.slurm.directives import check_job_values

    options = for_job(options, job)
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
    check_job_values(job)
