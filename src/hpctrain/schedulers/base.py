"""The scheduler interface: what every backend (Slurm, Kubernetes) offers, and the neutral data it returns.

Modelled on TorchX's scheduler split: `render` is pure (it gives `--dry-run` its text and never talks to the
cluster), `check` asks the live cluster whether the job can run, `submit` is thin (it sends what `render`
produced), and `status`/`list_jobs`/`logs`/`cancel`/`cluster` follow jobs after submission. Backends keep their
own options (a Slurm partition, a Kubernetes namespace) in the object a backend's `create()` returns; the
JobSpec is the scheduler-neutral part.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from hpctrain.errors import UserError

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

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES


@dataclass(frozen=True)
class JobSummary:
    job_id: str
    state: str
    created: str | None = None
    replicas: int = 0


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


class Scheduler(Protocol):
    """One backend. Job ids are the scheduler's own (a Slurm job id, a Kubernetes object name)."""

    name: str

    def render(self, job: Any) -> Rendered:
        """Pure: the same job gives the same text; raises UserError for what this scheduler cannot express."""

    def check(self, job: Any) -> list[str]:
        """Ask the live cluster whether `job` can run; one line per problem, naming the fix. Lines starting with
        WARNING_PREFIX do not block a submission (see `blocking`)."""

    def submit(self, job: Any, rendered: Rendered) -> str:
        """Send `rendered` (from `render(job)`); returns the job id."""

    def status(self, job_id: str) -> JobStatus: ...

    def list_jobs(self) -> list[JobSummary]: ...

    def logs(self, job_id: str, follow: bool = False, replica: str | None = None) -> Iterator[str]:
        """Lines (without newline) of one replica's output; the first replica (rank 0) when None."""

    def cancel(self, job_id: str) -> None:
        """Ask the job to stop: processes get SIGTERM and time to checkpoint."""

    def cluster(self) -> ClusterView: ...


def blocking(problems: list[str]) -> list[str]:
    """The problems from `check` that must stop a submission (all but warnings and notes)."""
    return [p for p in problems if not p.startswith((WARNING_PREFIX, NOTE_PREFIX))]
