"""What the Kubernetes backend shows and keeps for the CLI, as data: `hpctrain status` (the jobs of a namespace, or
one job with each replica's pod: phase, node, restarts, exit status, why it waits), `hpctrain cluster`
(allocatable against requested per node, quota use), each a View the CLI prints (hpctrain.cli.views: kubectl's
look, plain aligned columns); how a cancel unfolds (pods stopping, the object gone: said as it happens, then an
Outcome), and the record of a submission in the run directory. KubernetesScheduler's *_view, cancel_and_wait and
record methods call these.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hpctrain.distributed.hostlist import is_node_name
from hpctrain.fsutil import format_bytes
from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers.base import ClusterView, JobNotFound, JobStatus, JobSummary, Outcome, Rendered, Table, View
from hpctrain.stops import StopReason

SICK_NODE_LABEL = StopReason.SICK_NODE.label


RECORD_KEYS = ("job_id", "state", "created", "replicas")  # `status --json`'s keys of each job


def jobs_view(jobs: list[JobSummary], namespace: str, nodes: dict[str, str] | None = None) -> View:
    """The namespace's jobs; `nodes`: an elastic job's running worker pods against the range asked for ("1 of
    1:2"), in its REPLICAS cell and its record, by job name."""
    if not jobs:
        return View(records=[], parts=(f"no jobs in namespace {namespace}",), plain=True)
    nodes = nodes or {}

    def rows() -> list[tuple[str, ...]]:
        return [(j.job_id, j.state, nodes.get(j.job_id, str(j.replicas)), j.created or "") for j in jobs]

    def record(j: JobSummary) -> dict[str, Any]:
        fields = {k: getattr(j, k) for k in RECORD_KEYS}
        return {**fields, "nodes": nodes[j.job_id]} if j.job_id in nodes else fields

    return View(
        records=lambda: [record(j) for j in jobs],
        parts=lambda: (Table(("JOB", "STATE", "REPLICAS", "CREATED"), rows()),),
        plain=True,
    )


def job_view(status: JobStatus, run_dir: Path | None = None, lines: list[str] | None = None) -> View:
    """The job's state, `lines` (an elastic job's running workers against its range), then one row per replica
    (pod), then why it waits; with its run directory as this machine sees it, the elastic run's node counts and
    membership changes, each rank's live progress and how a hung attempt ended (hpctrain.health), as for Slurm."""
    exit_code = "" if status.exit_code is None else f", exit status {status.exit_code}"
    restarts = f", {status.restarts} restart(s)" if status.restarts else ""
    parts: list[Table | str] = [f"{status.job_id}: {status.state}{exit_code}{restarts}", *(lines or [])]
    if status.message:
        parts.append(f"message: {status.message}")
    if status.replicas:
        parts.append(
            Table(
                ("REPLICA", "PHASE", "NODE", "RESTARTS", "EXIT", "REASON"),
                [
                    (
                        r.name,
                        r.phase,
                        r.node or "-",
                        str(r.restarts),
                        "-" if r.exit_code is None else str(r.exit_code),
                        r.reason or "",
                    )
                    for r in status.replicas
                ],
            )
        )
    parts += [f"waiting: {reason}" for reason in status.pending_reasons]
    parts += ended_lines(status)
    if status.last_lines:
        parts += ["last lines of the failed replica(s):", *(f"  {line}" for line in status.last_lines)]
    extra: dict[str, Any] = {}
    if run_dir is not None:
        from hpctrain.health import read_progress
        from hpctrain.health.view import elastic_lines, hang_lines, rank_lines

        ranks = read_progress(run_dir)
        extra = {"run_dir": str(run_dir), "ranks": [asdict(r) for r in ranks]}
        parts += [f"run dir: {run_dir}", *elastic_lines(run_dir), *hang_lines(run_dir), *rank_lines(ranks, time.time())]
    return View(
        records={**asdict(status), "finished": status.finished, **extra},
        parts=tuple(parts),
        plain=True,
        ended=status.finished,
    )


def ended_lines(status: JobStatus) -> list[str]:
    """What the replicas said as they ended (their termination messages), one line each message; after a sick node
    found by the preflight, the submit flag that keeps the job off it (a pod restarts in place, on the same node).
    A termination message is the pod's to write: a "node" in it that is no node name is named as such, never put in
    the paste-ready command."""
    said: dict[str, list[str]] = {}
    for r in status.replicas:
        if r.message:
            said.setdefault(r.message.splitlines()[0][:300], []).append(r.name)
    lines = [f"ended: {', '.join(names)}: {message}" for message, names in said.items()]
    named = {node for message in said for node in _sick_nodes(message)}
    sick = sorted(node for node in named if is_node_name(node))
    if sick:
        command = shlex.join(["hpctrain", "submit", "--exclude-nodes", ",".join(sick)])
        lines.append(
            f"sick node(s) {', '.join(sick)}: pods restart in place, on the same nodes; submit again away "
            f"from them with `{command} ...` (and `train ... --resume` to continue from the newest checkpoint)"
        )
    for node in sorted(named - set(sick)):
        lines.append(f"warning: a replica named {node[:100]!r} as a sick node, which is not a node name; left out")
    return lines


def _sick_nodes(message: str) -> list[str]:
    kind, _, nodes = message.partition(":")
    return [n.strip() for n in nodes.split(",") if n.strip()] if kind.strip() == SICK_NODE_LABEL else []


def cluster_view(view: ClusterView) -> View:
    return View(records=lambda: asdict(view), parts=lambda: _cluster_parts(view), plain=True)


def _cluster_parts(view: ClusterView) -> tuple[Table | str, ...]:
    if not view.nodes:
        parts: list[Table | str] = [
            "no nodes: the cluster has no node registered, so no pod can run until one joins (a node registers "
            "when its kubelet starts); ask the cluster admin"
        ]
    else:
        parts = [
            Table(
                ("NODE", "CPU REQ/ALLOC", "MEMORY REQ/ALLOC", "GPU REQ/ALLOC", "SCHEDULABLE"),
                [
                    (
                        n.name,
                        f"{n.cpu_requested:g}/{n.cpu_allocatable:g}",
                        f"{format_bytes(n.memory_requested)}/{format_bytes(n.memory_allocatable)}",
                        f"{n.gpus_requested}/{n.gpus_allocatable}",
                        "yes" if n.schedulable else "no",
                    )
                    for n in view.nodes
                ],
            )
        ]
    parts += [f"quota: {line}" for line in view.quota]
    return tuple(parts)


def _pods(count: int) -> str:
    return f"{count} pod{'s' if count != 1 else ''}" if count else "no pods"


def cancel(sched: Any, job_id: str, wait_s: float, say: Callable[[str], None]) -> Outcome:
    """Delete the job, then say what happens while waiting: its pods stopping, then the object gone. A job still
    there when the wait runs out is reported as still terminating, with exit status 1. A job that has ended is
    deleted too: its object and pods remain (a failed PyTorchJob keeps them, a surviving master still running), and
    a new job of its name cannot be created until they are gone."""
    before = sched.status(job_id)
    sched.cancel(before.job_id)
    pods = len(before.replicas)
    running = sum(1 for p in before.replicas if p.phase in ("Running", "Pending"))
    wait = max(0.0, wait_s)
    if wait == 0:
        return Outcome(
            (
                f"job {before.job_id}: deletion requested ({_pods(pods)} stopping; see "
                f"`{sched.command('status', before.job_id)}`)",
            )
        )
    if before.finished:
        say(
            f"job {before.job_id} has ended ({before.state}); deleting its object"
            + (f" and its {_pods(pods)}" + (f" ({running} still running)" if running else "") if pods else "")
            + f"; waiting up to {wait:g} s"
        )
    else:
        say(
            f"deleting job {before.job_id} ({before.state}); "
            + (
                f"its {_pods(pods)} get SIGTERM and their grace period to checkpoint; waiting up to {wait:g} s"
                if pods
                else f"it has no pods; waiting up to {wait:g} s for the API server to remove it"
            )
        )
    deadline = time.monotonic() + wait
    left = pods
    while True:
        try:
            now = sched.status(before.job_id)
        except JobNotFound:
            gone = " (its pods are gone)" if pods else ""
            return Outcome((f"job {before.job_id}: {before.state} -> deleted{gone}",))
        if len(now.replicas) != left:
            left = len(now.replicas)
            say(f"{_pods(left)} still stopping" if left else "its pods are gone; waiting for the job object to go")
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if left:
        why = f"{_pods(left)} still stopping (within their grace period, or stuck on a node that does not answer)"
    else:
        why = (
            "it has no pods left, but the object remains: a foreground deletion ends when Kubernetes' garbage "
            "collector (part of kube-controller-manager) removes it; if that does not happen, ask the cluster admin"
        )
    return Outcome(
        (
            f"job {before.job_id}: still terminating after {wait:g} s: {why}; "
            f"`{sched.command('status', before.job_id)}` shows when it is gone",
        ),
        1,
    )


def record(sched: Any, job: JobSpec, rendered: Rendered, job_id: str, description: dict[str, Any]) -> list[str]:
    """Keep the manifest and the job description (job.yaml; resubmit with --job-file) in the run directory, where
    it is really visible here: a relative run dir (recorded in this directory), or one on a --volume whose path
    this machine sees too (a host: volume's host path). Never at a container path that does not exist here.
    Both files hold the --setenv values: readable by the owner only. Returns the lines `submit` says."""
    kind = rendered.payload["kind"] if isinstance(rendered.payload, dict) else "job"
    lines: list[str] = []  # a warning when the files could not be written
    where = _record_files(sched, job, rendered, description, kind, lines)
    old = getattr(sched, "replaced", None)
    if old is not None:
        lines.append(f"--replace: deleted the earlier {kind} {job_id} ({old.state}, {_pods(len(old.replicas))}) first")
    ref = (rendered.payload.get("spec") or {}).get("runtimeRef") or {} if isinstance(rendered.payload, dict) else {}
    if ref.get("kind") == "TrainingRuntime":  # --max-restarts: the job's own runtime (runtime.py), made before it
        lines.append(
            f"its restart budget is its own TrainingRuntime {ref['name']}, owned by the {kind}: cancelling or "
            "deleting the job removes it too"
        )
    return lines + [
        f"{kind} {job_id} created in namespace {sched.namespace}{where}",
        # the flags that find it again, whatever the defaults are later
        f"follow it with `{sched.command('status', job_id)}` (and logs, cancel)",
    ]


def _record_files(
    sched: Any, job: JobSpec, rendered: Rendered, description: dict[str, Any], kind: str, lines: list[str]
) -> str:
    import yaml

    from hpctrain.fsutil import write_atomic

    if job.run_dir is None:
        return ""
    pod_path = job.run_dir.replace("%j", job.name)
    if pod_path.startswith("/"):
        here, why = sched.path_here(pod_path)
        if here is None:
            return (
                f"; the manifest and job description were not recorded here ({why}): "
                f"`{sched.kubectl('get', kind.lower(), '-n', sched.namespace, job.name, '-o', 'yaml')}` shows them"
            )
        directory = Path(here)
    else:
        directory = Path(pod_path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_atomic(directory / rendered.filename, rendered.text.encode(), mode=0o600)
        write_atomic(directory / "job.yaml", yaml.safe_dump(description, sort_keys=False).encode(), mode=0o600)
    except OSError as err:
        lines.append(
            f"warning: could not record the manifest in {directory} ({err.strerror or err}); "
            "`kubectl get -o yaml` shows what was created"
        )
        return ""
    seen = f" (the pods' {pod_path})" if pod_path.startswith("/") and str(directory) != pod_path else ""
    return f"; manifest and job description in {directory}/{seen}"
