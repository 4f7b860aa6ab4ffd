"""Slurm's own value grammars: the sizes and durations Slurm prints, a GRES entry (`name[:type]:count`, in what
sinfo and scontrol print and in what `--gres` takes), and the `--mem` form sbatch takes.

Whose grammar: these are Slurm's, so they live in its backend. The neutral job description
(hpctrain.jobs.values) reads what people type for any scheduler (a time limit, a memory size) into seconds and
bytes; Slurm prints its durations in those same time forms (it is where they come from), so slurm_duration_s reads
them with that one reader rather than a second copy. A GRES request (`--gres gpu:a100:2`, `shard:16`) is Slurm's
alone: read_gres_request splits it into the neutral GPU count and Slurm's own GPU type and shards.

Pure functions of their text; ValueError (what Slurm printed) or UserError (what a user typed) for anything else.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from hpctrain.errors import UserError
from hpctrain.jobs.values import duration_s

# Slurm's memory sizes: a number (scontrol prints `1.50G`; sbatch takes whole numbers), a unit, an optional B.
_SIZE_RE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>[KMGTP]?)B?$", re.IGNORECASE)
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
    """A time as Slurm prints it (squeue's TimeLimit, scontrol's MaxTime: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM,
    D-HH:MM:SS) -> seconds; ValueError for anything else."""
    try:
        return duration_s(text)
    except ValueError:
        raise ValueError(f"not a Slurm time: {text!r}") from None


def slurm_size_mb(text: str) -> int:
    """A Slurm memory size -> whole megabytes, rounded up as sbatch rounds K (1500K is 2 MB): `4000` (M is the
    default unit), `4000M`, `16G`, `16GB`, `1.50G` as scontrol prints it; ValueError for anything else."""
    m = _SIZE_RE.match(text.strip()) if isinstance(text, str) else None
    if not m or len(m["n"]) > 30:
        raise ValueError(f"not a Slurm memory size: {text!r}")
    return math.ceil(Fraction(m["n"]) * _MB_PER[m["unit"].upper()])


def slurm_mem(mb: int) -> str:
    """Megabytes in the form sbatch --mem takes (`64G`, `1536M`; `0`: each node's whole memory)."""
    return f"{mb // 1024}G" if mb % 1024 == 0 and mb else f"{mb}M" if mb else "0"


def mem_mb(mem_bytes: int) -> int:
    """Bytes -> the whole megabytes Slurm counts memory in, rounded up (as sbatch rounds a size in K)."""
    return -(-mem_bytes // (1 << 20))


def gres_fields(entry: str) -> tuple[str, str | None, int]:
    """One GRES entry without its detail in parentheses, `name[:type][:flags]:count`, -> (name, type, count):
    `gpu:2`, `gpu:a100:2`, `shard:(null):1` (Slurm's "no type"), `bandwidth:lustre:no_consume:4G` (a count with
    K, M, G, T or P is a multiple of 1024). ValueError for anything else. The one reader of GRES entries:
    read_gres_request (what a user gives) and gres.py (what Slurm prints) go through it."""
    fields = entry.split(":")
    if len(fields) < 2 or not fields[0]:
        raise ValueError(f"GRES entry {entry!r} is not name[:type]:count")
    m = _GRES_COUNT_RE.match(fields[-1])
    if not m:
        raise ValueError(f"bad GRES count {fields[-1]!r} in {entry!r}")
    # Between name and count: the type, and flags such as no_consume. `(null)` is Slurm's "no type".
    middle = [f for f in fields[1:-1] if f and f not in {"(null)", "no_consume"}]
    return fields[0], middle[0] if middle else None, int(m["n"]) * 1024 ** "_KMGTP".find(m["unit"].upper() or "_")


def read_gres_request(text: str) -> tuple[int, str | None, int]:
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
