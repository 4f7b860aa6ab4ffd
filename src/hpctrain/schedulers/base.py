"""The scheduler interface: what every backend (Slurm, Kubernetes) offers, and the neutral data it returns.

Modelled on TorchX's scheduler split: `render` is pure (it gives `--dry-run` its text and never talks to the
cluster), `local_check` looks at what the submit host can see, `check` asks the live cluster whether the job can
run, `submit` is thin (it sends what `render` produced), and `status`/`list_jobs`/`logs`/`cancel`/`cluster`
follow jobs after submission. Backends keep their own options (a Slurm partition, a Kubernetes namespace) in the
object a backend's `create()` returns; the JobSpec is the scheduler-neutral part.

What each scheduler shows in its own way (Slurm's status table and JSON, Kubernetes' pod view, how a cancel
unfolds) is the backend's data, never its printing: `status_view` and `cluster_view` return a View (the records
for --json, Tables and lines for people), `cancel_and_wait` and `preempt` an Outcome; the CLI formats them
(hpctrain.cli.views), so no backend writes to stdout and the CLI never names a scheduler. What the CLI
must know before a backend exists (which flags are whose, how a job's defaults differ) is a BackendInfo, declared
by each backend package as INFO.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hpctrain.errors import UserError

if TYPE_CHECKING:
    from hpctrain.schedulers.service_api import Services

# Neutral job states. A backend maps its own vocabulary onto these (Kubeflow's Created -> PENDING, ...).
PENDING = "PENDING"
RUNNING = "RUNNING"
RESTARTING = "RESTARTING"
SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
SUSPENDED = "SUSPENDED"
UNKNOWN = "UNKNOWN"
FINISHED_STATES = frozenset({SUCCEEDED, FAILED, CANCELLED})

WARNING_PREFIX = "warning: "
NOTE_PREFIX = "note: "  # a check that could not run (and why); does not block either
# What the scheduler will do with the job at its time limit (a note `submit` says too, before queueing; `check` says
# every note).
TIME_LIMIT_NOTE = NOTE_PREFIX + "time limit: "

SERVICE_ROLES = ("dev", "dev-sessions", "tensorboard", "top")
"""The roles (BackendInfo.add_arguments) of the commands around a service: dev start, dev list/stop,
tensorboard --on-cluster, top."""
ROLES = ("job", "status", "logs", "cancel", "cluster", "preempt", "stacks", *SERVICE_ROLES)
"""Every role a command asks a backend to add its flags for: `job` is submit's and check's."""


class Prerequisite(str):
    """A problem of `local_check` with something made once before the first submit (a container image pulled, a
    venv created) or that follows from one missing: a real submit and `check` refuse it, `submit --dry-run` only
    notes it (the script can be read before the image is pulled). The backend says so by the type, not the text."""


class JobNotFound(UserError):
    """The scheduler does not know the job (never submitted, or deleted): `cancel` and `submit --wait` tell "gone"
    apart from a failure to ask."""


@dataclass(frozen=True)
class Rendered:
    """What `submit` sends: `text` is what `--dry-run` prints and what the run directory records under `filename`;
    `payload` is the backend's own form of the same thing (the manifest as a dict for Kubernetes)."""

    text: str
    filename: str
    payload: Any = None
    preview: str | None = None
    """What `--dry-run` prints when it is more than `text` (Slurm: the sbatch command line, then the script)."""


