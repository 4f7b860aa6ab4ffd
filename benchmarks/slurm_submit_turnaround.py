"""Submit-to-end turnaround of a 2-node x 2-process gloo all-reduce job: hpctrain vs TorchX's dist.ddp.

Both tools run the same script (below) under torchrun with a c10d rendezvous, 2 CPUs per node, on the same
Slurm cluster; runs alternate between the tools (ABBA order, so drift in the machine's load hits both alike).

    hpctrain submit --wait --nodes 2 --nproc-per-node 2 --launcher torchrun -- python allreduce.py
    torchx run --scheduler slurm dist.ddp -j 2x2 --cpu 2 --script allreduce.py

Clocks start just before the submitting command is started (its own start-up and hpctrain's pre-submit checks
count) and stop when `scontrol show job`, polled every --poll seconds, first shows the job ended. TorchX's CLI
exits with an error right after submitting when the cluster keeps no accounting (it calls sacct), but the job
runs; that is why the end is observed the same way for both. For hpctrain, the moment `submit --wait` returns is
reported too (it polls the job itself).

Figures per tool (medians over the runs that succeeded; every run's 4 ranks must print the right sum):
  submitted   start of the command until the job id is known
  pending     job id known until the job is first seen RUNNING (queueing, node set-up)
  running     first seen RUNNING until seen ended (srun, torchrun, rendezvous, the all-reduce, teardown)
  total       start of the command until the job is seen ended

Needs: the local cluster (scripts/local-slurm.sh up), `pip install torchx` (or `pip install -e .[bench]`), and
node names that resolve (`127.0.0.1 node1 node2` in /etc/hosts on the local cluster).

    python benchmarks/slurm_submit_turnaround.py --runs 5
"""

from __future__ import annotations

