"""Parsing of `scontrol show ... -o` records and of the time and size values Slurm prints.

One record per line: `Key=Value Key=Value ...`. Values may contain spaces (`OS=Linux 6.1 #1 SMP`,
`Reason=Not responding [root@...]`), so a value runs until the next ` Key=`, not the next space.
"""

from __future__ import annotations

import functools
import re

from hpctrain.jobs.values import slurm_duration_s, slurm_size_mb

# A key starts a new field only after whitespace: letters, digits and the odd `/`, `:` or `_`
# (`CPUs/Task=`, `AllocNode:Sid=`, `NtasksPerN:B:S:C=`).
_FIELD_RE = re.compile(r"(?:^|\s+)([A-Za-z][A-Za-z0-9_/:]*)=")
# What Slurm prints for "no value" or "no limit" where a time or a size would stand.
_UNSET = {"", "UNLIMITED", "INFINITE", "INFINITY", "N/A", "NONE", "(NULL)", "UNKNOWN"}


def parse_record(line: str) -> dict[str, str]:
    """`A=1 B=two words C=` -> {'A': '1', 'B': 'two words', 'C': ''}. A key seen twice keeps its first value
    (the repeated per-node fields of `scontrol -d show job` are read by field_groups). One regular-expression
    split a line (keys and the values between them), no Python step a field: 10,000 node records of 35 fields."""
    parts = _FIELD_RE.split(line)
    keys, values = parts[1::2], map(str.strip, parts[2::2])
    if len(set(keys)) == len(keys):
        return dict(zip(keys, values))
    fields: dict[str, str] = {}
    for key, value in zip(keys, values):
        fields.setdefault(key, value)
    return fields


def field_groups(line: str, first: str, keys: tuple[str, ...]) -> list[dict[str, str]]:
    """Repeated groups in one record: each `first=` starts a group holding the `keys` that follow it.
    Used for the per-node lines of `scontrol -d show job -o` (`Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0)`)."""
    matches = list(_FIELD_RE.finditer(line))
    groups: list[dict[str, str]] = []
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        key, value = m.group(1), line[m.end() : end].strip()
        if key == first:
            groups.append({key: value})
        elif groups and key in keys and key not in groups[-1]:
            groups[-1][key] = value
    return groups


def parse_records(text: str) -> list[dict[str, str]]:
    """One record per non-empty line (the `-o` one-liner form)."""
    return [parse_record(line) for line in text.splitlines() if line.strip() and "=" in line]


def _unset(text: str | None) -> bool:
    return text is None or text.strip().upper() in _UNSET


def printed_duration(text: str | None) -> int | None:
    """A Slurm duration as scontrol/squeue print it -> seconds; None for UNLIMITED, N/A, NONE or empty. The forms
    and the arithmetic are jobs/values.py's (slurm_duration_s); ValueError for anything else."""
    return None if _unset(text) else slurm_duration_s(text)


@functools.lru_cache(maxsize=1024)  # 10,000 nodes print a few distinct sizes
def printed_mem_mb(text: str | None) -> int | None:
    """Memory as Slurm prints it (`9642`, `9642M`, `16G`, `1.50G`) -> megabytes; None when unset or unlimited. The
    forms and the arithmetic are jobs/values.py's (slurm_size_mb); ValueError for anything else."""
    return None if _unset(text) else slurm_size_mb(text)


def parse_int(text: str | None, default: int = 0) -> int:
    """Counts such as CPUTot=2; `N/A`, `UNLIMITED` or missing -> default."""
    if text is None:
        return default
    try:
        return int(text.strip())
    except ValueError:
        return default


NULLS = frozenset({"", "(null)", "N/A", "None", "n/a"})
"""Slurm's empty markers."""


def null(text: str | None) -> str | None:
    """Slurm's empty markers (`(null)`, `N/A`, `None`, ``) -> None."""
    if text is None:
        return None
    value = text.strip()
    return None if value in NULLS else value


# squeue --Format fields each end with this separator (a control character no job name, user or reason holds), so
# a line splits into its fields whatever spaces they contain.
SQUEUE_SEP = "\x1f"


def squeue_format(fields: tuple[str, ...]) -> str:
    """squeue's `--Format=` option for `fields`, each ending with SQUEUE_SEP."""
    return "--Format=" + ",".join(f"{f}:{SQUEUE_SEP}" for f in fields)