@dataclass(frozen=True)
class ReplicaStatus:
    """One process group of the job: a Kubernetes pod (`master-0`, `worker-1`) or a Slurm node."""

    name: str
    phase: str
    """Pending, Running, Succeeded, Failed, Unknown (the pod phase vocabulary)."""
    node: str | None = None
    restarts: int = 0
    exit_code: int | None = None
    reason: str | None = None
    """Why it waits or ended: ContainerCreating, OOMKilled, Unschedulable, ..."""
    message: str | None = None
    """What the process said last as it ended (Kubernetes: the container's termination message), e.g.
    "sick_node: node07" from the preflight."""


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    state: str
    """One of the neutral states above."""
    exit_code: int | None = None
    restarts: int = 0
    replicas: tuple[ReplicaStatus, ...] = ()
    pending_reasons: tuple[str, ...] = ()
    """Why the job or its replicas wait (scheduler events, quota), one line each."""
    message: str | None = None
    """The scheduler's own last word on the job (a condition message, Slurm's Reason)."""
    label: str | None = None
    """The state in the scheduler's own words where they say more than `state` (Slurm's TIMEOUT, COMPLETING)."""
    last_lines: tuple[str, ...] = ()
    """The last lines each failed replica wrote, `REPLICA: LINE` each, where the scheduler kept them (Kubernetes: the
    run directory's pod-logs, else a failed container's termination message); empty while the job has not failed."""

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES

    @property
    def shown_state(self) -> str:
        return self.label or self.state


def progress(status: JobStatus) -> str:
    """`RUNNING`, `PENDING (why)`, `RUNNING, 2 restart(s)`: how `submit --wait` says a change of state."""
    why = f" ({'; '.join(status.pending_reasons)})" if status.pending_reasons else ""
    again = f", {status.restarts} restart(s)" if status.restarts else ""
    return f"{status.shown_state}{why}{again}"


@dataclass(frozen=True)
class JobSummary:
    """One job of `list_jobs`, as every scheduler means it (the web console's jobs table): read from the
    scheduler's one fast listing, so that 100,000 jobs cost one query. A value the scheduler does not say is None."""

    job_id: str
    state: str
    """One of the neutral states above."""
    created: str | None = None
    """When it was submitted, ISO 8601 (with its zone where the scheduler gives one; else the cluster's local time)."""
    replicas: int = 0
    """Its nodes (Kubernetes: its pods, one a node)."""
    name: str | None = None
    processes_per_node: int | None = None
    """The processes the scheduler starts on each node (Slurm: its tasks, one torchrun a node by default; Kubernetes:
    the training processes of each pod)."""
    gpus: int | None = None
    """The GPUs it asked for, all nodes together."""
    restarts: int | None = None
    """How often it was started again (Slurm: requeued; Kubernetes: its pods' restarts)."""
    label: str | None = None
    """The state in the scheduler's own words where they say more than `state` (Slurm's TIMEOUT, COMPLETING)."""


@dataclass(frozen=True)
class NodeView:
    """One node's capacity: what it offers (allocatable) against what running work requested."""

    name: str
    cpu_allocatable: float
    cpu_requested: float
    memory_allocatable: int
    """bytes"""
    memory_requested: int
    gpus_allocatable: int = 0
    gpus_requested: int = 0
    schedulable: bool = True

    @property
    def cpu_free(self) -> float:
        return max(0.0, self.cpu_allocatable - self.cpu_requested)

    @property
    def memory_free(self) -> int:
        return max(0, self.memory_allocatable - self.memory_requested)

    @property
    def gpus_free(self) -> int:
        return max(0, self.gpus_allocatable - self.gpus_requested)


@dataclass(frozen=True)
class ClusterView:
    nodes: tuple[NodeView, ...]
    quota: tuple[str, ...] = ()
    """Quota use, one line per limit, e.g. `team-a/compute requests.cpu: 6 of 8 used`."""


@dataclass(frozen=True)
class Table:
    """Records as rows of text cells under a header (a job a row, a node a row), for a person to read; the CLI
    lays it out. Cells are text, never markup."""

    columns: tuple[str, ...]
    rows: Sequence[Sequence[str]]
    """A sequence of rows, or ColumnCells: the same rows kept a column at a time (a long table built from columns
    is laid out from them, never turned into row tuples first)."""
    title: str | None = None


