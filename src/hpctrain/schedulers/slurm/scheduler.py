"""SlurmScheduler: hpctrain's scheduler interface (hpctrain.schedulers.base.Scheduler) over the Slurm modules.

Each method delegates: render -> script.render_sbatch, local_check -> local, check -> checks.check_cluster on
query.query_cluster, submit -> script.submit, status/list_jobs/cancel -> jobs, logs -> output, cluster -> query,
preempt -> preempt. Slurm's own records (JobInfo, ClusterInfo) map onto the neutral dataclasses here; `hpctrain
status` and `hpctrain cluster` show the Slurm records themselves (status_view/cluster_view -> display.py, which
makes them a View for the CLI to print), so their tables and JSON stay Slurm's.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.readback import open_regular
from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers import base
from hpctrain.schedulers.base import (
    ClusterView,
    JobStatus,
    JobSummary,
    NodeView,
    Outcome,
    Rendered,
    ReplicaStatus,
    View,
)
from hpctrain.schedulers.slurm.checks.live import Requirements, check_cluster, missing_tools, tool_problems
from hpctrain.schedulers.slurm.batch.environments import get_environment
from hpctrain.schedulers.slurm.commands import Runner, poll_until, run_bounded
from hpctrain.schedulers.slurm.grammar import mem_mb
from hpctrain.schedulers.slurm.batch.options import SlurmOptions, for_job, gres, uses_gpus
from hpctrain.schedulers.slurm.batch import script
from hpctrain.schedulers.slurm.queries import cluster_state, job_states, output
from hpctrain.schedulers.slurm.queries import display

SCRIPT_FILENAME = "job.sbatch"
DRY_RUN_NOTE = (
    "--dry-run skipped the checks that need the live cluster (partition, time limit, nodes and their "
    "GPUs, CPUs and memory); `hpctrain check` with the same options runs them"
)

_STATES = {
    "PENDING": base.PENDING,
    "CONFIGURING": base.PENDING,
    "RUNNING": base.RUNNING,
    "COMPLETING": base.RUNNING,
    "REQUEUED": base.RESTARTING,
    "REQUEUE_HOLD": base.RESTARTING,
    "REQUEUE_FED": base.RESTARTING,
    "EXPEDITING": base.RESTARTING,  # 25.11: an expedited requeue under way
    "RESV_DEL_HOLD": base.PENDING,  # held: its reservation was deleted
    "RESIZING": base.RUNNING,
    "SIGNALING": base.RUNNING,
    "STAGE_OUT": base.RUNNING,
    "SUSPENDED": base.SUSPENDED,
    "STOPPED": base.SUSPENDED,
    "COMPLETED": base.SUCCEEDED,
    "CANCELLED": base.CANCELLED,
    "FAILED": base.FAILED,
    "TIMEOUT": base.FAILED,
    "NODE_FAIL": base.FAILED,
    "PREEMPTED": base.FAILED,
    "OUT_OF_MEMORY": base.FAILED,
    "BOOT_FAIL": base.FAILED,
    "DEADLINE": base.FAILED,
    "REVOKED": base.FAILED,
    "SPECIAL_EXIT": base.FAILED,
}


def neutral_state(slurm_state: str) -> str:
    """A state this table does not know (a newer Slurm's) is UNKNOWN here; Slurm's own word is shown as it is by
    `hpctrain status`."""
    return _STATES.get(slurm_state, base.UNKNOWN)


def job_paths(job: JobSpec, options: SlurmOptions) -> list[str]:
    """Paths the job will read, for the checks: the user's script. (Container images and venvs are checked by
    local_problems, a recipe's dataset by `hpctrain submit`'s local check, each with a message of its own.)"""
    paths: list[str] = []
    in_image = options.environment.kind in ("apptainer", "pyxis")  # paths in an image: not visible here
    if not job.is_recipe and not in_image:
        argv = list(job.command)
        if argv and Path(argv[0]).name.startswith("python") and len(argv) > 1 and argv[1].endswith(".py"):
            paths.append(argv[1])
        elif "/" in argv[0]:
            paths.append(argv[0])
    return paths


def requirements(job: JobSpec, options: SlurmOptions) -> Requirements:
    r = job.resources
    return Requirements(
        partition=options.partition,
        nodes=r.nodes,
        tasks_per_node=r.nproc_per_node,
        cpus_per_task=r.cpus_per_task,
        gpus_per_node=r.gpus_per_node,
        gpu_type=options.gpu_type,
        shards_per_node=options.shards_per_node,
        mem_mb_per_node=mem_mb(r.mem_bytes) if r.mem_bytes else None,  # --mem 0 asks for whatever each node has
        time_limit_s=job.time_limit_s,
        paths=tuple(job_paths(job, options)),
    )


def job_status(info: job_states.JobInfo) -> JobStatus:
    """A Slurm job record as the neutral JobStatus (one replica per allocated node list)."""
    state = neutral_state(info.state)
    replicas = ()
    if info.nodes:
        phase = {base.RUNNING: "Running", base.SUCCEEDED: "Succeeded", base.FAILED: "Failed"}.get(state, "Unknown")
        replicas = (
            ReplicaStatus(
                name=info.nodes, phase=phase, node=info.nodes, restarts=info.restarts, exit_code=info.exit_code
            ),
        )
    waiting = info.pending and info.reason and info.reason != "None"
    return JobStatus(
        job_id=info.job_id,
        state=state,
        exit_code=info.exit_code,
        restarts=info.restarts,
        replicas=replicas,
        pending_reasons=(info.reason,) if waiting else (),
        message=info.reason,
        label=info.state,
    )


def _not_found(job_id: str) -> base.JobNotFound:
    return base.JobNotFound(f"job {job_id} not found: it ended a while ago or the id is wrong (see `hpctrain status`)")


class SlurmScheduler:
    name = "slurm"
    dry_run_note = DRY_RUN_NOTE

    def __init__(self, options: SlurmOptions | None = None, run: Runner = run_bounded) -> None:
        self.options = SlurmOptions() if options is None else options
        """This backend's options of the jobs it renders and submits (a partition, the launcher, ...)."""
        self.run = run

    def connection(self) -> dict[str, str]:
        return {}  # the cluster this machine's sbatch reaches

    def services(self) -> Any:
        """What `dev`, `tensorboard --on-cluster`, `top` and `debug stacks` ask of Slurm (schedulers.services)."""
        from hpctrain.schedulers.slurm.services.service_jobs import SlurmServices

        return SlurmServices(self)

    def render(self, job: JobSpec) -> Rendered:
        text = script.render_sbatch(job, self.options)
        return Rendered(text=text, filename=SCRIPT_FILENAME, preview=script.dry_run_text(job, text))

    def uses_gpus(self, job: JobSpec) -> bool:
        return uses_gpus(job, self.options)

    def missing_prerequisites(self, job: JobSpec) -> list[str]:
        from hpctrain.schedulers.slurm.checks.login_node import missing_prerequisites

        return missing_prerequisites(self.options)

    def local_check(
        self, job: JobSpec, recipe: Any = None, check_data: Callable[[Any], None] | None = None
    ) -> list[str]:
        from hpctrain.schedulers.slurm.checks.login_node import local_check

        return local_check(job, self.options, requirements(job, self.options), recipe, check_data=check_data)

    def check(self, job: JobSpec) -> list[str]:
        from hpctrain.schedulers.slurm.queries.run_dir import fixed_run_dir, holder_problem

        cluster = cluster_state.query_cluster(run=self.run, shard_use=False)
        problems = check_cluster(requirements(job, self.options), cluster)
        env = dict(os.environ) | dict(job.env)
        tools = missing_tools(get_environment(self.options.environment).tools(), env)
        problems += tool_problems(tools, cluster, self.options.partition)
        directory = fixed_run_dir(job)
        held = holder_problem(directory, self._active_state) if directory is not None else None
        return problems + ([held] if held else [])

    def _active_state(self, job_id: str) -> str | None:
        """The job's Slurm state while it is queued or running; None once it ended or Slurm forgot it."""
        info = job_states.get_job(job_id, run=self.run)
        return info.state if info is not None and not info.finished else None

    def summary(self, job: JobSpec, rendered: Rendered) -> str:
        r, launcher = job.resources, for_job(self.options, job).launcher
        return (
            f"{job.name}: {r.nodes} node(s) x {r.nproc_per_node} process(es), launcher {launcher}"
            + (f", partition {self.options.partition}" if self.options.partition else "")
            + (f", gres {gres(job, self.options)}" if gres(job, self.options) else "")
            + (f", time {job.time}" if job.time else "")
        )

    def submit(self, job: JobSpec, rendered: Rendered) -> str:
        """sbatch; into a run directory without %j only while no active job holds it (refused before queueing)."""
        from hpctrain.schedulers.slurm.queries.run_dir import holding

        with holding(job, self._active_state) as hold:
            job_id = script.submit(job, rendered.text, run=self.run)
            hold(job_id)
        return job_id

    def record(self, job: JobSpec, rendered: Rendered, job_id: str, description: dict[str, Any]) -> list[str]:
        """The script (job.sbatch) and job.yaml beside the run's results (provenance; resubmit with --job-file):
        the run directory is on the file system the nodes share."""
        if not job.run_dir:
            return [f"job {job_id} queued"]
        import yaml

        from hpctrain.fsutil import write_atomic

        run_dir = Path(job.run_dir.replace("%j", job_id))
        run_dir.mkdir(parents=True, exist_ok=True)
        script.write_script(run_dir / rendered.filename, rendered.text)
        write_atomic(
            run_dir / "job.yaml", yaml.safe_dump(description, sort_keys=False).encode(), mode=0o600
        )  # --setenv values
        return [f"job {job_id} queued; script and job description in {run_dir}/"]

    def follow_note(self, job_id: str) -> str | None:
        return None  # the output file is followed from the first attempt on, even before it exists

    def _info(self, job_id: str) -> job_states.JobInfo:
        info = job_states.get_job(job_id, run=self.run)
        if info is None:
            raise _not_found(job_id)
        return info

    def status(self, job_id: str) -> JobStatus:
        return job_status(self._info(job_id))

    def access(self, job_id: str) -> base.JobAccess:
        """A step beside the job's own (`--overlap`: it shares the allocation's CPUs); one output file for all its
        nodes, its stderr apart where the job has an --error file of its own."""
        import shlex

        info = self._info(job_states.check_job_id(job_id))
        streams = ("stdout", "stderr") if info.stderr and info.stderr != info.stdout else ("stdout",)
        return base.JobAccess(shlex.join(["srun", "--jobid", info.job_id, "--overlap", "--pty", "bash"]), (), streams)

    def progress(self, status: JobStatus) -> str:
        """Slurm's own state word, why it waits, and which attempt this is (a requeue starts the next)."""
        why = f" ({status.message})" if status.pending_reasons and status.message else ""
        again = f", attempt {status.restarts + 1}" if status.restarts else ""
        return f"{status.shown_state}{why}{again}"

    def list_jobs(self, all_users: bool = False) -> list[JobSummary]:
        """squeue of the summary's fields only (queries.job_summaries)."""
        from hpctrain.schedulers.slurm.queries.job_summaries import list_summaries

        return list_summaries(neutral_state, all_users=all_users, run=self.run)

    def logs(
        self,
        job_id: str,
        follow: bool = False,
        replica: str | None = None,
        stream: str = "stdout",
        say: Callable[[str], None] | None = None,
        ended: Callable[[], bool] | None = None,
    ) -> Iterator[str]:
        """The job's output file (stream stderr: its --error file), found where the controller or the submission
        record says it is; followed until the job ends (`ended`, or squeue every few seconds), even before the file
        exists."""
        if replica is not None:
            raise UserError("a Slurm job writes one output file for all its nodes: drop --replica")
        say = say or (lambda line: None)
        job_id = job_states.check_job_id(job_id)
        info = job_states.get_job(job_id, run=self.run)
        candidates = output.output_candidates(job_id, info, stream)
        path = next((p for p in candidates if p.is_file()), None)
        if stream == "stderr" and info is not None and info.stderr and info.stderr == info.stdout:
            say(f"job {job_id} writes stderr to the same file as stdout")
        if follow and info is not None and not info.finished:
            target = path or candidates[0]
            if path is None:
                say(f"waiting for {target} (job {job_id} is {info.state})")
            return self._follow(job_id, target, say, ended)
        if path is None:
            where = ", ".join(str(p) for p in candidates)
            if info is not None and not info.finished:
                raise UserError(
                    f"job {job_id} is {info.state} and has written no output yet ({where}); use -f to wait for it"
                )
            raise UserError(
                f"no output file for job {job_id} (looked at {where}); run this in the directory you "
                "submitted from, or pass the job's --output path to `cat`"
            )
        if follow and info is not None:  # it ended before we looked: the file, and how it ended, as when followed
            return self._ended(job_id, _file_lines(path), say)
        return _file_lines(path)

    def _ended(self, job_id: str, lines: Iterator[str], say: Callable[[str], None]) -> Iterator[str]:
        yield from lines
        last = job_states.get_job(job_id, run=self.run)
        say(f"job {job_id} ended: {last.state if last is not None else 'gone'}")

    def _follow(
        self, job_id: str, target: Path, say: Callable[[str], None], ended: Callable[[], bool] | None
    ) -> Iterator[str]:
        def asked() -> bool:
            now = job_states.get_job(job_id, run=self.run)
            return now is None or now.finished

        yield from self._ended(job_id, _follow_lines(target, ended or asked), say)

    def cancel(self, job_id: str) -> None:
        job_states.cancel(job_id, run=self.run)

    def status_view(self, job_id: str | None, all_users: bool = False) -> View:
        """Without a job: your jobs that the controller knows (squeue); with one: that job in full (squeue, or
        sacct where the cluster keeps accounting), with its exit status and output files."""

        if job_id is None:
            from hpctrain.schedulers.slurm.queries import job_table

            return display.job_list_view(
                lambda: job_states.list_jobs(all_users=all_users, run=self.run),
                lambda: job_table.list_columns(all_users=all_users, run=self.run),
            )
        info = job_states.get_job(job_id, run=self.run)
        if info is None:
            raise display.not_found(job_id)
        from hpctrain.schedulers.slurm.queries.run_dir import run_dir_of

        return display.job_view(info, run_dir_of(info.job_id, info.work_dir))

    def cluster_view(self, partition: str | None = None) -> View:

        return display.cluster_view(cluster_state.query_cluster(run=self.run), partition)

    def cancel_and_wait(
        self,
        job_id: str,
        wait_s: float,
        signal: str | None = None,
        full: bool = False,
        say: Callable[[str], None] | None = None,
    ) -> Outcome:
        """scancel: SIGTERM to the job's processes (hpctrain's loop checkpoints), SIGKILL after KillWait; with
        `signal`, only that signal (to the batch shell too with `full`). Waits up to `wait_s` to say the outcome."""
        before = job_states.get_job(job_id, run=self.run)
        if before is None:
            raise _not_found(job_id)
        if before.finished:
            return Outcome((f"job {before.job_id} already ended ({before.state}); nothing to cancel",))
        job_states.cancel(before.job_id, signal=signal, full=full, run=self.run)
        if signal:
            target = "its steps and batch shell" if full else "its steps"
            return Outcome((f"sent {signal.upper()} to job {before.job_id} ({target}; it was {before.state})",))
        after, _ = poll_until(
            lambda: job_states.get_job(before.job_id, run=self.run),
            lambda info: info is None or info.finished,
            timeout_s=wait_s,
            poll_s=0.5,
        )
        if after is None:
            return Outcome((f"job {before.job_id}: {before.state} -> ended (Slurm no longer lists it)",))
        if after.finished:
            return Outcome((f"job {before.job_id}: {before.state} -> {after.state}",))
        return Outcome(
            (f"job {before.job_id}: cancel requested; it is {after.state} (Slurm is stopping its processes)",)
        )

    def preempt(
        self,
        job_id: str,
        signal: str | None = None,
        steps: bool = False,
        follow: bool = False,
        timeout_s: float = 600.0,
        say: Callable[[str], None] | None = None,
    ) -> Outcome:
        from hpctrain.schedulers.slurm.services.preempt import preempt

        return preempt(job_id, signal=signal, steps=steps, follow=follow, timeout_s=timeout_s, say=say)

    def cluster(self) -> ClusterView:
        info = cluster_state.query_cluster(run=self.run, shard_use=False)  # the neutral view has no shards
        return ClusterView(
            nodes=tuple(
                NodeView(
                    name=n.name,
                    cpu_allocatable=float(n.cpus_total),
                    cpu_requested=float(n.cpus_alloc),
                    memory_allocatable=n.mem_mb_total * 2**20,
                    memory_requested=n.mem_mb_alloc * 2**20,
                    gpus_allocatable=n.gpus_total,
                    gpus_requested=n.gpus_used,
                    schedulable=n.usable,
                )
                for n in info.nodes
            )
        )


def _file_lines(path: Path) -> Iterator[str]:
    with os.fdopen(open_regular(path), encoding="utf-8", errors="replace") as handle:  # no link, FIFO or device
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
