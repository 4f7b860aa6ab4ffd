"""Jobs on the cluster: what state they are in, where their output goes, waiting for them, cancelling them.

Sources, best first: `squeue` (one job or the list, while the controller remembers it: a few minutes after it ends,
MinJobAge), and `sacct` only when the cluster keeps accounting (without slurmdbd it fails with "accounting storage is
disabled"). Both are read with a separator drawn at random for each query (records.Fields, sacct's --delimiter), so
that no job name, path or comment can move a field or make a job; `scontrol show job`'s `Key=value` record is not
read for jobs (a value holding ` Key=` or a line end would be taken for fields).
"""

from __future__ import annotations

import functools
import getpass
import os
import re
import subprocess
from dataclasses import dataclass, fields
from typing import Any

from hpctrain.schedulers.slurm.commands import (
    Runner,
    SlurmUnavailable,
    command_error,
    run_bounded,
    slurm,
)
from hpctrain.schedulers.slurm.queries.records import NULLS, expand_pattern, null, parse_int, printed_duration
from hpctrain.errors import UserError
from hpctrain.schedulers.slurm.queries import records

# States after which a job never runs again (a requeued job goes back to PENDING instead).
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
        "SPECIAL_EXIT",
    }
)
GONE = "GONE"  # our marker: the controller forgot the job and there is no accounting to ask
_JOB_ID_RE = re.compile(r"^\d+(?:_\d+)?(?:\+\d+)?$")
_SIGNAL_RE = re.compile(r"^(?:SIG)?[A-Z][A-Z0-9+-]*$|^\d{1,2}$")


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ took 3 times as long (100,000 jobs: 0.3 s)
class JobInfo:
    job_id: str
    name: str
    state: str  # Slurm's state word (RUNNING, PENDING, COMPLETED, ...), or GONE
    reason: str | None = None  # why it is pending (Resources, Priority, BeginTime, ...)
    nodes: str | None = None  # hostlist (node[1-2])
    num_nodes: int | None = None  # allocated; a pending job's minimum
    max_nodes: int | None = None  # a pending job's maximum (a node range); once it runs, the allocated count too
    elapsed_s: int | None = None
    restarts: int = 0
    exit_code: int | None = None  # the job's exit status; 128+N when killed by signal N; None if not ended
    partition: str | None = None
    user: str | None = None
    stdout: str | None = None
    stderr: str | None = None
    work_dir: str | None = None
    submit_time: str | None = None
    start_time: str | None = None
    end_time: str | None = None
    time_limit_s: int | None = None
    source: str = "scontrol"  # where this came from: scontrol, squeue, sacct, none

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES or self.state == GONE

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"

    def to_dict(self) -> dict[str, Any]:
        # Its values are plain already: a shallow copy (asdict deep-copies each, 100,000 jobs for --all-users).
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "finished": self.finished}


def check_job_id(job_id: str) -> str:
    job_id = str(job_id).strip()
    if not _JOB_ID_RE.match(job_id):
        raise UserError(f"{job_id!r} is not a Slurm job id: give the number that submit printed (e.g. 1234 or 1234_7)")
    return job_id


def parse_exit_code(text: str | None) -> int | None:
    """`2:0` (status 2) and `0:9` (killed by signal 9 -> 137) as scontrol and sacct print them."""
    value = null(text)
    if value is None:
        return None
    status, _, sig = value.partition(":")
    try:
        status_n, sig_n = int(status), int(sig or 0)
    except ValueError:
        return None
    return status_n if status_n or not sig_n else 128 + sig_n


@functools.lru_cache(maxsize=256)  # a few dozen state texts in any list
def state_word(text: str | None) -> str:
    """Slurm's state word as it is, upper case: sacct says `CANCELLED by 0` where squeue and scontrol say CANCELLED,
    and a column too narrow ends it with `+` (`CANCELLED+`). A state this module does not know (each Slurm release
    may add one: RESV_DEL_HOLD in 20.11's list, EXPEDITING in 25.11) is kept as printed, never an error."""
    words = (text or "").split()
    return (words[0].upper().rstrip("+") or "UNKNOWN") if words else "UNKNOWN"


# squeue -O fields of the job list (records.Fields: the free-text ones, Name, Reason and WorkDir, read so that
# nothing in them can move a field or make a job).
SQUEUE_FIELDS = (
    "JobID",
    "Name",
    "State",
    "Reason",
    "NumNodes",
    "MaxNodes",
    "NodeList",
    "TimeUsed",
    "RestartCnt",
    "Partition",
    "UserName",
    "SubmitTime",
    "StartTime",
    "TimeLimit",
    "WorkDir",
)
# One job in full (`status JOB`, cancel, logs, waiting): the list's fields and how it ended and where its output goes.
# squeue prints STDOUT/STDERR as the job gave them (`/home/a/out-%j.txt`: sbatch made it absolute), or, when none
# was given, `WORKDIR/slurm-JOB.out` (_print_job_std_out in src/squeue/print.c): the patterns are expanded here as
# sbatch does (records.expand_pattern).
JOB_FIELDS = (*SQUEUE_FIELDS, "EndTime", "exit_code", "STDOUT", "STDERR")