import argparse
import math
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ALLREDUCE = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # torchrun's environment: MASTER_ADDR, RANK, WORLD_SIZE
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
print(f"rank {dist.get_rank()}/{dist.get_world_size()} sum {t.item():g}", flush=True)
dist.destroy_process_group()
"""
EXPECTED_SUM = "sum 6"  # 0 + 1 + 2 + 3
ENDED = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)
TIME_LIMIT_MIN = 10


@dataclass
class Run:
    tool: str
    job_id: str = ""
    submitted: float = float("nan")
    started: float = float("nan")
    ended: float = float("nan")
    returned: float = float("nan")  # hpctrain: when `submit --wait` returned
    busy: bool = False  # other jobs were on the cluster when this one was submitted
    ok: bool = False
    note: str = ""


@dataclass
class Tools:
    hpctrain: list[str]
    torchx: list[str]
    poll_s: float
    timeout_s: float
    workdir: Path
    runs: list[Run] = field(default_factory=list)


def job_states(job_id: str) -> list[str] | None:
    """JobState of each component (a TorchX job is heterogeneous: one component per node); [] once the
    controller forgot the job; None when scontrol failed (a busy controller times out now and then)."""
    result = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    if result.returncode != 0:
        return [] if "invalid job id" in result.stderr.lower() else None
    return re.findall(r"\bJobState=(\S+)", result.stdout)


def other_jobs() -> bool:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    return bool(out.split())


def wait_for_quiet_cluster(limit_s: float) -> bool:
    """Wait (up to limit_s) until no job is queued or running, so that queueing behind others is rare; True
    when the cluster is still busy (the run is then marked)."""
    deadline = time.monotonic() + limit_s
    while other_jobs():
        if time.monotonic() > deadline:
            return True
        time.sleep(1.0)
    return False


def follow(run: Run, t0: float, tools: Tools, process: subprocess.Popen | None = None) -> None:
    """Poll the job until it has ended; fill in started/ended (and returned, for a --wait process)."""
    deadline = time.perf_counter() + tools.timeout_s
    while True:
        now = time.perf_counter()
        if process is not None and math.isnan(run.returned) and process.poll() is not None:
            run.returned = now - t0
        states = job_states(run.job_id)
        now = time.perf_counter()
        if states is not None:
            if math.isnan(run.started) and any(s in ("RUNNING", "COMPLETING") or s in ENDED for s in states):
                run.started = now - t0
            if states == [] or all(s in ENDED for s in states):
                run.ended = now - t0
                run.ok = bool(states) and all(s == "COMPLETED" for s in states)
                if not run.ok:
                    run.note = f"job ended {','.join(states) or 'unknown'}"
                break
        if now > deadline:
            subprocess.run(["scancel", run.job_id], capture_output=True)
            run.note = f"not ended after {tools.timeout_s:g} s"
            return
        time.sleep(tools.poll_s)
    if process is not None:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
        if math.isnan(run.returned):
            run.returned = time.perf_counter() - t0
        if process.returncode != 0 and run.ok:
            run.ok, run.note = False, f"submit --wait exited {process.returncode}"


def count_sums(paths: list[Path]) -> int:
    return sum(p.read_text(errors="replace").count(EXPECTED_SUM) for p in paths if p.exists())


def run_hpctrain(tools: Tools) -> Run:
    run = Run("hpctrain", busy=wait_for_quiet_cluster(120))
    argv = [
        *tools.hpctrain,
        "submit",
        "--wait",
        "--nodes",
        "2",
        "--nproc-per-node",
        "2",
        "--launcher",
        "torchrun",
        "--job-name",
        "bench-hpctrain",
        "--output",
        "hpctrain-%j.out",
        "--time",
        str(TIME_LIMIT_MIN),
        "--",
        sys.executable,
        "allreduce.py",
    ]
    t0 = time.perf_counter()
    process = subprocess.Popen(argv, cwd=tools.workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    first = process.stdout.readline().strip()
    run.submitted = time.perf_counter() - t0
    if not first.isdigit():
        process.wait()
        run.note = f"submit failed: {process.stderr.read().strip() if process.stderr else first}"
        return run
    run.job_id = first
    follow(run, t0, tools, process)
    if run.ok and count_sums([tools.workdir / f"hpctrain-{run.job_id}.out"]) != 4:
        run.ok, run.note = False, "not every rank printed the sum"
    return run


def run_torchx(tools: Tools) -> Run:
    run = Run("torchx", busy=wait_for_quiet_cluster(120))
    argv = [
        *tools.torchx,
        "run",
        "--scheduler",
        "slurm",
        "--scheduler_args",
        f"time={TIME_LIMIT_MIN}",
        "dist.ddp",
        "-j",
        "2x2",
        "--cpu",
        "2",
        "--script",
        "allreduce.py",
    ]
    t0 = time.perf_counter()
    # Exits non-zero after submitting when sacct has no accounting to ask; the job id is printed before that.
    result = subprocess.run(argv, cwd=tools.workdir, capture_output=True, text=True)
    run.submitted = time.perf_counter() - t0
    found = re.search(r"slurm://[^/\s]*/(\d+)", result.stdout + result.stderr)
    if found is None:
        run.note = f"submit failed: {(result.stderr or result.stdout).strip()[-300:]}"
        return run
    run.job_id = found.group(1)
    follow(run, t0, tools)
    outs = [tools.workdir / f"slurm-{run.job_id}-allreduce-{i}.out" for i in (0, 1)]
    if run.ok and count_sums(outs) != 4:
        run.ok, run.note = False, "not every rank printed the sum"
    return run


def median(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    return f"{statistics.median(values):.1f}" if values else "n/a"


def span(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    return f"{min(values):.1f}–{max(values):.1f}" if values else "n/a"


def table(runs: list[Run]) -> str:
    lines = [
        "| tool | runs ok | submitted | pending | running | total, median | total, min–max | `submit --wait` returns |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for tool in ("hpctrain", "torchx"):
        mine = [r for r in runs if r.tool == tool]
        ok = [r for r in mine if r.ok]
        lines.append(
            f"| {tool} | {len(ok)}/{len(mine)} | {median([r.submitted for r in ok])} | "
            f"{median([r.started - r.submitted for r in ok])} | {median([r.ended - r.started for r in ok])} | "
            f"{median([r.ended for r in ok])} | {span([r.ended for r in ok])} | "
            f"{median([r.returned for r in ok]) if tool == 'hpctrain' else '–'} |"
        )
    return "\n".join(lines)


def preflight(torchx: list[str]) -> None:
    problems = []
    for tool in ("sbatch", "scontrol", "squeue", "sinfo"):
        if shutil.which(tool) is None:
            problems.append(f"{tool} is not on PATH: start the local cluster with scripts/local-slurm.sh up")
    for node in ("node1", "node2"):
        try:
            socket.gethostbyname(node)
        except OSError:
            problems.append(
                f"{node} does not resolve: add `127.0.0.1 node1 node2` to /etc/hosts (torchrun's "
                "rendezvous connects to the first node by name)"
            )
    if not torchx:
        problems.append("torchx is not installed: pip install torchx (or pip install -e '.[bench]')")
    if problems:
        sys.exit("cannot run the benchmark:\n  " + "\n  ".join(problems))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per tool (default 5)")
    parser.add_argument("--poll", type=float, default=0.2, metavar="S", help="job state poll interval (default 0.2 s)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S", help="give up on a job after S seconds")
    parser.add_argument(
        "--workdir",
        type=Path,
        help="where jobs run and write their output (default: a temporary "
        "directory; it must be visible to the compute nodes)",
    )
    args = parser.parse_args(argv)

    torchx_exe = shutil.which("torchx")
    preflight([torchx_exe] if torchx_exe else [])
    hpctrain_exe = shutil.which("hpctrain")
    hpctrain = [hpctrain_exe] if hpctrain_exe else [sys.executable, "-m", "hpctrain"]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="slurm-turnaround-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "allreduce.py").write_text(ALLREDUCE)
    tools = Tools(hpctrain, [torchx_exe or "torchx"], args.poll, args.timeout, workdir)

    order = []
    for i in range(args.runs):  # ABBA: hpctrain, torchx, torchx, hpctrain, ...
        order += [run_hpctrain, run_torchx] if i % 2 == 0 else [run_torchx, run_hpctrain]
    for step in order:
        run = step(tools)
        tools.runs.append(run)
        status = "ok" if run.ok else f"FAILED ({run.note})"
        busy = " (other jobs were on the cluster)" if run.busy else ""
        print(
            f"{run.tool:8} job {run.job_id or '-':>6}: total {run.ended:5.1f} s, submitted {run.submitted:4.1f} s, "
            f"started {run.started:5.1f} s {status}{busy}",
            file=sys.stderr,
            flush=True,
        )

    print(
        f"\nSubmit-to-end of a 2-node x 2-process gloo all-reduce job (seconds; {args.runs} runs per tool, "
        f"job state polled every {args.poll:g} s; output in {workdir})\n"
    )
    print(table(tools.runs))
    busy = sum(r.busy for r in tools.runs)
    if busy:
        print(f"\n{busy} run(s) were submitted while other jobs were on the cluster.")
    return 0 if all(r.ok for r in tools.runs) else 1


if __name__ == "__main__":
    sys.exit(main())
