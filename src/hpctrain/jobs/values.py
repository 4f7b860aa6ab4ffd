"""A job's values in their textual forms: time limits, memory sizes and `--gres` (read in the forms Slurm users
type, which the Kubernetes backend reads too), and the upper bounds of what one job may ask for.

Pure functions of their text; a value that cannot be read faithfully is a UserError that shows the accepted forms.
What can be written on an #SBATCH line is Slurm's to check (hpctrain.schedulers.slurm.directives).
"""

from __future__ import annotations

import re

from hpctrain.distributed.hostlist import is_node_name
from hpctrain.errors import UserError

# Slurm's accepted time forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
_TIME_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
_TIME_RE = re.compile(r"^(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$")
_MEM_RE = re.compile(r"^(?P<n>\d+)(?P<unit>[KMGT]?)B?$", re.IGNORECASE)


def parse_time_limit(text: str) -> int:
    """Slurm time limit -> seconds. A bare number is minutes (as sbatch reads it)."""
    m = _TIME_RE.match(text.strip()) if isinstance(text, str) else None
    if not m:
        raise UserError(f"time limit {text!r} is not a Slurm time: use {_TIME_FORMS} (e.g. --time 01:30:00)")
    g = {k: int(v) if v is not None else None for k, v in m.groupdict().items()}
    if g["d"] is not None:
        days, hours, minutes, seconds = g["d"], g["dh"], g["dm"] or 0, g["ds"] or 0
    elif g["c"] is not None:
        days, hours, minutes, seconds = 0, g["a"], g["b"], g["c"]
    elif g["b"] is not None:
        days, hours, minutes, seconds = 0, 0, g["a"], g["b"]
    else:
        days, hours, minutes, seconds = 0, 0, g["a"], 0
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0:
        raise UserError(f"time limit {text!r} is zero: give a positive time, e.g. --time 30 (minutes) or 02:00:00")
    return total


def format_time_limit(seconds: int) -> str:
    """Seconds -> D-HH:MM:SS (or HH:MM:SS below a day), the form squeue prints."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    hms = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{hms}" if days else hms


# Upper bounds of what one job can ask for: far beyond any machine, and low enough that a typo (or a hostile job
# file) never reaches a manifest, a sbatch line or an integer overflow downstream.
MAX_NODES = 100_000
MAX_PROCS_PER_NODE = 1024
MAX_GPUS_PER_NODE = 1024
MAX_CPUS_PER_TASK = 16_384
MAX_MEM_MB = 1 << 30  # 1 PiB per node


def parse_mem_mb(text: str) -> int:
    """Slurm memory (per node): 4000, 4000M, 16G, 1T -> megabytes (0: the whole node). Units K/M/G/T; default M."""
    m = _MEM_RE.match(text.strip()) if isinstance(text, str) else None
    if not m or len(m["n"]) > 30:
        raise UserError(f"memory {text!r} is not a Slurm size: use a number with an optional unit K, M, G or T (e.g. --mem 16G)")
    n = int(m["n"])
    if n == 0:
        return 0  # sbatch's --mem=0: all the memory of each node
    unit = m["unit"].upper()
    mb = -(-n // 1024) if unit == "K" else n * {"": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[unit]  # integers only
    if mb > MAX_MEM_MB:
        raise UserError(f"memory {text!r} is more than {MAX_MEM_MB >> 20}T per node, far beyond any machine: give the "
                        "memory of one node (e.g. --mem 64G)")
    return mb


def parse_gres(text: str) -> tuple[int, str | None, int]:
    """`gpu:2`, `gpu:a100:2`, `shard:16` (comma-separated to combine) -> (gpus, gpu type, shards) per node."""
    gpus, gpu_type, shards = 0, None, 0
    for item in str(text).split(","):
        parts = item.strip().split(":")
        ok = len(parts) in (2, 3) and parts[-1].isdigit() and int(parts[-1]) > 0 and parts[0] in ("gpu", "shard")
        if ok and parts[0] == "gpu":
            gpus = int(parts[-1])
            gpu_type = parts[1] if len(parts) == 3 else None
        elif ok and len(parts) == 2:
            shards = int(parts[1])
        else:
            raise UserError(
                f"--gres {text!r}: use gpu:N, gpu:TYPE:N or shard:N with N >= 1 (e.g. --gres gpu:a100:2 or --gres shard:16); "
                "other generic resources go in an extra #SBATCH line (--sbatch '--gres=...')"
            )
    if gpus and shards:
        raise UserError(f"--gres {text!r} asks for both whole GPUs and shards: choose gpu:N or shard:N")
    return gpus, gpu_type, shards


def check_node_name(name: str) -> None:
    """One node named by --exclude-nodes: a plain name (no list, range or pattern)."""
    if not is_node_name(name):
        raise UserError(f"--exclude-nodes: {name!r} is not a node name; give names as sinfo or `kubectl get nodes` "
                        "shows them, comma-separated (e.g. --exclude-nodes node07,node12), without ranges")


def mem_problem(mem: str | None) -> str | None:
    """A memory size without a unit that is surely not meant as megabytes (--mem 16 is 16 MB to sbatch): refused,
    naming both readings."""
    m = _MEM_RE.match(mem.strip()) if isinstance(mem, str) else None
    if m is None or m["unit"] or not 0 < int(m["n"]) < 1024:
        return None
    n = int(m["n"])
    return (f"--mem {mem} has no unit, and sbatch would read it as {n} MB, too little for any training job: write "
            f"--mem {n}G for {n} GB (or --mem {n}M if you do mean megabytes)")
