"""What `hpctrain cluster`, `status`, `check` and `submit` cost on a huge Slurm cluster, and how it grows.

A 10,000-node cluster with 100,000 jobs cannot run here, so the harness writes what its Slurm client commands
would print and puts stand-ins for `scontrol`, `squeue`, `sacct`, `sinfo` and `sbatch` first on PATH (small shell
scripts that `cat` the prepared answer and log their argv; squeue answers the field lists, filters and orders
hpctrain asks for, as squeue_answer() prints them, and scontrol reads `show job ID` commands on stdin with awk).
The answers are in the exact forms hpctrain parses, per Slurm release (tests/data/slurm/ has the field-by-field
sources):

  20.11  the oldest supported: CPUTot without CPUEfctv, no shard GRES
  22.05  shards in use printed as `shard:h100:2(IDX:..)` (GPUs with shards, 22.05 and 23.02): `cluster` completes
         them from the running shard jobs' `scontrol -d show job` records (about 1.3 KB a job; the whole dump of
         every job, `scontrol -d show job -o`, is the biggest text here and is answered too)
  25.11  the newest: shards in use per GPU, `shard:h100:40(16/64,24/64,...)`

The cluster at size N has N nodes of 8 H100s (and 512 shards from 22.05 on), 10 N jobs in the queue (a tenth
running, the rest pending; a tenth of the running ones on shards), N of them the caller's. Each command runs
as a fresh `hpctrain` process (start-up included) at each size; the figures are the median of --repeat runs of its
CPU time (user + system, the stand-ins' `cat` included) beside the wall time, which on a shared, loaded machine
mostly measures the others' load; the fit says which of constant, N, N log N and N^2 describes the CPU time best
(least squares, a + b f(N)).

    python benchmarks/scale_views.py                         # 2,500 / 5,000 / 10,000 nodes, 3 versions
    python benchmarks/scale_views.py --sizes 1000,2000 --versions 25.11 --repeat 1
    python benchmarks/scale_views.py --compare OLD/src       # each command also with PYTHONPATH=OLD/src, in turn

Needs only hpctrain installed (or PYTHONPATH=src); no Slurm. Writes its fake cluster under a temporary directory.
"""

from __future__ import annotations

import argparse
import getpass
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

SEP = "\x1f"
# hpctrain ends every squeue field with a random token of each query (records.Fields: SEP and 16 hex digits); the
# stand-ins' answers are written with this one, and the squeue stand-in puts the query's own in its place.
TOKEN = SEP + "0" * 16
VERSIONS = ("20.11", "22.05", "25.11")
GPUS = 8
SHARDS = 512  # per node, 64 per GPU


def node_name(i: int) -> str:
    return f"gpu{i:05d}"