def squeue_argv(user: str | None, job_ids: tuple[str, ...] = (), fields: records.Fields | None = None) -> list[str]:
    fields = fields or records.Fields(SQUEUE_FIELDS)
    argv = ["squeue", "--noheader", "--states=all", fields.squeue_option()]
    if user:
        argv.append(f"--user={user}")
    if job_ids:
        argv.append("--jobs=" + ",".join(job_ids))
    return argv


def parse_squeue(text: str, fields: records.Fields) -> list[JobInfo]:
    """Output of squeue_argv(..., fields) for SQUEUE_FIELDS (the list: no output paths asked for) or JOB_FIELDS."""
    columns = dict(zip(fields.names, fields.columns(text)))
    listed = [
        JobInfo(
            job_id=job_id,
            name=name,
            state=state_word(state),
            reason=None if reason in NULLS else reason,  # (null()'s test inline: 100,000 jobs)
            nodes=None if nodes in NULLS else nodes,
            num_nodes=int(num_nodes) or None if num_nodes.isdigit() else None,
            max_nodes=int(max_nodes) or None if max_nodes.isdigit() else None,
            elapsed_s=duration_or_none(used),
            restarts=int(restarts) if restarts.isdigit() else 0,
            partition=None if partition in NULLS else partition,
            user=None if user in NULLS else user,
            work_dir=None if work_dir in NULLS else work_dir,
            submit_time=None if submit in NULLS else submit,
            start_time=None if start in NULLS else start,
            time_limit_s=duration_or_none(limit),
            source="squeue",
        )
        for (
            job_id,
            name,
            state,
            reason,
            num_nodes,
            max_nodes,
            nodes,
            used,
            restarts,
            partition,
            user,
            submit,
            start,
            limit,
            work_dir,
        ) in zip(*(columns[f] for f in SQUEUE_FIELDS))  # the order of SQUEUE_FIELDS
    ]
    if "STDOUT" in columns:  # JOB_FIELDS: how each ended, where its output goes
        for job, end, status, stdout, stderr in zip(listed, *(columns[f] for f in JOB_FIELDS[len(SQUEUE_FIELDS) :])):
            job.end_time = None if end in NULLS or not job.finished else end
            job.exit_code = wait_status(status) if job.finished else None
            job.stdout = None if stdout in NULLS else expand_pattern(stdout, job.job_id, job.name, job.user)
            job.stderr = None if stderr in NULLS else expand_pattern(stderr, job.job_id, job.name, job.user)
            job.stderr = job.stderr or job.stdout  # 25.11 leaves it empty when it goes to StdOut
    return listed


def wait_status(text: str) -> int | None:
    """squeue's exit_code, the job's wait status as waitpid() gives it (_print_job_exit_code in src/squeue/print.c
    prints job->exit_code, 20.11 to 25.11: 768 exited 3, 9 killed by signal 9) -> 3, 137."""
    try:
        status = int(text)
    except ValueError:
        return None
    if not 0 <= status < 1 << 16:
        return None
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


@functools.lru_cache(maxsize=8192)  # squeue repeats time limits and many elapsed times across 100,000 jobs
def duration_or_none(text: str | None) -> int | None:
    try:
        return printed_duration(text)
    except ValueError:
        return None


SACCT_FIELDS = (
    "JobIDRaw",
    "JobName",
    "State",
    "Reason",
    "NodeList",
    "NNodes",
    "ElapsedRaw",
    "ExitCode",
    "Partition",
    "User",
    "Submit",
    "WorkDir",
    "Start",
    "End",  # last: a time, no line end in it (sacct_argv)
)


def sacct_argv(job_id: str, token: str) -> list[str]:
    """sacct for one job, its fields separated by `token` (records.new_token(): random, so a job name cannot hold
    it); the first and last fields (the job id, the end time) hold no line end, so a job's record ends at the first
    line end after its last separator."""
    return [
        "sacct",
        "--noheader",
        "--parsable2",
        f"--delimiter={token}",
        "--allocations",
        f"--jobs={job_id}",
        "--format=" + ",".join(SACCT_FIELDS),
    ]


