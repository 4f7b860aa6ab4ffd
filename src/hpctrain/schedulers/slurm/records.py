"""Parsing of `scontrol show ... -o` records and of the time and size values Slurm prints.

One record per line: `Key=Value Key=Value ...`. Values may contain spaces (`OS=Linux 6.1 #1 SMP`,
`Reason=Not responding [root@...]`), so a value runs until the next ` Key=`, not the next space.
"""

from __future__ import annotations

import functools
import operator
import re
import secrets
from dataclasses import dataclass, field

from hpctrain.errors import UserError
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


def expand_pattern(pattern: str, job_id: str, name: str | None = None, user: str | None = None) -> str:
    """sbatch's filename pattern: %j/%A job id, %a array index, %x job name, %u user, %% a percent; others (the
    per-node and per-task %N %n %t %s) are left as they are."""
    array_id, _, index = job_id.partition("_")
    values = {"j": job_id, "A": array_id, "x": name, "u": user, "%": "%", "a": index or None}
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "%" and i + 1 < len(pattern):
            value = values.get(pattern[i + 1])
            if value is not None:
                out.append(value)
                i += 2
                continue
        out.append(ch)
        i += 1
    return "".join(out)


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


# Fields a Slurm client prints as it keeps them: digits, state words, durations, times, and names the cluster's
# administrators chose (nodes, partitions, users, GRES). None of them holds a control character or a line end.
FIXED_SEP = "\x1f"

# Fields whose text anyone who submits a job chooses (sbatch takes every byte but NUL in a job name, up to 1,024 of
# them, and in its paths and comment), or that the controller fills with free text (a job's reason may be a
# message): no separator chosen in advance is safe from them.
FREE_TEXT = frozenset(
    {"name", "reason", "workdir", "stdout", "stderr", "stdin", "comment", "command", "jobname", "submitline"}
)


class UnsplittableOutput(UserError):
    """A Slurm client's output did not split into the fields asked for."""


def new_token() -> str:
    """A separator for one query: the unit separator then 16 random hex digits (64 bits drawn after every job
    name already exists, so no name can have been made to hold it). It starts with a character that is not a digit
    or `.`: squeue reads a field's width and justification from the digits right after its `:`."""
    return FIXED_SEP + secrets.token_hex(8)


@dataclass(frozen=True)
class Fields:
    """A field list for a Slurm client's own format option (squeue --Format, sacct --format) and the reader of
    what it prints, made so that nothing a user puts in a job's name, paths or comment can move a field or make a
    record.

    squeue prints each field followed by its suffix (`Field:SUFFIX`, no padding), a line end after each job. The
    fields in `fixed` come first, each ended by FIXED_SEP, which none of them can hold; then the free-text fields,
    each ended by `token`, random for this query. The whole text splits at the token into (number of jobs) x
    (free fields) + 1 pieces; the first piece of each job is `<line end>FIXED\x1f...\x1fFIXED\x1fFREE`, split
    at the fixed separator at most len(fixed) times, so the first free field keeps any \x1f or line end of its
    own; the last piece is the line end after the last job. Each count is checked: text that does not split so
    raises UnsplittableOutput rather than giving a record nobody printed.

    The proof is tests/test_slurm_text.py: real jobs whose names hold every byte 1-255 and every Unicode line and
    format separator, read back field for field."""

    names: tuple[str, ...]  # in the caller's order: rows and columns come back in it
    token: str = field(default_factory=new_token)

    @property
    def fixed(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n.lower() not in FREE_TEXT)

    @property
    def free(self) -> tuple[str, ...]:
        return tuple(n for n in self.names if n.lower() in FREE_TEXT)

    def squeue_option(self) -> str:
        """squeue's `--Format=`: the fixed fields each ended by FIXED_SEP, then the free ones each by the token."""
        return "--Format=" + ",".join(
            [f"{f}:{FIXED_SEP}" for f in self.fixed] + [f"{f}:{self.token}" for f in self.free]
        )

    def columns(self, text: str, what: str = "squeue") -> list[list[str]]:
        """squeue's text for squeue_option() -> one list a field (in `names` order), one item a job, in squeue's
        order; fixed fields stripped, free text as printed. One split of the whole text and one a job."""
        fixed, free = self.fixed, self.free
        k, m = len(fixed), len(free)
        if m == 0:
            rows = [line.split(FIXED_SEP) for line in text.splitlines() if line.strip()]
            if any(len(row) != k + 1 or row[-1].strip() for row in rows):
                raise UnsplittableOutput(_unsplittable(what))
            by_name = {f: [row[i].strip() for row in rows] for i, f in enumerate(fixed)}
            return [by_name[n] for n in self.names]
        pieces = text.split(self.token)
        count = (len(pieces) - 1) // m
        if (len(pieces) - 1) % m or pieces[-1].strip():
            raise UnsplittableOutput(_unsplittable(what))
        heads = [piece.split(FIXED_SEP, k) for piece in pieces[0 : m * count : m]]
        if any(len(head) != k + 1 for head in heads) or not all(
            map(operator.methodcaller("startswith", "\n"), pieces[m : m * count : m])
        ):
            raise UnsplittableOutput(_unsplittable(what))
        by_name = {f: [str.strip(head[i]) for head in heads] for i, f in enumerate(fixed)}
        by_name[free[0]] = [head[k] for head in heads]
        for j, f in enumerate(free[1:], 1):
            by_name[f] = pieces[j : m * count : m]
        return [by_name[n] for n in self.names]

    def rows(self, text: str, what: str = "squeue") -> list[tuple[str, ...]]:
        """columns() a job at a time: each a tuple in `names` order."""
        return list(zip(*self.columns(text, what)))


def _unsplittable(what: str) -> str:
    return (
        f"{what} printed text that does not split into the fields hpctrain asked for (a field held this query's "
        "random separator, or the client printed something else): run the command again; if it persists, report "
        "it with the output of the same command"
    )
