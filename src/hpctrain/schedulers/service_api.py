"""What each backend offers the commands around the job (`dev`, `tensorboard --on-cluster`, `top`, `debug stacks`,
`cancel` of a service), so that those commands never name a scheduler: they pick the backend as every job command
does (engine.scheduling), ask the Scheduler for its services (`get_scheduler(name).services()`), and format what these
return. What a backend shows (a tunnel or a port-forward, a job id or a pod) is its own: each backend's
services.py (schedulers/slurm/, schedulers/kubernetes/) implements Services on what hpctrain.servers holds.

No backend writes to the terminal: starting a service reports each Step as it happens to the caller's `on_step`,
and returns what the user needs (lines, or a ServiceAccess); the CLI prints them (cli.services), a web console
shows them its own way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from hpctrain.health import RankProgress
    from hpctrain.servers.common import Endpoint
    from hpctrain.servers.sessions import DevConfig, SaveOutcome, SessionView
    from hpctrain.servers.top import TopSample


@dataclass(frozen=True)
class Step:
    """One step of starting a service (`dev start`, `tensorboard --on-cluster`), reported as it happens."""

    kind: Literal["submitted", "state", "prompt"]
    """submitted: the job or pod exists and the wait for its server begins (`text` says which and how long);
    state: the job's new state (`text`: `PENDING (Resources)`, `RUNNING`); prompt: the server asks the user to act
    now (`text`: VS Code's device login)."""
    text: str
    job: str = ""
    """The job id or pod name."""


OnStep = Callable[[Step], None]


@dataclass(frozen=True)
class ServiceAccess:
    """How the user reaches a service that has started (`tensorboard --on-cluster`) and stops it; the CLI words it
    (cli.services.access_lines)."""

    service: str
    """What runs, as the user knows it: `TensorBoard`."""
    job: str
    """The Slurm job id, or the pod's name."""
    forward: str
    """The command to run on the user's machine that reaches it: an `ssh -N -L` tunnel through the login node, or
    `kubectl port-forward`."""
    url: str
    """What to open once `forward` runs."""
    stop: str
    """The command that stops it."""
    endpoint: Endpoint | None = None
    """Where it answered (node and port), where the backend waited for it to answer (Slurm)."""
    namespace: str | None = None
    """Kubernetes: the pod's namespace (the pod is created; its server may still be starting)."""


@dataclass(frozen=True)
class RemoteStacks:
    """The answers to a stacks request made inside a job: each answering rank's text, by rank, and the ranks the
    run's live records name (world size and where each runs), so that the silent ones can be named."""

    where: str  # e.g. "pod mnist-master-0"
    answers: dict[int, str]
    ranks: list[RankProgress]


@dataclass(frozen=True)
class Placement:
    """Where and with which software a service (a dev session, a cluster TensorBoard) runs: the flags `dev start`
    and `tensorboard --on-cluster` share. The neutral part is the image both backends run a service in; the rest is
    the backend's own options by argparse dest (only the flags given): Slurm's conda_env, venv, modules, mounts,
    partition, account, gpu_type, gres and login_host, Kubernetes' volumes and shm. Each backend reads its own and
    refuses the other's with the fix."""

    image: str | None = None
    """Slurm: an apptainer .sif or enroot .sqsh file; Kubernetes: the container image."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """The backend's own options (dest -> value), e.g. {"partition": "gpu"} or {"volumes": ("pvc:data:/data",)}."""


class Services(Protocol):
    """One backend's services. Built on the backend's Scheduler (its connection: a kubeconfig context, a namespace)."""

    name: str

    def dev_render(self, cfg: DevConfig, placement: Placement) -> str:
        """Pure: what `dev start --dry-run` prints (the batch script or the pod manifest)."""

    def dev_start(
        self, cfg: DevConfig, placement: Placement, wait_s: float, local_port: int | None, on_step: OnStep
    ) -> list[str]:
        """Start the session and wait until its server answers, telling `on_step` each step meanwhile; the lines
        that say how to reach it."""

    def dev_view(self, state_dir: Path, conn: dict[str, Any], probe: bool) -> SessionView:
        """A recorded session's row in `dev list`, with its live state."""

    def dev_stop(self, state_dir: Path, conn: dict[str, Any]) -> str:
        """Stop the session, free what it holds and forget its secrets; says what happened."""

    def dev_save(self, state_dir: Path, conn: dict[str, Any], image: str, dry_run: bool) -> SaveOutcome:
        """Save the running session's environment as the new image `image` where this cluster allows it (or, with
        `dry_run`, render what would run or be submitted); otherwise the exact steps to do it by hand. A bad image
        name, or a session that does not run, is a UserError naming the fix."""

    def tensorboard(
        self, run_dirs: list[str], time: str, placement: Placement, wait_s: float, port: int | None, on_step: OnStep
    ) -> ServiceAccess:
        """Start TensorBoard on the runs as a small CPU job or pod, telling `on_step` each step meanwhile; how to
        reach and stop it."""

    def top(self, job: str, find_run_dir: bool) -> TopSample:
        """Run the probe on each node (pod) of the running job; its run directory too when `find_run_dir`."""

    def stacks(self, job: str, wait_s: float) -> RemoteStacks:
        """`debug stacks` where the run directory is not visible here: ask the job's ranks for their stacks from
        inside the job (Kubernetes: through a pod's exec) and bring the answers back. A backend whose run
        directories this machine sees raises UserError (the caller reads them itself)."""

    def run_dir(self, job: str) -> Path | None:
        """The run directory of a job hpctrain submitted, as this machine sees it; None when the backend cannot
        tell (the caller asks for --run-dir)."""

    def stop(self, name: str) -> str | None:
        """`hpctrain cancel NAME` of a service that runs beside the scheduler's jobs rather than as one (on Kubernetes
        a dev or TensorBoard pod with its Secret): stop it and say so. None when `name` is no such service: the
        scheduler cancels it as a job."""
