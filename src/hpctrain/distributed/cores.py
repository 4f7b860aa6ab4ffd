"""The CPU cores this process may use, and how many threads and helper processes to give them.

Pure standard library (no torch): `hpctrain train`'s checks, the training set-up, the recipes' data workers and
`hpctrain prepare` all ask here.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from hpctrain.errors import UserError


def available_cores() -> int:
    """The cores this process may run on (Slurm's CPU binding and taskset included)."""
    return len(_usable_cpus()) or os.cpu_count() or 1


def _usable_cpus() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # not on Linux
        return set()


# ---------------------------------------------------------------- threads per process
#
# torch's CPU kernels split every operation evenly over their threads and wait for the slowest. When another
# program keeps one of the cores busy, the thread sharing that core gets half of it at best and every operation
# waits for it: with two threads on two cores and one busy-loop beside it, the fast recipe trains 3-12x slower
# than with one thread (benchmarks/cpu_contention.py). OpenMP's waiting policy is not the cause (passive waiting
# loses a third of the idle speed and does not recover the contended one), so the default takes the cores that
# are actually free when the run starts.

BUSY_SAMPLE_S = 0.2


def check_threads(requested: int) -> None:
    """Refuse more threads than cores: they only wait on each other (1,000 trained 300x slower; 100,000 crashed)."""
    cores = available_cores()
    if requested > cores:
        raise UserError(
            f"--threads {requested} exceeds the {cores} CPU core(s) this process may use; "
            f"use --threads {cores} or fewer"
        )


def default_threads(local_processes: int, busy_cores: float = 0.0) -> int:
    """The cores this process may use, less those other programs keep busy, shared among the node's processes."""
    free = available_cores() - max(0.0, busy_cores)
    return max(1, int(free + 0.5) // max(1, local_processes))


def choose_threads(requested: int | None, local_processes: int) -> int:
    """--threads when given (checked), else the default for an idle machine."""
    if requested is None:
        return default_threads(local_processes)
    check_threads(requested)
    return requested


def busy_cores_elsewhere(sample_s: float = BUSY_SAMPLE_S) -> float:
    """How many of this process's cores other programs keep busy, from /proc/stat over `sample_s` seconds
    (this process sleeps meanwhile, so all of the time counted is someone else's); 0.0 where unreadable."""
    cpus = _usable_cpus()
    try:
        before = cpu_times(Path("/proc/stat").read_text())
        time.sleep(sample_s)
        after = cpu_times(Path("/proc/stat").read_text())
    except OSError:
        return 0.0
    return busy_cores(before, after, cpus)


def cpu_times(proc_stat: str) -> dict[int, tuple[int, int]]:
    """Per CPU, (busy, total) clock ticks since boot, from the text of /proc/stat."""
    times = {}
    for line in proc_stat.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and len(fields) >= 4:
            ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
            times[int(name[3:])] = (sum(ticks) - idle, sum(ticks))
    return times


def busy_cores(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]], cpus: set[int]) -> float:
    """Cores' worth of busy time on `cpus` between two cpu_times() samples."""
    busy = 0.0
    for cpu in cpus & before.keys() & after.keys():
        total = after[cpu][1] - before[cpu][1]
        if total > 0:
            busy += (after[cpu][0] - before[cpu][0]) / total
    return busy


# ---------------------------------------------------------------- helper process counts

WORKERS_PER_CORE = 4
"""Helper processes (data workers, encoding processes) allowed per usable core: more only compete for the cores
(and each costs memory), while a few per core still hide I/O waits on a slow file system."""


def check_worker_count(flag: str, workers: int, cores: int | None = None) -> None:
    """Refuse `workers` helper processes above WORKERS_PER_CORE x the usable cores, naming the maximum."""
    cores = cores or available_cores()
    limit = WORKERS_PER_CORE * cores
    if workers > limit:
        raise UserError(
            f"{flag} {workers}: more than {limit} processes ({WORKERS_PER_CORE} per core, {cores} "
            f"core(s) usable here) would only compete for the cores; use {flag} {min(cores, limit)}, "
            f"or at most {limit}"
        )
