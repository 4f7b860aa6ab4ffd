"""A job's values as people type them (flags, job files): time limits and memory sizes, and the upper bounds of
what one job may ask for.

Whose grammar: these are hpctrain's own input forms, the same for every scheduler, and they become plain numbers
(seconds, bytes) at once. The time forms are HPC's usual ones (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, a
bare number being minutes), the sizes a whole number with an optional binary unit K, M, G or T (a bare number being
megabytes); a backend renders the numbers in its own form. What a scheduler prints (Slurm's `1.50G`, its GRES
lists) and what it alone takes (a GRES request) are that backend's grammar, in its package
(hpctrain.schedulers.slurm.grammar), which reads them and may build on these readers.

Pure functions of their text; a value that cannot be read faithfully is a UserError that shows the accepted forms.
"""

from __future__ import annotations

import functools
import re

from hpctrain.distributed.hostlist import is_node_name
from hpctrain.errors import UserError

TIME_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
_TIME_RE = re.compile(r"^(?:(?P<d>\d+)-)?(?P<rest>\d+(?::\d+){0,2})$")
_MEM_RE = re.compile(r"^(?P<n>\d+)(?P<unit>[KMGT]?)B?$", re.IGNORECASE)
_MEM_UNITS = "KMGT"  # binary: K is 1024 bytes, M 1024 K, ...

# Upper bounds of what one job can ask for: far beyond any machine, and low enough that a typo (or a hostile job
# file) never reaches a manifest, a batch script line or an integer overflow downstream.
MAX_NODES = 100_000
MAX_PROCS_PER_NODE = 1024
MAX_GPUS_PER_NODE = 1024
MAX_CPUS_PER_TASK = 16_384
MAX_MEM_BYTES = 1 << 50  # 1 PiB per node


def duration_s(text: str) -> int:
    """A time in one of TIME_FORMS -> seconds; ValueError for anything else. A bare number is minutes; with a day,
    D-HH is hours. The one reader of these forms (a scheduler that prints them reads them here too)."""
    m = _TIME_RE.match(text.strip()) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"not a time: {text!r}")
    parts = [int(p) for p in m["rest"].split(":")]
    if m["d"] is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = parts + [0] * (3 - len(parts))
    elif len(parts) == 1:  # MM
        hours, minutes, seconds = 0, parts[0], 0
    else:  # MM:SS, HH:MM:SS
        hours, minutes, seconds = [0] * (3 - len(parts)) + parts
    return ((int(m["d"] or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def parse_time_limit(text: str) -> int:
    """A job's time limit as typed (--time, a job file's `time:`) -> seconds, more than zero."""
    try:
        total = duration_s(text)
    except ValueError:
        raise UserError(f"time limit {text!r} is not a time: use {TIME_FORMS} (e.g. --time 01:30:00)") from None
    if total <= 0:
        raise UserError(f"time limit {text!r} is zero: give a positive time, e.g. --time 30 (minutes) or 02:00:00")
    return total


@functools.lru_cache(maxsize=8192)  # a list of 100,000 jobs repeats a few thousand durations
def format_duration(seconds: int | None) -> str:
    """Seconds -> D-HH:MM:SS (or HH:MM:SS below a day); None (no limit) -> UNLIMITED."""
    if seconds is None:
        return "UNLIMITED"
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    hms = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{hms}" if days else hms


def time_text(seconds: int) -> str:
    """Seconds -> the shortest of TIME_FORMS that reads back as them (30:00, 1:30:00, 2-00:00:00): how a job's time
    limit is written back (job.yaml) and said."""
    if seconds >= 86400:
        return format_duration(seconds)
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def parse_mem_bytes(text: str) -> int:
    """Memory per node as typed (4000, 4000M, 16G, 1T: units K/M/G/T of 1024, M by default) -> bytes (0: all the
    memory of each node, where the scheduler has that notion)."""
    m = _MEM_RE.match(text.strip()) if isinstance(text, str) else None
    if not m or len(m["n"]) > 30:
        raise UserError(
            f"memory {text!r} is not a size: use a number with an optional unit K, M, G or T (e.g. --mem 16G)"
        )
    value = int(m["n"]) << (10 * (_MEM_UNITS.find(m["unit"].upper() or "M") + 1))
    if value > MAX_MEM_BYTES:
        raise UserError(
            f"memory {text!r} is more than {MAX_MEM_BYTES >> 40}T per node, far beyond any machine: give the "
            "memory of one node (e.g. --mem 64G)"
        )
    if problem := mem_problem(text):
        raise UserError(problem)
    return value


def mem_text(value: int) -> str:
    """Bytes -> the size as typed, in the largest unit that holds it exactly (16G, 1536M, 1500K): how a job's memory
    is written back (job.yaml) and said."""
    if value == 0:
        return "0"
    for exponent in range(len(_MEM_UNITS), 0, -1):
        if value % (1 << (10 * exponent)) == 0:
            return f"{value >> (10 * exponent)}{_MEM_UNITS[exponent - 1]}"
    return f"{-(-value // 1024)}K"  # whole bytes are never typed: the next kilobyte up


def mem_problem(mem: str | None) -> str | None:
    """A memory size without a unit that is surely not meant as megabytes (--mem 16 is 16 MB): refused, naming both
    readings."""
    m = _MEM_RE.match(mem.strip()) if isinstance(mem, str) else None
    if m is None or m["unit"] or not 0 < int(m["n"]) < 1024:
        return None
    n = int(m["n"])
    return (
        f"--mem {mem} has no unit, which reads as {n} MB, too little for any training job: write "
        f"--mem {n}G for {n} GB (or --mem {n}M if you do mean megabytes)"
    )


def parse_nodes(value: int | str) -> tuple[int | None, int | str]:
    """--nodes N or MIN:MAX (a job file's `nodes: 2` or `nodes: "1:2"`) -> (the fewest nodes an elastic job keeps
    training on, or None for a fixed count; the nodes asked for). MIN:MAX with MIN == MAX is the fixed count."""
    if isinstance(value, int) and not isinstance(value, bool):
        return None, value
    plain = value.strip() if isinstance(value, str) else ""
    if re.fullmatch(r"[+-]?\d+", plain):  # a count, whatever its size: the job description's checks say what is wrong
        return None, int(plain) if len(plain) <= 30 else value
    m = re.fullmatch(r"\s*(\d{1,9})\s*(?::\s*(\d{1,9})\s*)?", value) if isinstance(value, str) else None
    if not m:
        raise UserError(
            f"--nodes {value!r} is neither a node count nor MIN:MAX: write --nodes 4, or --nodes 2:4 for an elastic "
            "job that keeps training on 2 to 4 nodes"
        )
    if m[2] is None:
        return None, int(m[1])
    low, high = int(m[1]), int(m[2])
    if low > high:
        raise UserError(f"--nodes {value}: MIN is more than MAX; write --nodes {high}:{low}")
    return (None if low == high else low), high


def check_node_name(name: str) -> None:
    """One node named by --exclude-nodes: a plain name (no list, range or pattern)."""
    if not is_node_name(name):
        raise UserError(
            f"--exclude-nodes: {name!r} is not a node name; give names as sinfo or `kubectl get nodes` "
            "shows them, comma-separated (e.g. --exclude-nodes node07,node12), without ranges"
        )
