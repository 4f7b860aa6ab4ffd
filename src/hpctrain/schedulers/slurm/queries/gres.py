"""Parse Slurm GRES strings as sinfo and scontrol print them (node Gres=, GresUsed=, a job's GRES=).

Forms seen in the field and on the local cluster (Slurm 20.11 up to current; tests/data/slurm/ has them by version):

    gpu:2,shard:128                                   configured, untyped
    gpu:Quadro_RTX_4000:2,shard:Quadro_RTX_4000:128   configured, typed
    gpu:a100:4(S:0-1)                                 with socket affinity
    gpu:1,shard:(null):1(IDX:0)                       in use (22.05-23.02): GPU indexes
    gpu:Quadro_RTX_4000:1(IDX:0),shard:Quadro_RTX_4000:32(0/64,32/64)   in use (23.11+): shards per GPU
    (null)                                            none

Commas separate entries but also appear inside parentheses (`IDX:0-1,3`), so the split is done by hand. An
entry's `name[:type]:count` is read by grammar.py's gres_fields, which also reads a user's --gres.
A node's GPUs are counted, and listed one by one (shards per GPU, indexes), so a count is checked for that use: at
most MAX_GPUS_PER_NODE GPUs on a node, GPU indexes below it (`gpu:99999999999999` once made `cluster` spin);
`node_usage` refuses a GRES it cannot use in one line (a UserError) rather than a traceback.
Pure functions only.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from hpctrain.errors import UserError, brief
from hpctrain.jobs.values import MAX_GPUS_PER_NODE
from hpctrain.schedulers.slurm.grammar import gres_fields

# The detail in parentheses is the last thing; `(null)` may also appear as the type.
_ENTRY_RE = re.compile(r"^(?P<head>.+?)(?:\((?P<detail>[^()]*)\))?$")
_PER_DEVICE_RE = re.compile(r"^\d+/\d+$")


@dataclass(frozen=True)
class GresEntry:
    """One `name[:type]:count[(detail)]` entry."""

    name: str
    type: str | None
    count: int
    indexes: tuple[int, ...] | None = None  # (IDX:0-1,3): which devices are in use; None when not given
    per_device: tuple[tuple[int, int], ...] | None = None  # (0/64,32/64): (used, total) per GPU, in GPU order


def split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def parse_index_list(text: str) -> tuple[int, ...] | None:
    """`0-1,3` -> (0, 1, 3); `N/A` -> ()."""
    text = text.strip()
    if text.upper() == "N/A" or not text:
        return ()
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()) or len(lo) > 9 or len(hi) > 9:
            raise ValueError(f"bad GRES index list {text!r}")
        first, last = int(lo), int(hi if sep else lo)
        if last >= MAX_GPUS_PER_NODE or len(out) + last - first >= MAX_GPUS_PER_NODE:
            raise ValueError(
                f"GRES index list {brief(text, 60)} names devices beyond the {MAX_GPUS_PER_NODE} a node holds"
            )
        out.extend(range(first, last + 1))
    return tuple(out)


def parse_entry(entry: str) -> GresEntry:
    """One GRES entry; raises ValueError on a form it does not know."""
    m = _ENTRY_RE.match(entry)
    if not m:
        raise ValueError(f"GRES entry {entry!r} is not name[:type]:count[(detail)]")
    head, detail = m["head"], m["detail"] or ""
    if "(" in head.replace("(null)", "") or ")" in head.replace("(null)", ""):
        raise ValueError(f"unbalanced parenthesis in GRES entry {entry!r}")
    name, gres_type, count = gres_fields(head)
    indexes: tuple[int, ...] | None = None
    per_device: tuple[tuple[int, int], ...] | None = None
    if detail:
        if detail.startswith("IDX:"):
            indexes = parse_index_list(detail[4:])
        elif all(_PER_DEVICE_RE.match(p.strip()) for p in detail.split(",")):
            per_device = tuple(
                (int(used), int(total)) for used, total in (p.strip().split("/") for p in detail.split(","))
            )
        # Anything else (S:0-1 socket affinity, ...) says where, not how many: ignored.
    return GresEntry(name=name, type=gres_type, count=count, indexes=indexes, per_device=per_device)


def parse_gres(text: str | None) -> list[GresEntry]:
    """A whole GRES string -> its entries (empty for `(null)`, `N/A` or nothing)."""
    if text is None:
        return []
    text = text.strip()
    if text in {"", "(null)", "N/A"}:
        return []
    return [parse_entry(e) for e in split_top_level(text)]


@dataclass(frozen=True)
class GpuUsage:
    """GPUs and shards of one node: configured totals and what is in use."""

    gpu_type: str | None
    gpus_total: int
    gpus_used: int
    shards_total: int
    shards_used: int | None  # None: this Slurm does not say (22.05 prints GPUs-with-shards, not shards)
    shards_per_gpu: tuple[tuple[int, int], ...] | None  # (used, total) per GPU index; None when unknown


def gres_count(entries: list[GresEntry], name: str) -> int:
    return sum(e.count for e in entries if e.name == name)


@functools.lru_cache(maxsize=4096)  # a big cluster's nodes share a few dozen forms: each is parsed once
def node_usage(gres: str | None, gres_used: str | None) -> GpuUsage:
    """Combine a node's Gres= and GresUsed= into totals and use per GPU (pure; the result is immutable).

    Shards in use are exact only when Slurm prints them per GPU (`32(0/64,32/64)`, Slurm 23.11+). Slurm 22.05
    and 23.02 print `shard:(null):1(IDX:0)`, where 1 counts GPUs that carry shards: then shards_used is None and
    the caller fills it from the running jobs (see query.py). A UserError, naming the GRES, for one that cannot be
    read or counts more than MAX_GPUS_PER_NODE GPUs."""
    try:
        total = parse_gres(gres)
        used = parse_gres(gres_used)
    except ValueError as err:
        raise _unusable(gres, gres_used, str(err)) from None
    gpus_total = gres_count(total, "gpu")
    if max(gpus_total, gres_count(used, "gpu")) > MAX_GPUS_PER_NODE:
        raise _unusable(gres, gres_used, f"more than the {MAX_GPUS_PER_NODE} GPUs a node can hold")
    shards_total = gres_count(total, "shard")
    gpu_type = next((e.type for e in total if e.name == "gpu" and e.type), None)
    shard_used_entries = [e for e in used if e.name == "shard"]
    shards_used: int | None
    per_gpu: tuple[tuple[int, int], ...] | None = None
    if not shards_total:
        shards_used = 0
    elif shard_used_entries and all(e.per_device is not None for e in shard_used_entries):
        pairs: list[tuple[int, int]] = []
        for e in shard_used_entries:
            pairs.extend(e.per_device or ())
        per_gpu = tuple(pairs)
        shards_used = sum(u for u, _ in pairs)
    elif shard_used_entries and all(e.count == 0 for e in shard_used_entries):
        shards_used = 0  # nothing in use: unambiguous in every version
        per_gpu = even_split(shards_total, gpus_total, {})
    else:
        shards_used = None
    return GpuUsage(
        gpu_type=gpu_type,
        gpus_total=gpus_total,
        gpus_used=gres_count(used, "gpu"),
        shards_total=shards_total,
        shards_used=shards_used,
        shards_per_gpu=per_gpu,
    )


def _unusable(gres: str | None, gres_used: str | None, why: str) -> UserError:
    return UserError(
        f"Slurm reports a node with Gres={brief(gres, 80)} GresUsed={brief(gres_used, 80)}: {why}; hpctrain cannot "
        "count that node's GPUs (ask the cluster's admins to check its gres.conf)"
    )


def even_split(shards_total: int, gpus_total: int, used_by_index: dict[int, int]) -> tuple[tuple[int, int], ...] | None:
    """(used, total) per GPU assuming the shards are spread evenly over the GPUs (what Slurm does with a
    `Name=shard Count=N` line for N divisible by the GPU count); None when that cannot be assumed."""
    if gpus_total <= 0 or shards_total % gpus_total:
        return None
    if used_by_index and (min(used_by_index) < 0 or max(used_by_index) >= gpus_total):
        return None
    each = shards_total // gpus_total
    return tuple((used_by_index.get(i, 0), each) for i in range(gpus_total))


def job_shards_by_gpu(job_gres: str | None) -> dict[int, int]:
    """Shards a running job holds on one node, per GPU index, from `scontrol -d show job`'s per-node
    `GRES=shard:16(IDX:0)`. Shards on several GPUs (`IDX:0-1`) cannot be split exactly: they are shared out
    evenly, the remainder on the first GPU."""
    return dict(_job_shards(job_gres))


@functools.lru_cache(maxsize=4096)  # the shard jobs of a big cluster ask for a few sizes on a few GPUs
def _job_shards(job_gres: str | None) -> tuple[tuple[int, int], ...]:
    out: dict[int, int] = {}
    try:
        entries = parse_gres(job_gres)
    except ValueError as err:
        raise UserError(
            f"Slurm reports a running job holding GRES={brief(job_gres, 80)}: {err}; hpctrain cannot count the "
            "shards in use (ask the cluster's admins)"
        ) from None
    for e in entries:
        if e.name != "shard" or e.count <= 0:
            continue
        idx = e.indexes or (0,)
        each, rest = divmod(e.count, len(idx))
        for k, i in enumerate(idx):
            out[i] = out.get(i, 0) + each + (rest if k == 0 else 0)
    return tuple(out.items())