class ColumnCells(Sequence[tuple[str, ...]]):
    """Rows kept as their columns (`columns[i][r]` is row r's cell i, every column as long): what a backend builds
    when it makes a long table a column at a time (100,000 jobs); read as row tuples by whoever iterates it."""

    __slots__ = ("columns",)

    def __init__(self, columns: Sequence[Sequence[str]]) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns[0]) if self.columns else 0

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return list(zip(*(column[index] for column in self.columns)))
        return tuple(column[index] for column in self.columns)

    def __iter__(self) -> Iterator[tuple[str, ...]]:
        return zip(*self.columns)


@dataclass(frozen=True)
class View:
    """What `hpctrain status` or `cluster` shows, as data: `records` is the --json document (JSON-able: the records'
    dicts, a list of them or one), `parts` what a person reads, in order: Tables and lines of text. Either may be
    given as a function that makes it, called only for the form shown: 100,000 jobs are not made both into dicts
    and into rows."""

    records: Any
    parts: tuple[Table | str, ...] | Callable[[], tuple[Table | str, ...]] = ()
    plain: bool = False
    """Tables always as aligned text and lines as they are (kubectl's look); else a short table is laid out by rich
    and lines are printed as rich text."""
    ended: bool | None = None
    """One job's view: whether the job has ended, as of the query that made the view (the web console follows a
    job's log until its view says so, asking the scheduler nothing more); None: not one job's view."""

    def json_records(self) -> Any:
        return self.records() if callable(self.records) else self.records

    def text_parts(self) -> tuple[Table | str, ...]:
        return self.parts() if callable(self.parts) else self.parts


@dataclass(frozen=True)
class Outcome:
    """What became of an action on a job (`cancel`, `debug preempt`): the lines that say it, and the exit status."""

    lines: tuple[str, ...]
    exit_code: int = 0


@dataclass(frozen=True)
class JobAccess:
    """How a person reaches a job from beside it (the web console's job page): the command for a shell beside its
    processes, and the logs the scheduler keeps of it (what `logs(job, replica=, stream=)` accepts)."""

    shell: str
    """The exact command, quoted, that opens a shell beside the job (`srun --jobid ... --overlap --pty bash`,
    `kubectl exec ...`)."""
    replicas: tuple[str, ...] = ()
    """The replicas with a log of their own (Kubernetes: one per pod); empty: one log for the whole job."""
    streams: tuple[str, ...] = ("stdout",)
    """The streams kept apart (Slurm: stdout and stderr)."""