def parse_sacct(text: str, token: str) -> list[JobInfo]:
    """Output of sacct_argv(JOB, token): the text splits at the token into (jobs) x (fields - 1) + 1 pieces, the
    piece between two jobs being `END<line end>JOBID`."""
    n = len(SACCT_FIELDS)
    pieces = text.rstrip("\n").split(token) if text.strip() else []
    if len(pieces) % (n - 1) != 1 and pieces:
        raise records.UnsplittableOutput("sacct")
    flat: list[str] = []
    for i, piece in enumerate(pieces):
        if i and i % (n - 1) == 0 and i < len(pieces) - 1:
            end, sep, first = piece.partition("\n")
            if not sep:
                raise records.UnsplittableOutput("sacct")
            flat += [end, first]
        else:
            flat.append(piece)
    jobs = []
    for start in range(0, len(flat), n):
        f = dict(zip(SACCT_FIELDS, flat[start : start + n]))
        state = state_word(f["State"])
        jobs.append(
            JobInfo(
                job_id=f["JobIDRaw"].strip(),
                name=f["JobName"],
                state=state,
                reason=null(f["Reason"]) if f["Reason"] != "None" else None,
                nodes=null(f["NodeList"]) if f["NodeList"] != "None assigned" else None,
                num_nodes=parse_int(f["NNodes"], 0) or None,
                elapsed_s=parse_int(f["ElapsedRaw"], 0),
                exit_code=parse_exit_code(f["ExitCode"]) if state in TERMINAL_STATES else None,
                partition=null(f["Partition"]),
                user=null(f["User"]),
                work_dir=null(f["WorkDir"]),
                submit_time=null(f["Submit"]),
                start_time=null(f["Start"]) if f["Start"] != "Unknown" else None,
                end_time=null(f["End"]) if f["End"] != "Unknown" else None,
                source="sacct",
            )
        )
    return jobs


def _forgotten(result: subprocess.CompletedProcess[str]) -> bool:
    return "invalid job id" in (result.stderr or "").lower()


def _from_accounting(job_id: str, run: Runner) -> JobInfo | None:
    """The job from sacct, or None when there is no accounting or it does not know the job."""
    token = records.new_token()
    try:
        result = slurm(sacct_argv(job_id, token), run=run, check=False)
    except SlurmUnavailable:
        raise  # slurmdbd did not answer: say so, rather than that the job is unknown
    except UserError:
        return None  # no sacct binary
    if result.returncode != 0:
        return None  # "Slurm accounting storage is disabled", or slurmdbd down
    found = [j for j in parse_sacct(result.stdout, token) if j.job_id == job_id]
    return found[0] if found else None


def get_job(job_id: str, run: Runner = run_bounded) -> JobInfo | None:
    """One job, or None when neither the controller nor accounting knows it (any more). squeue, not `scontrol show
    job`: scontrol's `Key=value` record cannot be read back when a value (the job's name, paths, comment) holds
    ` Key=` or a line end, and 22.05 has no `scontrol --json` (23.02 on); `squeue --json` of 22.05 ignores --jobs
    and prints every job of the cluster (man squeue, 22.05: "All other formatting and filtering arguments will be
    ignored")."""
    job_id = check_job_id(job_id)
    fields = records.Fields(JOB_FIELDS)
    result = slurm(squeue_argv(None, (job_id,), fields), run=run, check=False)
    if result.returncode == 0:
        jobs = parse_squeue(result.stdout, fields)
        # A job array lists every task; prefer the record whose id is the one asked for.
        exact = [j for j in jobs if j.job_id == job_id]
        if exact or jobs:
            return (exact or jobs)[0]
    elif not _forgotten(result):
        raise UserError(command_error(["squeue", "--jobs", job_id], result))
    return _from_accounting(job_id, run)


def list_jobs(user: str | None = None, all_users: bool = False, run: Runner = run_bounded) -> list[JobInfo]:
    """Jobs the controller knows (pending, running, and ended within MinJobAge), the caller's unless all_users."""
    if not all_users and user is None:
        user = getpass.getuser()
    fields = records.Fields(SQUEUE_FIELDS)
    result = slurm(squeue_argv(None if all_users else user, fields=fields), run=run)
    return sorted(parse_squeue(result.stdout, fields), key=_id_key)


def _id_key(job: JobInfo) -> tuple[int, ...]:
    return id_order(job.job_id)


def id_order(job_id: str) -> tuple[int, ...]:
    """The order of job ids: by number, an array's tasks and a heterogeneous job's components by their index."""
    if job_id.isdigit():  # most ids: no array index, no het component
        return (int(job_id),)
    return tuple(int(p) for p in re.split(r"[_+]", job_id) if p.isdigit())


def cancel(job_id: str, signal: str | None = None, full: bool = False, run: Runner = run_bounded) -> None:
    """scancel the job. With a signal, Slurm sends it to the job's steps (and the batch shell with full=True)
    instead of ending the job; raises UserError when Slurm refuses."""
    job_id = check_job_id(job_id)
    argv = ["scancel"]
    if signal is not None:
        sig = signal.strip().upper()
        if not _SIGNAL_RE.match(sig):
            raise UserError(f"--signal {signal!r}: give a signal name or number, e.g. --signal USR1 or --signal TERM")
        argv.append(f"--signal={sig}")
        if full:
            argv.append("--full")
    argv.append(job_id)
    result = slurm(argv, run=run, check=False)
    if result.returncode != 0:
        if _forgotten(result):
            raise UserError(f"job {job_id} not found: it ended a while ago or the id is wrong (see `hpctrain status`)")
        raise UserError(command_error(argv, result))
