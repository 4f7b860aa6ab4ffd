"""SlurmScheduler: hpctrain's scheduler interface (hpctrain.schedulers.base.Scheduler) over the Slurm modules.

Each method delegates: render -> render.render_sbatch, check -> checks.check_cluster on query.query_cluster,
submit -> render.submit, status/list_jobs/cancel -> jobs, logs -> output, cluster -> query. Slurm's own records
(JobInfo, ClusterInfo) map onto the neutral dataclasses here; `hpctrain status` and `hpctrain cluster` print the
Slurm records themselves (display.py), so their tables and JSON stay Slurm's.
"""

from __future__ import annotations

import queue
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

from hpctrain.errors import UserError
from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers import base
from hpctrain.schedulers.base import ClusterView, JobStatus, JobSummary, NodeView, Rendered, ReplicaStatus
from hpctrain.schedulers.slurm import jobs, output, query, render
from hpctrain.schedulers.slurm.checks import Requirements, check_cluster
from hpctrain.schedulers.slurm.commands import Runner

SCRIPT_FILENAME = "job.sbatch"

_STATES = {
    "PENDING": base.PENDING, "CONFIGURING": base.PENDING, "RUNNING": base.RUNNING, "COMPLETING": base.RUNNING,
    "REQUEUED": base.RESTARTING, "REQUEUE_HOLD": base.RESTARTING, "REQUEUE_FED": base.RESTARTING,
    "EXPEDITING": base.RESTARTING,  # 25.11: an expedited requeue under way
    "RESV_DEL_HOLD": base.PENDING,  # held: its reservation was deleted
    "RESIZING": base.RUNNING, "SIGNALING": base.RUNNING, "STAGE_OUT": base.RUNNING,
    "SUSPENDED": base.SUSPENDED, "STOPPED": base.SUSPENDED,
    "COMPLETED": base.SUCCEEDED, "CANCELLED": base.CANCELLED,
    "FAILED": base.FAILED, "TIMEOUT": base.FAILED, "NODE_FAIL": base.FAILED, "PREEMPTED": base.FAILED,
    "OUT_OF_MEMORY": base.FAILED, "BOOT_FAIL": base.FAILED, "DEADLINE": base.FAILED, "REVOKED": base.FAILED,
    "SPECIAL_EXIT": base.FAILED,
}


def neutral_state(slurm_state: str) -> str:
    """A state this table does not know (a newer Slurm's) is UNKNOWN here; Slurm's own word is shown as it is by
    `hpctrain status`."""
    return _STATES.get(slurm_state, base.UNKNOWN)


def job_paths(job: JobSpec) -> list[str]:
    """Paths the job will read, for the checks: the user's script. (Container images and venvs are checked by
    local_problems, a recipe's dataset by `hpctrain submit`'s local check, each with a message of its own.)"""
    paths: list[str] = []
    if not job.is_recipe and job.environment.kind not in ("apptainer", "pyxis"):  # paths in an image: not visible here
        argv = list(job.command)
        if argv and Path(argv[0]).name.startswith("python") and len(argv) > 1 and argv[1].endswith(".py"):
            paths.append(argv[1])
        elif "/" in argv[0]:
            paths.append(argv[0])
    return paths


def requirements(job: JobSpec) -> Requirements:
    r = job.resources
    return Requirements(
        partition=job.partition,
        nodes=r.nodes,
        tasks_per_node=r.nproc_per_node,
        cpus_per_task=r.cpus_per_task,
        gpus_per_node=r.gpus_per_node,
        gpu_type=r.gpu_type,
        shards_per_node=r.shards_per_node,
        mem_mb_per_node=r.mem_mb or None,  # --mem 0 asks for whatever each node has
        time_limit_s=job.time_limit_s,
        paths=tuple(job_paths(job)),
    )


def job_status(info: jobs.JobInfo) -> JobStatus:
    """A Slurm job record as the neutral JobStatus (one replica per allocated node list)."""
    state = neutral_state(info.state)
    replicas = ()
    if info.nodes:
        phase = {base.RUNNING: "Running", base.SUCCEEDED: "Succeeded", base.FAILED: "Failed"}.get(state, "Unknown")
        replicas = (ReplicaStatus(name=info.nodes, phase=phase, node=info.nodes, restarts=info.restarts,
                                  exit_code=info.exit_code),)
    waiting = info.pending and info.reason and info.reason != "None"
    return JobStatus(job_id=info.job_id, state=state, exit_code=info.exit_code, restarts=info.restarts,
                     replicas=replicas, pending_reasons=(info.reason,) if waiting else (), message=info.reason)


class SlurmScheduler:
    name = "slurm"

    def __init__(self, run: Runner = subprocess.run) -> None:
        self.run = run

    def render(self, job: JobSpec) -> Rendered:
        return Rendered(text=render.render_sbatch(job), filename=SCRIPT_FILENAME)

    def check(self, job: JobSpec) -> list[str]:
        return check_cluster(requirements(job), query.query_cluster(run=self.run))

    def submit(self, job: JobSpec, rendered: Rendered) -> str:
        return render.submit(job, rendered.text, run=self.run)

    def _info(self, job_id: str) -> jobs.JobInfo:
        info = jobs.get_job(job_id, run=self.run)
        if info is None:
            raise UserError(f"job {job_id} not found: it ended a while ago or the id is wrong (see `hpctrain status`)")
        return info

    def status(self, job_id: str) -> JobStatus:
        return job_status(self._info(job_id))

    def list_jobs(self) -> list[JobSummary]:
        return [JobSummary(j.job_id, neutral_state(j.state), j.submit_time, j.num_nodes or 0)
                for j in jobs.list_jobs(run=self.run)]

    def logs(self, job_id: str, follow: bool = False, replica: str | None = None) -> Iterator[str]:
        if replica is not None:
            raise UserError("a Slurm job writes one output file for all its nodes: drop --replica")
        job_id = jobs.check_job_id(job_id)
        info = jobs.get_job(job_id, run=self.run)
        candidates = output.output_candidates(job_id, info)
        path = next((p for p in candidates if p.is_file()), None)
        if follow and info is not None and not info.finished:
            return _follow_lines(path or candidates[0], lambda: (now := jobs.get_job(job_id, run=self.run)) is None or now.finished)
        if path is None:
            raise UserError(f"no output file for job {job_id} (looked at {', '.join(str(p) for p in candidates)})")
        return _file_lines(path)

    def cancel(self, job_id: str) -> None:
        jobs.cancel(job_id, run=self.run)

    def cluster(self) -> ClusterView:
        info = query.query_cluster(run=self.run)
        return ClusterView(nodes=tuple(
            NodeView(name=n.name, cpu_allocatable=float(n.cpus_total), cpu_requested=float(n.cpus_alloc),
                     memory_allocatable=n.mem_mb_total * 2**20, memory_requested=n.mem_mb_alloc * 2**20,
                     gpus_allocatable=n.gpus_total, gpus_requested=n.gpus_used, schedulable=n.usable)
            for n in info.nodes))


def _file_lines(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            yield line.rstrip("\n")


def _follow_lines(path: Path, finished) -> Iterator[str]:
    """output.follow (which writes chunks to a callback) as a generator of lines."""
    chunks: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        try:
            output.follow(path, chunks.put, finished)
        finally:
            chunks.put(None)

    threading.Thread(target=pump, daemon=True).start()
    buffer = ""
    while (chunk := chunks.get()) is not None:
        *complete, buffer = (buffer + chunk).split("\n")
        yield from complete
    if buffer:
        yield buffer