@dataclass(frozen=True)
class BackendInfo:
    """What the CLI knows of a backend before building it (from flags that may belong to another one): declared by
    each backend package as INFO, imported without the backend's client."""

    name: str
    title: str
    """The name in messages: Slurm, Kubernetes."""
    flags: Mapping[str, str] = field(default_factory=dict)
    """argparse dest -> flag, for every command-line option only this backend understands (any command)."""
    hints: Mapping[str, str] = field(default_factory=dict)
    """flag of another backend -> how this backend says the same thing (`--partition` -> use --node-selector)."""
    connection_fields: Mapping[str, str] = field(default_factory=dict)
    """argparse dest -> keyword of the backend's create(), for where jobs are (a namespace): every command."""
    option_fields: Mapping[str, str] = field(default_factory=dict)
    """The same for a job's options (the connection's, an image, volumes; a partition, the launcher): submit and
    check."""
    file_section: Callable[[str, Any], dict[str, Any]] | None = None
    """Reads a job file's section named after the backend (`kubernetes:`, `slurm:`) into its options: (source,
    section) -> fields; None: the backend has no section."""
    file_keys: Mapping[str, Any] = field(default_factory=dict)
    """Keys of that section also read at a job file's top level (where job files kept them before sections), with
    their defaults: a key at its default is no option (another backend's job file may hold it)."""
    earlier_defaults: Mapping[str, Any] = field(default_factory=dict)
    """Keys whose default has changed -> the default that job files of earlier versions hold: at that value too a key
    is no option (a job.yaml written before the launcher was chosen per job holds `launcher: torchrun`)."""
    file_formats: Mapping[str, Callable[[str, str], tuple[dict[str, Any], dict[str, Any]]]] = field(
        default_factory=dict
    )
    """Job file suffix -> parser of the backend's own job file format (`.params`): (text, source) -> (JobSpec
    fields, the backend's options). Such a file is always for this backend."""
    add_arguments: Callable[[Any, Any, str], None] = lambda parser, group, role: None
    """(parser, its scheduler argument group, role) adds this backend's own flags to a command, with their help
    text, in the group given or groups of the backend's own: a flag only this backend understands is declared here
    and nowhere in the CLI. The roles are ROLES: `job` (submit, check: where the job goes and its options), a
    command on jobs (status, logs, cancel, cluster, preempt, stacks: where the jobs are, and what the command takes
    on this backend) or a service's (SERVICE_ROLES: dev, dev-sessions, tensorboard, top)."""
    complete_job: Callable[
        [dict[str, Any], dict[str, Any], Mapping[str, Any]], tuple[dict[str, Any], dict[str, Any]]
    ] = lambda data, options, flags: (data, options)
    """(the neutral job data: the job file's, the neutral flags on top; this backend's options: its section or
    top-level keys, its flags on top; every flag by argparse dest) -> both parts with what this backend adds or
    splits: Slurm splits a GRES request into the job's GPU count and its own GPU type and shards, and adds the
    environment its flags describe (--venv, --env-kind, ...) and the interpreter, where the job runs on machines
    that share this one's file system and programs."""
    probe_options: Mapping[str, Any] = field(default_factory=dict)
    """Options of a one-off probe job (`check --preflight`), on top of the job's: it never starts again."""
    run_dir_pattern: Callable[[str], str] = lambda stem: f"{stem}-%j"
    """A job's default run directory from its stem (runs/NAME, a recipe's runs/WORKLOAD-...); %j: the job id."""
    local_run_dir: Callable[[str], Path | None] = lambda run_dir: Path(run_dir)
    """Where this machine reads a submitted job's run directory (%j filled in); None where it cannot (the run
    directory is on the pods' volumes)."""
    client_version: Callable[[], str | None] = lambda: None
    """The version of this backend's client here, for `hpctrain env` (None: not installed); quick, never raises,
    imports no client."""