def nodes_text(version: str, n: int) -> str:
    """`scontrol -d show node -o`: a quarter each allocated, mixed (4 GPUs, shards on GPUs 4-5), idle, and a few
    down or drained."""
    shards = version != "20.11"
    lines = []
    for i in range(1, n + 1):
        kind = i % 4
        state = ("ALLOCATED", "MIXED", "IDLE", "IDLE")[kind]
        if i % 97 == 0:
            state = "DOWN*"
        elif i % 89 == 0:
            state = "IDLE+DRAIN"
        gpus_used = (8, 4, 0, 0)[kind]
        gres = f"gpu:h100:{GPUS}(S:0-1)" + (f",shard:h100:{SHARDS}(S:0-1)" if shards else "")
        gpu_idx = {8: "0-7", 4: "0-3", 0: "N/A"}[gpus_used]
        used = f"gpu:h100:{gpus_used}(IDX:{gpu_idx})"
        if shards:
            if version == "22.05":
                used += ",shard:h100:2(IDX:4-5)" if kind == 1 else ",shard:h100:0(IDX:N/A)"
            else:
                per = ["0/64"] * GPUS
                if kind == 1:
                    per[4], per[5] = "16/64", "40/64"
                used += f",shard:h100:{56 if kind == 1 else 0}({','.join(per)})"
        cpus = (
            "CPUAlloc={a} CPUTot=96".format(a=(96, 48, 0, 0)[kind])
            if version == "20.11"
            else "CPUAlloc={a} CPUEfctv=96 CPUTot=96".format(a=(96, 48, 0, 0)[kind])
        )
        name = node_name(i)
        lines.append(
            f"NodeName={name} Arch=x86_64 CoresPerSocket=48 {cpus} CPULoad=12.00 AvailableFeatures=h100 "
            f"ActiveFeatures=h100 Gres={gres} GresDrain=N/A GresUsed={used} NodeAddr={name} NodeHostName={name} "
            f"Version={version}.3 OS=Linux 6.8.0-52-generic #53-Ubuntu SMP PREEMPT_DYNAMIC Sat Jan 11 00:06:25 UTC "
            f"2025  RealMemory=2000000 AllocMem={(1800000, 900000, 0, 0)[kind]} FreeMem=150000 Sockets=2 Boards=1 "
            f"State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu  "
            f"BootTime=2026-01-20T00:00:00 SlurmdStartTime=2026-01-20T00:01:00 LastBusyTime=2026-02-01T08:00:09 "
            f"CfgTRES=cpu=96,mem=2000000M,billing=96,gres/gpu=8 AllocTRES=cpu=48 CurrentWatts=0"
        )
    return "\n".join(lines) + "\n"


def partitions_text(n: int) -> str:
    common = (
        "AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL QoS=N/A DefaultTime=NONE "
        "DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED"
    )
    return (
        f"PartitionName=gpu {common} Default=YES MaxNodes=UNLIMITED MaxTime=2-00:00:00 Nodes=gpu[00001-{n:05d}] "
        f"State=UP TotalCPUs={96 * n} TotalNodes={n}\n"
        f"PartitionName=debug {common} Default=NO MaxNodes=4 MaxTime=01:00:00 Nodes=gpu[00001-00016] "
        f"State=UP TotalCPUs={96 * 16} TotalNodes=16\n"
    )


def _job_state(j: int) -> str:
    return "RUNNING" if j % 10 == 0 else "PENDING"


def _job_user(j: int, me: str, n: int) -> str:
    return me if j % 10 == 3 else f"user{j % 500:03d}"  # a tenth of the 10 N jobs: N of them the caller's


def _job_tres(j: int) -> str:
    """TresPerNode (scontrol) / tres-per-node (squeue) of job j, as 22.05 prints it: `gres:shard:16`."""
    state = _job_state(j)
    shard = state == "RUNNING" and j % 100 == 0
    return "gres:shard:16" if shard or (state == "PENDING" and j % 7 == 0) else "gres:gpu:8"


