"""Parsing of what Slurm prints: `scontrol show ... -o` records of nodes and partitions, squeue's fields (Fields),
and the time and size values.

A node or partition record is one line: `Key=Value Key=Value ...`, written by the cluster's administrators and
the controller. Values may contain spaces (`OS=Linux 6.1 #1 SMP`, `Reason=Not responding [root@...]`), so a value
runs until the next ` Key=`, not the next space. A job's record also holds what its owner wrote (its name, paths,
comment: any byte but NUL), so jobs are read from squeue through Fields instead.
"""

from __future__ import annotations

import functools
import operator
import re
import secrets
from dataclasses import dataclass, field

from hpctrain.errors import UserError
from hpctrain.schedulers.slurm.grammar import slurm_duration_s, slurm_size_mb

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


@functools.lru_cache(maxsize=16)  # one pattern per key set: the callers' few constant sets
def _keys_pattern(keys: frozenset[str]) -> re.Pattern[str]:
    """` KEY=VALUE` for the keys, VALUE running to the next space; where what follows the value is neither the line's
    end nor spaces then a key (the value itself holds a space), the VALUE caught ends with a space."""
    names = "|".join(sorted(map(re.escape, keys)))
    key = r"[A-Za-z][A-Za-z0-9_/:]*="  # _FIELD_RE's key
    return re.compile(rf" ({names})=([^ ]*(?:(?= *$| +{key})| ))")


def pick_record(line: str, keys: frozenset[str], spaced: bool = False) -> dict[str, str]:
    """`{k: v for k, v in parse_record(line).items() if k in keys}`, without splitting the whole line: each key's
    first ` KEY=` and the value after it, up to the next space (a node record's keys that parse_nodes reads have
    values without spaces: names, states, counts, GRES). In a line whose only whitespace is the space, a key starts a
    field in parse_record exactly where a space comes before it, so the first ` KEY=` is the key's first field there
    too, and its value runs to the next space when spaces then a key, or the line's end, follow it. Otherwise (a
    value that holds a space, a line with other whitespace) the line is split by parse_record. One regular-expression
    scan a line for the few keys wanted: 10,000 node records in a third of parse_record's time.
    `spaced`: the caller has checked that the space is the line's only whitespace (parse_records, once a text)."""
    if not (spaced or (line.isascii() and line.isprintable())):  # ASCII, no control character: only the space
        return {k: v for k, v in parse_record(line).items() if k in keys}
    found = dict(reversed(_keys_pattern(keys).findall(" " + line)))  # reversed: the first of a key wins
    if " " in "".join(found.values()):
        return {k: v for k, v in parse_record(line).items() if k in keys}
    return found


def parse_records(text: str, keys: frozenset[str] | None = None) -> list[dict[str, str]]:
    """One record per non-empty line (the `-o` one-liner form); with `keys`, each holding only those (pick_record)."""
    lines = [line for line in text.splitlines() if line.strip() and "=" in line]
    if keys is None:
        return [parse_record(line) for line in lines]
    # Whitespace is str.isspace's (_FIELD_RE's `\s`, what str.strip removes): in ASCII the space, the tab, \x1f and
    # the line ends that splitlines splits at (\n, \r, \x0b, \x0c, \x1c-\x1e). Without a tab or \x1f in an ASCII text,
    # its lines hold no whitespace but the space.
    spaced = text.isascii() and "\t" not in text and "\x1f" not in text
    return [pick_record(line, keys, spaced) for line in lines]


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
    and the arithmetic are grammar.py's (slurm_duration_s); ValueError for anything else."""
    return None if _unset(text) else slurm_duration_s(text)


@functools.lru_cache(maxsize=1024)  # 10,000 nodes print a few distinct sizes
def printed_mem_mb(text: str | None) -> int | None:
    """Memory as Slurm prints it (`9642`, `9642M`, `16G`, `1.50G`) -> megabytes; None when unset or unlimited. The
    forms and the arithmetic are grammar.py's (slurm_size_mb); ValueError for anything else."""
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


class UnsplittableOutput(UserError):
    """A Slurm client's output did not split into the fields asked for."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what} printed text that does not split into the fields hpctrain asked for (a field held this "
            "query's random separator, or the client printed something else): run the command again; if it "
            "persists, report it with the output of the same command"
        )


def new_token() -> str:
    """A separator for one query: the unit separator then 16 random hex digits, 64 bits drawn after every job name
    already exists, so no name can have been made to hold it (sbatch takes every byte but NUL in a job name, up to
    1,024 of them, and in its paths and comment: no separator fixed in advance is safe from them). It starts with a
    character that is neither a digit nor `.`: squeue reads a field's width and justification from the digits right
    after its `:`, and the suffix from what follows (_parse_long_token in src/squeue/opts.c)."""
    return "\x1f" + secrets.token_hex(8)


@dataclass(frozen=True)
class Fields:
    """A field list for squeue's `--Format` and the reader of what squeue prints for it, made so that nothing a user
    puts in a job's name, paths or comment can move a field, hide a job or make one.

    squeue prints each field followed by its suffix (`Field:SUFFIX`: the value unpadded at width 0, then the suffix;
    _print_str in src/squeue/print.c), a line end after each job. Every field here ends with `token`, random for
    this query, so the whole text splits at the token into (number of jobs) x (fields) + 1 pieces: field i of job r
    is piece r * fields + i, the first field of every job but the first starts with the line end of the job before
    it, and the last piece is the line end after the last job. Those counts are checked: text that does not split so
    raises UnsplittableOutput rather than giving a job nobody printed. One split of the whole text, then a slice a
    field: no step a job (`status --all-users`: 100,000 jobs).

    The proof is tests/test_slurm_text.py: real jobs whose names hold every byte 1-255 and every Unicode line and
    format separator, read back field for field."""

    names: tuple[str, ...]
    token: str = field(default_factory=new_token)

    def squeue_option(self) -> str:
        """squeue's `--Format=`: every field ended by the token."""
        return "--Format=" + ",".join(f"{f}:{self.token}" for f in self.names)

    def columns(self, text: str, what: str = "squeue") -> list[list[str]]:
        """squeue's text for squeue_option() -> one list a field (in `names` order), one item a job, in squeue's
        order; the values as printed (the first field without the line end before it)."""
        n = len(self.names)
        pieces = text.split(self.token)
        count = (len(pieces) - 1) // n
        if (
            (len(pieces) - 1) % n
            or pieces[-1].strip("\n")
            or not all(map(operator.methodcaller("startswith", "\n"), pieces[n : n * count : n]))
        ):
            raise UnsplittableOutput(what)
        first = [pieces[0], *(piece[1:] for piece in pieces[n : n * count : n])] if count else []
        return [first, *(pieces[i : n * count : n] for i in range(1, n))]
