"""Parsing of `scontrol show ... -o` records and of the time and size values Slurm prints.

One record per line: `Key=Value Key=Value ...`. Values may contain spaces (`OS=Linux 6.1 #1 SMP`,
`Reason=Not responding [root@...]`), so a value runs until the next ` Key=`, not the next space.
"""

from __future__ import annotations

import re

# A key starts a new field only after whitespace: letters, digits and the odd `/`, `:` or `_`
# (`CPUs/Task=`, `AllocNode:Sid=`, `NtasksPerN:B:S:C=`).
_FIELD_RE = re.compile(r"(?:^|\s+)([A-Za-z][A-Za-z0-9_/:]*)=")
_UNLIMITED = {"UNLIMITED", "INFINITE", "INFINITY"}
_DURATION_RE = re.compile(r"^(?:(?P<d>\d+)-)?(?P<rest>\d+(?::\d+){0,2})$")


def parse_record(line: str) -> dict[str, str]:
    """`A=1 B=two words C=` -> {'A': '1', 'B': 'two words', 'C': ''}. A key seen twice keeps its first value
    (the repeated per-node fields of `scontrol -d show job` are read by field_groups)."""
    matches = list(_FIELD_RE.finditer(line))
    fields: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields.setdefault(m.group(1), line[m.end() : end].strip())
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


def parse_duration(text: str | None) -> int | None:
    """A Slurm duration as scontrol/squeue print it -> seconds; None for UNLIMITED, N/A, NONE or empty.

    Forms: SS is not used by Slurm's printers, so a lone number is minutes (as sbatch reads it); MM:SS;
    HH:MM:SS; D-HH; D-HH:MM; D-HH:MM:SS."""
    if text is None:
        return None
    value = text.strip()
    if not value or value.upper() in _UNLIMITED or value.upper() in {"N/A", "NONE", "(NULL)", "UNKNOWN"}:
        return None
    m = _DURATION_RE.match(value)
    if not m:
        raise ValueError(f"not a Slurm duration: {text!r}")
    parts = [int(p) for p in m["rest"].split(":")]
    days = int(m["d"]) if m["d"] else 0
    if m["d"]:
        parts += [0] * (3 - len(parts))  # D-HH, D-HH:MM
        hours, minutes, seconds = parts
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    elif len(parts) == 2:
        hours, (minutes, seconds) = 0, parts
    else:
        hours, minutes, seconds = 0, parts[0], 0
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def format_duration(seconds: int | None) -> str:
    """Seconds -> `[D-]HH:MM:SS`, the form Slurm prints; None -> `UNLIMITED`."""
    if seconds is None:
        return "UNLIMITED"
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    hms = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{hms}" if days else hms


_SIZE_RE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>[KMGTP]?)$", re.IGNORECASE)
_UNIT_MB = {"": 1.0, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0**2, "P": 1024.0**3}


def parse_mem_mb(text: str | None) -> int | None:
    """Memory as Slurm prints it (`9642`, `9642M`, `16G`) -> megabytes; None when unset or unlimited."""
    if text is None:
        return None
    value = text.strip()
    if not value or value.upper() in _UNLIMITED or value.upper() in {"N/A", "(NULL)"}:
        return None
    m = _SIZE_RE.match(value)
    if not m:
        raise ValueError(f"not a Slurm memory size: {text!r}")
    return int(float(m["n"]) * _UNIT_MB[m["unit"].upper()])


def parse_int(text: str | None, default: int = 0) -> int:
    """Counts such as CPUTot=2; `N/A`, `UNLIMITED` or missing -> default."""
    if text is None:
        return default
    try:
        return int(text.strip())
    except ValueError:
        return default


def null(text: str | None) -> str | None:
    """Slurm's empty markers (`(null)`, `N/A`, `None`, ``) -> None."""
    if text is None:
        return None
    value = text.strip()
    return None if value in {"", "(null)", "N/A", "None", "n/a"} else value