class Scheduler(Protocol):
    """One backend. Job ids are the scheduler's own (a Slurm job id, a Kubernetes object name)."""

    name: str
    dry_run_note: str
    """What `submit --dry-run` did not check (it needs the live cluster), and which command does."""

    def connection(self) -> dict[str, str]:
        """Where this scheduler's jobs are, as the job flags (dest -> value) that say it (a Kubernetes context,
        namespace and kind of job): what a job the web form sends through it is given by default; empty where the
        backend has one place only (Slurm: the cluster of this machine)."""

    def services(self) -> Services:
        """What the commands around a job (`dev`, `tensorboard --on-cluster`, `top`, `debug stacks`, `cancel` of a
        service) ask of this backend, on this scheduler's connection (hpctrain.schedulers.service_api)."""

    def render(self, job: Any) -> Rendered:
        """Pure: the same job gives the same text; raises UserError for what this scheduler cannot express."""

    def uses_gpus(self, job: Any) -> bool:
        """The job's processes get GPUs: whole ones (the JobSpec's count) or this scheduler's own kind of share."""

    def missing_prerequisites(self, job: Any) -> list[str]:
        """What the job's options need made once before the first submit (a container image file, a venv) and is
        not here yet: `local_check` reports them, and `submit --dry-run` only notes them."""

    def local_check(self, job: Any, recipe: Any = None, check_data: Callable[[Any], None] | None = None) -> list[str]:
        """What the submit host can tell about `job` without the cluster: paths, programs, a recipe's dataset.
        `recipe` is the TrainConfig of a built-in recipe's options (parsed by the caller, None for a command), and
        `check_data` the recipes' data check (hpctrain.recipes.check_data: a UserError unless the data `recipe` reads
        is there), which the backend calls on the paths as this machine sees them. Lines as for `check`;
        NOTE_PREFIX lines say what could not be checked here."""

    def check(self, job: Any) -> list[str]:
        """Ask the live cluster whether `job` can run; one line per problem, naming the fix. Lines starting with
        WARNING_PREFIX do not block a submission (see `blocking`)."""

    def summary(self, job: Any, rendered: Rendered) -> str:
        """One line for `check` when the job fits: what it asks for, in this scheduler's terms."""

    def submit(self, job: Any, rendered: Rendered) -> str:
        """Send `rendered` (from `render(job)`); returns the job id."""

    def record(self, job: Any, rendered: Rendered, job_id: str, description: dict[str, Any]) -> list[str]:
        """Keep what was submitted (rendered text, `description` as job.yaml) in the run directory where this
        machine sees it; the lines `submit` says about the new job (where it is recorded, how to follow it)."""

    def follow_note(self, job_id: str) -> str | None:
        """None when `logs(job_id, follow=True)` can follow a job just queued; else what `submit --follow` does
        instead (it waits like --wait)."""

    def status(self, job_id: str) -> JobStatus:
        """Raises JobNotFound when the scheduler does not know the job."""

    def progress(self, status: JobStatus) -> str:
        """The state as `submit --wait` says it (base.progress, or the scheduler's own words)."""

    def list_jobs(self, all_users: bool = False) -> list[JobSummary]:
        """The jobs the scheduler knows (the caller's; `all_users`: everyone's, where the scheduler tells them
        apart), from one fast listing, oldest first."""

    def logs(
        self,
        job_id: str,
        follow: bool = False,
        replica: str | None = None,
        stream: str = "stdout",
        say: Callable[[str], None] | None = None,
        ended: Callable[[], bool] | None = None,
    ) -> Iterator[str]:
        """Lines (without newline) of one replica's output (the first one, rank 0, when None); `stream` stderr where
        the scheduler keeps it apart. `say` hears what happens meanwhile (waiting for the output, the job ended).
        `ended`, when following: how the follower learns that the job has ended where it has to ask (a Slurm job's
        output file; a pod's log stream ends by itself); None: it asks the scheduler every few seconds. The web
        console passes its shared view of the job, asked once per interval for every page."""

    def access(self, job_id: str) -> JobAccess:
        """How to reach the job from beside it: its shell command and its logs (raises JobNotFound)."""

    def cancel(self, job_id: str) -> None:
        """Ask the job to stop: processes get SIGTERM and time to checkpoint."""

    def cluster(self) -> ClusterView: ...

    # What `hpctrain status`, `cluster`, `cancel` and `debug preempt` show: each scheduler's own view, as data
    # that the CLI formats (hpctrain.cli.views). `say` hears what happens meanwhile, as for `logs`.

    def status_view(self, job_id: str | None, all_users: bool = False) -> View:
        """Without a job: the jobs (yours, or everyone's with `all_users`); with one: that job in full."""

    def cluster_view(self, partition: str | None = None) -> View: ...

    def cancel_and_wait(
        self,
        job_id: str,
        wait_s: float,
        signal: str | None = None,
        full: bool = False,
        say: Callable[[str], None] | None = None,
    ) -> Outcome:
        """Cancel the job (or only send it `signal`) and wait up to `wait_s` to say what became of it."""

    def preempt(
        self,
        job_id: str,
        signal: str | None,
        steps: bool,
        follow: bool,
        timeout_s: float,
        say: Callable[[str], None] | None = None,
    ) -> Outcome:
        """Send a running job the warning its time limit would send, now (`hpctrain debug preempt`)."""


def blocking(problems: list[str]) -> list[str]:
    """The problems from `check` that must stop a submission (all but warnings and notes)."""
    return [p for p in problems if not p.startswith((WARNING_PREFIX, NOTE_PREFIX))]