def job_record(j: int, n: int, me: str) -> str:
    """Job j's `scontrol -d show job -o` line (22.05 form, as tests/data/slurm/jobs_22.05_typed_shards.txt)."""
    job_id = 100000 + j
    state = _job_state(j)
    node = node_name(1 + 4 * ((j // 10) % max(1, n // 4)))  # the mixed nodes
    tres = _job_tres(j)
    shard = state == "RUNNING" and tres == "gres:shard:16"
    per_node = (
        f"JOB_GRES=shard:16   Nodes={node} CPU_IDs=0-7 Mem=0 GRES=shard:h100:16(IDX:4) "
        if shard
        else (
            f"JOB_GRES=gpu:8   Nodes={node} CPU_IDs=0-95 Mem=0 GRES=gpu:h100:8(IDX:0-7) " if state == "RUNNING" else ""
        )
    )
    user = _job_user(j, me, n)
    return (
        f"JobId={job_id} JobName=train-{j} UserId={user}(1000) GroupId=users(100) MCS_label=N/A Priority=4294 "
        f"Nice=0 Account=(null) QOS=(null) JobState={state} Reason={'None' if state == 'RUNNING' else 'Priority'} "
        f"Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 DerivedExitCode=0:0 "
        f"RunTime=01:00:00 TimeLimit=2-00:00:00 TimeMin=N/A SubmitTime=2026-02-01T07:00:00 "
        f"EligibleTime=2026-02-01T07:00:00 AccrueTime=2026-02-01T07:00:00 StartTime=2026-02-01T08:00:00 "
        f"EndTime=2026-02-03T08:00:00 Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
        f"LastSchedEval=2026-02-01T08:00:00 Scheduler=Main Partition=gpu AllocNode:Sid=login1:3315 "
        f"ReqNodeList=(null) ExcNodeList=(null) NodeList={node if state == 'RUNNING' else '(null)'} "
        f"BatchHost={node} NumNodes=1 NumCPUs=8 NumTasks=1 CPUs/Task=8 ReqB:S:C:T=0:0:*:* "
        f"TRES=cpu=8,node=1,billing=8 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* {per_node}"
        f"MinCPUsNode=8 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK "
        f"Contiguous=0 Licenses=(null) Network=(null) Command=/home/{user}/train.sbatch "
        f"WorkDir=/home/{user} StdErr=/home/{user}/slurm-{job_id}.out StdIn=/dev/null "
        f"StdOut=/home/{user}/slurm-{job_id}.out Power= TresPerNode={tres}"
    )


def jobs_text(n: int, me: str) -> str:
    """`scontrol -d show job -o` (22.05 form), 10 N jobs."""
    return "\n".join(job_record(j, n, me) for j in range(10 * n)) + "\n"


def scontrol_session(commands: str, record: Callable[[str], str | None]) -> tuple[str, str, int]:
    """What `scontrol -d -o` (no command on its command line) prints when its stdin holds `show job ID` lines:
    scontrol then reads commands until EOF, one at a time, and exits with 1 if any failed (main() and
    _get_command() in src/scontrol/scontrol.c, slurm-22-05-0-1 and slurm-23-02-0-1). Built with readline (Debian's
    22.05 is) it prompts `scontrol: ` and echoes each command on stdout, and on EOF prints the prompt and a newline;
    an id the controller does not know prints `slurm_load_jobs error: Invalid job id specified` on stderr
    (scontrol_print_job in src/scontrol/info_job.c, same tags); `show hostnames NAME` prints NAME (hpctrain's
    marker between records). Recorded on the local 22.05 cluster the same way. record(ID) is the job's one-line
    record or None. Returns stdout, stderr, exit status."""
    out, err, status = [], [], 0
    for line in commands.splitlines():
        words = line.split()
        out.append("scontrol: " + line)
        if len(words) == 3 and words[:2] == ["show", "job"] and (text := record(words[2])) is not None:
            out.append(text)
        elif len(words) == 3 and words[:2] == ["show", "hostnames"]:
            out.append(words[2])
        else:
            err.append("slurm_load_jobs error: Invalid job id specified")
            status = 1
    return "\n".join([*out, "scontrol: "]) + "\n", "".join(e + "\n" for e in err), status


# squeue -O fields as the harness prints them, per job. hpctrain asks for: jobs.SQUEUE_FIELDS (`status --json`),
# job_table.TABLE_FIELDS (`status`, 8 of them, sorted by id) and query.HOLDER_FIELDS (`cluster` on 22.05/23.02:
# the running jobs' GRES requests); squeue_answer() prints any of these for any such argv.
HOLDING = ("RUNNING", "COMPLETING", "SUSPENDED")


def squeue_fields(j: int, n: int, me: str) -> dict[str, str]:
    state = _job_state(j)
    user = _job_user(j, me, n)
    running = state == "RUNNING"
    return {
        "jobid": str(100000 + j),
        "name": f"train-{j}",
        "state": state,
        "reason": "None" if running else "Priority",
        "numnodes": "1",
        "maxnodes": "1",
        "numtasks": "1",  # one torchrun a node
        "nodelist": node_name(1 + 4 * ((j // 10) % max(1, n // 4))) if running else "",
        "timeused": "1:00:00" if running else "0:00",
        "restartcnt": "0",
        "partition": "gpu",
        "username": user,
        "submittime": "2026-02-01T07:00:00",
        "starttime": "2026-02-01T08:00:00" if running else "N/A",
        "timelimit": "2-00:00:00",
        "workdir": f"/home/{user}",
        "tres-per-node": _job_tres(j),
        "tres-per-job": "N/A",
        "tres-per-socket": "N/A",
        "tres-per-task": "N/A",
    }


def squeue_answer(argv: list[str], n: int, me: str) -> str:
    """squeue's stdout for hpctrain's argv (`--noheader --Format=F:SEP,...` with `--states`, `--user`, `--sort`):
    the fields named, each followed by its suffix and no padding (width 0: _parse_long_token in src/squeue/opts.c,
    _print_str in src/squeue/print.c); `--states=all` or a list of state names; without `--sort`, squeue's default
    order `P,t,-p` (partition, the compact state word, priority descending: sort_job_list in src/squeue/sort.c), here
    the pending jobs (PD) then the running ones (R), each in id order as all have one priority; `--sort=i` id order.
    Anything else is refused, as a stand-in must not answer what it does not know."""
    opts = dict(a.split("=", 1) for a in argv[1:] if a != "--noheader")
    if argv[0] != "squeue" or "--noheader" not in argv or set(opts) - {"--states", "--user", "--sort", "--Format"}:
        raise ValueError(f"squeue stand-in: {argv} not prepared")
    fields = [f.split(":", 1) for f in opts["--Format"].split(",")]
    states = None if opts.get("--states", "all").lower() == "all" else set(opts["--states"].upper().split(","))
    if opts.get("--sort", "i") != "i":
        raise ValueError(f"squeue stand-in: --sort={opts['--sort']} not prepared")
    order = range(10 * n)
    if "--sort" not in opts:
        order = sorted(order, key=lambda j: (0 if _job_state(j) == "PENDING" else 1, j))
    lines = []
    for j in order:
        if (states is not None and _job_state(j) not in states) or ("--user" in opts and _job_user(j, me, n) != me):
            continue
        values = squeue_fields(j, n, me)
        lines.append("".join(values[name.lower()] + (suffix[0] if suffix else "") for name, *suffix in fields))
    return "".join(line + "\n" for line in lines)


def squeue_format(fields: tuple[str, ...], token: str = TOKEN) -> str:
    """hpctrain's `--Format=` for these fields (records.Fields.squeue_option): each ended by the query's token."""
    return "--Format=" + ",".join(f"{f}:{token}" for f in fields)


def squeue_rows(n: int, me: str) -> tuple[str, str]:
    """squeue with hpctrain.schedulers.slurm.queries.job_states.squeue_argv() (its token TOKEN): everyone's 10 N jobs,
    and the
    caller's N."""
    argv = ["squeue", "--noheader", "--states=all", squeue_format(FULL_FIELDS)]
    return squeue_answer(argv, n, me), squeue_answer([*argv, f"--user={me}"], n, me)


FULL_FIELDS = ("JobID", "Name", "State", "Reason", "NumNodes", "MaxNodes", "NodeList", "TimeUsed", "RestartCnt")
FULL_FIELDS += ("Partition",)
FULL_FIELDS += ("UserName", "SubmitTime", "StartTime", "TimeLimit", "WorkDir")  # jobs.SQUEUE_FIELDS
TABLE_FIELDS = ("JobID", "Name", "State", "Reason", "NodeList", "NumNodes", "MaxNodes", "TimeUsed", "RestartCnt")
HOLDER_FIELDS = ("JobID", "tres-per-node", "tres-per-job", "tres-per-socket", "tres-per-task", "Name")
SUMMARY_FIELDS = ("JobID", "Name", "State", "NumNodes", "NumTasks", "tres-per-node", "tres-per-job", "SubmitTime")
SUMMARY_FIELDS += ("RestartCnt",)  # job_summaries.SUMMARY_FIELDS (the web console's jobs table)


def squeue_argvs(me: str) -> list[list[str]]:
    """The squeue command lines hpctrain runs, before and after issue 32's narrower queries, with TOKEN for the
    query's own token: the stand-in on PATH answers exactly these (tests/test_scale_slurm.py checks that hpctrain's
    own argv are among them)."""
    fmt = squeue_format
    full = ["squeue", "--noheader", "--states=all", fmt(FULL_FIELDS)]
    table = ["squeue", "--noheader", "--states=all", "--sort=i", fmt(TABLE_FIELDS)]
    holders = ["squeue", "--noheader", "--states=" + ",".join(HOLDING), fmt(HOLDER_FIELDS)]
    summary = ["squeue", "--noheader", "--states=all", fmt(SUMMARY_FIELDS)]
    mine = f"--user={me}"
    return [full, [*full, mine], table, [*table, mine], holders, summary, [*summary, mine]]


# The squeue stand-in's query token (the suffix of the last --Format field) and its command line with TOKEN in the
# token's place; the answer is the prepared text with the query's token put back (SWAP: a bytes.replace, 0.02 CPU s
# for 100,000 jobs where sed took 0.17 s; the stand-in's cost is counted with hpctrain's).
SQUEUE_TOKEN = """placeholder='{placeholder}'
token=$placeholder
for a in "$@"; do case "$a" in --Format=*) token="${{a##*:}}" ;; esac; done
[ ${{#token}} -gt 1 ] || token=$placeholder
key=$(printf '%s' "$*" | sed "s/$token/$placeholder/g")
"""

SWAP = (
    "import os, sys; f, p, t = map(os.fsencode, sys.argv[1:4]); "
    "sys.stdout.buffer.write(open(f, 'rb').read().replace(p, t))"
)

FAKE = """#!/bin/sh
# {name}: a stand-in written by benchmarks/scale_views.py; answers from {data}
printf '%s\\n' "{name} $*" >> "{data}/calls.log"
{body}
"""

# `scontrol -d -o` reading `show job ID` lines (scontrol_session's form): each record from the running shard jobs'
# file, else from the whole dump, as the controller answers any id.
SESSION_AWK = r"""
BEGIN { while ((getline line < held) > 0) { split(line, kv, " "); rec[substr(kv[1], 7)] = line } close(held) }
{
  print "scontrol: " $0
  if ($1 == "show" && $2 == "job" && NF == 3) {
    found = ($3 in rec) ? rec[$3] : ""
    if (found == "" && all != "") {
      while ((getline line < all) > 0) { split(line, kv, " "); if (kv[1] == "JobId=" $3) { found = line; break } }
      close(all)
    }
    if (found != "") { print found; next }
  }
  if ($1 == "show" && $2 == "hostnames" && NF == 3) { print $3; next }
  print "slurm_load_jobs error: Invalid job id specified" > "/dev/stderr"; status = 1
}
END { print "scontrol: "; exit status }
"""


def write_cluster(root: Path, version: str, n: int, me: str) -> Path:
    data = root / f"{version}-{n}"
    bin_dir = data / "bin"
    bin_dir.mkdir(parents=True)
    (data / "nodes.txt").write_text(nodes_text(version, n))
    (data / "partitions.txt").write_text(partitions_text(n))
    (data / "session.awk").write_text(SESSION_AWK)
    if version == "22.05":
        (data / "jobs.txt").write_text(jobs_text(n, me))
        held = [j for j in range(0, 10 * n, 10) if _job_tres(j) == "gres:shard:16"]  # the running shard jobs
        (data / "held.txt").write_text("".join(job_record(j, n, me) + "\n" for j in held))
    else:
        (data / "held.txt").write_text("")
    d = shlex.quote(str(data))
    cases = []
    swap = f"{shlex.quote(sys.executable)} -I -S -c {shlex.quote(SWAP)}"
    for i, argv in enumerate(squeue_argvs(me)):
        (data / f"squeue{i}.txt").write_text(squeue_answer(argv, n, me))
        cases.append(f'  {shlex.quote(" ".join(argv[1:]))}) exec {swap} {d}/squeue{i}.txt "$placeholder" "$token" ;;')
    all_jobs = f"{d}/jobs.txt" if version == "22.05" else "''"
    bodies = {
        "scontrol": f"""case "$*" in
  *"show partition"*) exec cat {d}/partitions.txt ;;
  *"show node"*) exec cat {d}/nodes.txt ;;
  *"show job"*) [ -f {d}/jobs.txt ] && exec cat {d}/jobs.txt; exit 0 ;;
  "-d -o") exec awk -v held={d}/held.txt -v all={all_jobs} -f {d}/session.awk ;;
esac
echo "scontrol stand-in: $* not prepared" >&2; exit 1""",
        "squeue": SQUEUE_TOKEN.format(placeholder=TOKEN)
        + 'case "$key" in\n'
        + "\n".join(cases)
        + '\nesac\necho "squeue stand-in: $* not prepared" >&2; exit 1',
        "sacct": 'echo "sacct: error: Slurm accounting storage is disabled" >&2; exit 1',
        "sinfo": f'[ "$1" = --version ] && echo "slurm {version}.3" && exit 0; exit 1',
        "sbatch": "cat > /dev/null; echo 4242",
    }
    for name, body in bodies.items():
        path = bin_dir / name
        path.write_text(FAKE.format(name=name, data=data, body=body))
        path.chmod(0o755)
    return data


def commands(workdir: Path) -> dict[str, list[str]]:
    big = [
        "--nodes",
        "1000",
        "--nproc-per-node",
        "8",
        "--gpus-per-node",
        "8",
        "--partition",
        "gpu",
        "--time",
        "1-00:00:00",
        "--run-dir",
        str(workdir / "runs" / "%j"),
    ]
    return {
        "start-up (--version)": ["--version"],
        "cluster": ["cluster"],
        "cluster --json": ["cluster", "--json"],
        "status (N own jobs)": ["status"],
        "status --json": ["status", "--json"],
        "status --all-users (10 N jobs)": ["status", "--all-users"],
        "check 1000x8 GPUs": ["check", *big, "--", "python", "train.py"],
        "submit --dry-run 1000x8": ["submit", "--dry-run", *big, "--", "python", "train.py"],
        "submit 1000x8 (checks on)": ["submit", *big, "--", "python", "train.py"],
    }


def run_once(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, float, int, int]:
    """CPU seconds (user + system, the stand-in commands included), wall seconds, peak RSS in MB, exit status and
    output bytes of one command. On a shared machine the CPU time is the figure to compare: the wall time grows
    with everyone else's load."""
    start = time.perf_counter()
    with open(os.devnull, "wb") as sink, tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([sys.executable, "-m", "hpctrain", *argv], env=env, cwd=cwd, stdout=out, stderr=sink)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        size = out.tell()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, seconds, usage.ru_maxrss / 1024, proc.returncode, size


GROWTHS = {"constant": lambda n: 0.0, "N": lambda n: n, "N log N": lambda n: n * math.log(n), "N^2": lambda n: n * n}


NOISE_S = 0.05  # the spread of one CPU-time figure on a loaded machine, about


def fit(sizes: list[int], times: list[float]) -> str:
    """Least squares a + b f(N) (b >= 0) for each growth; the simplest growth whose residual is within the noise
    (NOISE_S a point) of the best one's, with its slope: three noisy points must not pass for a curve."""
    fits = []
    for name, f in GROWTHS.items():
        xs = [f(n) for n in sizes]
        mx, my = statistics.fmean(xs), statistics.fmean(times)
        sxx = sum((x - mx) ** 2 for x in xs)
        b = 0.0 if sxx == 0 else max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, times)) / sxx)
        a = my - b * mx
        fits.append((sum((a + b * x - y) ** 2 for x, y in zip(xs, times)), name, a, b))
    best = min(r for r, *_ in fits)
    _, name, a, b = next(f for f in fits if f[0] <= best + NOISE_S**2 * len(sizes))
    if name == "constant":
        return f"constant ({a:.2f} s)"
    per = {"N": "per 1k nodes", "N log N": "per 1k N log N", "N^2": "per 1M N^2"}[name]
    scale = {"N": 1e3, "N log N": 1e3 * math.log(1e4), "N^2": 1e6}[name]
    return f"{name} ({a:.2f} s + {b * scale:.3f} s {per})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2500,5000,10000", help="node counts (jobs: 10 per node)")
    parser.add_argument("--versions", default=",".join(VERSIONS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated command labels (prefixes) to run")
    parser.add_argument(
        "--compare",
        metavar="SRC",
        help="also run each command with PYTHONPATH=SRC (another checkout's src/, e.g. the code before a change), "
        "the two runs taking turns so that both see the same load",
    )
    parser.add_argument("--write", nargs=4, metavar=("DIR", "VERSION", "N", "USER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write:
        write_cluster(Path(args.write[0]), args.write[1], int(args.write[2]), args.write[3])
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    versions = [v for v in args.versions.split(",") if v]
    me = getpass.getuser()
    results: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="hpctrain-scale-") as tmp:
        root = Path(tmp)
        work = root / "submitdir"
        work.mkdir()
        (work / "train.py").write_text("print('hello')\n")
        for version in versions:
            for n in sizes:
                # Written by a child process: a process started later inherits no peak RSS from the writer.
                subprocess.run([sys.executable, __file__, "--write", str(root), version, str(n), me], check=True)
                data = root / f"{version}-{n}"
                env = {**os.environ, "PATH": f"{data / 'bin'}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "200"}
                env.pop("KUBECONFIG", None)
                envs = {"": env}
                if args.compare:
                    envs[" (compare)"] = {**env, "PYTHONPATH": args.compare}
                for label, argv in commands(work).items():
                    if args.only and not any(label.startswith(p) for p in args.only.split(",")):
                        continue
                    runs: dict[str, list] = {tag: [] for tag in envs}
                    calls: dict[str, int] = {}
                    for _ in range(args.repeat):
                        for tag, tag_env in envs.items():
                            (data / "calls.log").write_text("")
                            runs[tag].append(run_once(argv, tag_env, work))
                            calls[tag] = len((data / "calls.log").read_text().splitlines())
                    for tag, tag_runs in runs.items():
                        cpu = statistics.median(r[0] for r in tag_runs)
                        wall = statistics.median(r[1] for r in tag_runs)
                        rss = max(r[2] for r in tag_runs)
                        rc = tag_runs[-1][3]
                        results.setdefault((version, label + tag), []).append(cpu)
                        print(
                            f"{version:6} N={n:6} {label + tag:40} CPU {cpu:6.2f} s  wall {wall:6.2f} s  "
                            f"{rss:5.0f} MB  {calls[tag]} Slurm call(s)  out {tag_runs[-1][4] / 1e6:5.2f} MB"
                            + (f"  EXIT {rc}" if rc else ""),
                            flush=True,
                        )
    print("\nCPU seconds at each size, and the growth fitted to them (N nodes; 10 N jobs):")
    for (version, label), times in results.items():
        print(f"{version:6} {label:44} " + " / ".join(f"{t:.2f}" for t in times) + f" s  -> {fit(sizes, times)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
