"""A job's values in their textual forms: time limits, memory sizes and `--gres` (read in the forms Slurm users
type, which the Kubernetes backend reads too), and the upper bounds of what one job may ask for.

Pure functions of their text; a value that cannot be read faithfully is a UserError that shows the accepted forms.
What can be written on an #SBATCH line is Slurm's to check (hpctrain.schedulers.slurm.directives).
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction

from hpctrain.distributed.hostlist import is_node_name
from hpctrain.errors import UserError

# Slurm's time forms (sbatch --time, and what scontrol/squeue print): MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_TIME_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
_TIME_RE = re.compile(r"^(?:(?P<d>\d+)-)?(?P<rest>\d+(?::\d+){0,2})$")
# Slurm's memory sizes: a number (scontrol prints `1.50G`; sbatch takes whole numbers), a unit, an optional B.
_SIZE_RE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>[KMGTP]?)B?$", re.IGNORECASE)
_MEM_RE = re.compile(r"^(?P<n>\d+)(?P<unit>[KMGT]?)B?$", re.IGNORECASE)  # what sbatch --mem accepts
_MB_PER = {
    "K": Fraction(1, 1024),
    "": Fraction(1),
    "M": Fraction(1),
    "G": Fraction(1024),
    "T": Fraction(1024**2),
    "P": Fraction(1024**3),
}
# A GRES count: a number with an optional K, M, G, T or P, each a multiple of 1024 (sbatch --gres documents it).
_GRES_COUNT_RE = re.compile(r"^(?P<n>\d{1,30})(?P<unit>[KMGTP]?)$", re.IGNORECASE)


def slurm_duration_s(text: str) -> int:
    """A Slurm time in one of its forms -> seconds; ValueError for anything else. A bare number is minutes (as
    sbatch reads it); with a day, D-HH is hours. The one reader of Slurm times: parse_time_limit (what a user gives)
    and schedulers/slurm/records.py (what Slurm prints) both go through it."""
    m = _TIME_RE.match(text.strip()) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"not a Slurm time: {text!r}")
    parts = [int(p) for p in m["rest"].split(":")]
    if m["d"] is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        hours, minutes, seconds = parts + [0] * (3 - len(parts))
    elif len(parts) == 1:  # MM
        hours, minutes, seconds = 0, parts[0], 0
    else:  # MM:SS, HH:MM:SS
        hours, minutes, seconds = [0] * (3 - len(parts)) + parts
    return ((int(m["d"] or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def parse_time_limit(text: str) -> int:
    """Slurm time limit -> seconds. A bare number is minutes (as sbatch reads it)."""
    try:
        total = slurm_duration_s(text)
    except ValueError:
        raise UserError(f"time limit {text!r} is not a Slurm time: use {_TIME_FORMS} (e.g. --time 01:30:00)") from None
    if total <= 0:
        raise UserError(f"time limit {text!r} is zero: give a positive time, e.g. --time 30 (minutes) or 02:00:00")
    return total


@functools.lru_cache(maxsize=8192)  # a list of 100,000 jobs repeats a few thousand durations
def format_duration(seconds: int | None) -> str:
    """Seconds -> D-HH:MM:SS (or HH:MM:SS below a day), the form squeue prints; None (no limit) -> UNLIMITED."""
    if seconds is None:
        return "UNLIMITED"
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    hms = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{hms}" if days else hms


def slurm_size_mb(text: str) -> int:
    """A Slurm memory size -> whole megabytes, rounded up as sbatch rounds K (1500K is 2 MB): `4000` (M is the
    default unit), `4000M`, `16G`, `16GB`, `1.50G` as scontrol prints it; ValueError for anything else. The one
    reader of Slurm sizes: parse_mem_mb (what a user gives) and records.py (what Slurm prints) go through it."""
    m = _SIZE_RE.match(text.strip()) if isinstance(text, str) else None
    if not m or len(m["n"]) > 30:
        raise ValueError(f"not a Slurm memory size: {text!r}")
    return math.ceil(Fraction(m["n"]) * _MB_PER[m["unit"].upper()])


def gres_fields(entry: str) -> tuple[str, str | None, int]:
    """One GRES entry without its detail in parentheses, `name[:type][:flags]:count`, -> (name, type, count):
    `gpu:2`, `gpu:a100:2`, `shard:(null):1` (Slurm's "no type"), `bandwidth:lustre:no_consume:4G` (a count with
    K, M, G, T or P is a multiple of 1024). ValueError for anything else. The one reader of GRES entries:
    parse_gres (what a user gives) and schedulers/slurm/gres.py (what Slurm prints) go through it."""
    fields = entry.split(":")
    if len(fields) < 2 or not fields[0]:
        raise ValueError(f"GRES entry {entry!r} is not name[:type]:count")
    m = _GRES_COUNT_RE.match(fields[-1])
    if not m:
        raise ValueError(f"bad GRES count {fields[-1]!r} in {entry!r}")
    # Between name and count: the type, and flags such as no_consume. `(null)` is Slurm's "no type".
    middle = [f for f in fields[1:-1] if f and f not in {"(null)", "no_consume"}]
    return fields[0], middle[0] if middle else None, int(m["n"]) * 1024 ** "_KMGTP".find(m["unit"].upper() or "_")


# Upper bounds of what one job can ask for: far beyond any machine, and low enough that a typo (or a hostile job
# file) never reaches a manifest, a sbatch line or an integer overflow downstream.
MAX_NODES = 100_000
MAX_PROCS_PER_NODE = 1024
MAX_GPUS_PER_NODE = 1024
MAX_CPUS_PER_TASK = 16_384
MAX_MEM_MB = 1 << 30  # 1 PiB per node


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


def parse_mem_mb(text: str) -> int:
    """Slurm memory per node (4000, 4000M, 16G, 1T: units K/M/G/T, M by default) -> megabytes (0: the whole node)."""
    m = _MEM_RE.match(text.strip()) if isinstance(text, str) else None
    if not m or len(m["n"]) > 30:
        raise UserError(
            f"memory {text!r} is not a Slurm size: use a number with an optional unit K, M, G or T (e.g. --mem 16G)"
        )
    mb = slurm_size_mb(text)  # 0: sbatch's --mem=0, all the memory of each node
    if mb > MAX_MEM_MB:
        raise UserError(
            f"memory {text!r} is more than {MAX_MEM_MB >> 20}T per node, far beyond any machine: give the "
            "memory of one node (e.g. --mem 64G)"
        )
    return mb


def parse_gres(text: str) -> tuple[int, str | None, int]:
    """`gpu:2`, `gpu:a100:2`, `shard:16` (comma-separated to combine) -> (gpus, gpu type, shards) per node."""
    gpus, gpu_type, shards = 0, None, 0
    for item in str(text).split(","):
        try:
            name, kind, count = gres_fields(item.strip())
        except ValueError:
            name, kind, count = "", None, 0
        if name == "gpu" and count > 0 and item.count(":") <= 2:
            gpus, gpu_type = count, kind
        elif name == "shard" and count > 0 and item.count(":") == 1:
            shards = count
        else:
            raise UserError(
                f"--gres {text!r}: use gpu:N, gpu:TYPE:N or shard:N with N >= 1 (e.g. --gres gpu:a100:2 or "
                "--gres shard:16); "
                "other generic resources go in an extra #SBATCH line (--sbatch '--gres=...')"
            )
    if gpus and shards:
        raise UserError(f"--gres {text!r} asks for both whole GPUs and shards: choose gpu:N or shard:N")
    return gpus, gpu_type, shards


def check_node_name(name: str) -> None:
    """One node named by --exclude-nodes: a plain name (no list, range or pattern)."""
    if not is_node_name(name):
        raise UserError(
            f"--exclude-nodes: {name!r} is not a node name; give names as sinfo or `kubectl get nodes` "
            "shows them, comma-separated (e.g. --exclude-nodes node07,node12), without ranges"
        )


def mem_problem(mem: str | None) -> str | None:
    """A memory size without a unit that is surely not meant as megabytes (--mem 16 is 16 MB to sbatch): refused,
    naming both readings."""
    m = _MEM_RE.match(mem.strip()) if isinstance(mem, str) else None
    if m is None or m["unit"] or not 0 < int(m["n"]) < 1024:
        return None
    n = int(m["n"])
    return (
        f"--mem {mem} has no unit, and sbatch would read it as {n} MB, too little for any training job: write "
        f"--mem {n}G for {n} GB (or --mem {n}M if you do mean megabytes)"
    )
