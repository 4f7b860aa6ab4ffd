"""Slurm hostlist expressions (``node[1-3,7]``, ``gpu-a[01-02],gpu-b5``) parsed by hand.

We never shell out to ``scontrol show hostnames``: detection runs in every rank at
start-up, must be cheap, and must work where Slurm's binaries are not on PATH
(containers launched by srun). Pure Python, no imports beyond the standard library.

Grammar (what Slurm writes into SLURM_JOB_NODELIST / SLURM_STEP_NODELIST)::

    hostlist := item ("," item)*
    item     := (text | "[" ranges "]")+
    ranges   := range ("," range)*
    range    := digits | digits "-" digits

A range keeps the zero padding of its lower bound (``[08-10]`` -> 08, 09, 10).
Several bracket groups in one item form a product, leftmost group slowest
(``rack[1-2]-n[01-02]`` -> rack1-n01, rack1-n02, rack2-n01, rack2-n02).
"""

from __future__ import annotations

import itertools
import re

__all__ = ["expand_hostlist", "expand_tasks_per_node", "first_host", "is_node_name"]

# A node's name as Slurm and Kubernetes (kubernetes.io/hostname) both write it: letters, digits, '.', '-', '_'.
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}", re.ASCII)


def is_node_name(name: object) -> bool:
    """Whether `name` is one plain node name (no list, range, pattern, space or shell character): what a node name
    read from a pod, a record or a file must be before hpctrain prints it in a command or acts on it."""
    return isinstance(name, str) and _NODE_NAME.fullmatch(name) is not None


# One parsed range: (low, high, width) where width is the zero-pad width.
_Range = tuple[int, int, int]
# One item: literal text pieces and bracket groups (a list of ranges), in order.
_Item = list["str | list[_Range]"]

# Guards against typos such as node[1-1000000000] eating all memory.
_MAX_HOSTS = 1_000_000

# One entry of SLURM_TASKS_PER_NODE: a count, optionally repeated ("2(x3)").
_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?", re.ASCII)


def _bad(text: str, why: str) -> ValueError:
    return ValueError(f"invalid Slurm hostlist {text!r}: {why}")


def _parse_range(text: str, spec: str) -> _Range:
    lo_s, sep, hi_s = spec.partition("-")
    if not sep:
        hi_s = lo_s
    if not lo_s or not hi_s:
        raise _bad(text, f"empty bound in range {spec!r}")
    if not (lo_s.isascii() and lo_s.isdigit() and hi_s.isascii() and hi_s.isdigit()):
        raise _bad(text, f"range {spec!r} is not numeric (expected e.g. 1-4 or 01-04)")
    lo, hi = int(lo_s), int(hi_s)
    if hi < lo:
        raise _bad(text, f"range {spec!r} is reversed (write {hi_s}-{lo_s})")
    return lo, hi, len(lo_s)


def _parse(text: str) -> list[_Item]:
    """Split into items at top-level commas/whitespace and parse each item's groups."""
    if not isinstance(text, str):
        raise TypeError(f"hostlist must be a str, not {type(text).__name__}")
    if not text.strip():
        raise _bad(text, "it is empty")
    items: list[_Item] = []
    item: _Item = []
    literal: list[str] = []
    lead = len(text) - len(text.lstrip())
    body_text = text.strip()
    after_space = False  # the previous item was closed by whitespace, so a comma may follow

    def end_item() -> None:
        if literal:
            item.append("".join(literal))
            literal.clear()
        if not item:
            raise _bad(text, "empty host name (doubled or stray comma)")
        items.append(list(item))
        item.clear()

    i, n = 0, len(body_text)
    while i < n:
        ch = body_text[i]
        if ch == "[":
            close = body_text.find("]", i + 1)
            nested = body_text.find("[", i + 1)
            if close < 0 or (0 <= nested < close):
                raise _bad(text, f"unbalanced '[' at position {i + lead}")
            inner = body_text[i + 1 : close]
            if not inner.strip():
                raise _bad(text, f"empty brackets at position {i + lead}")
            if literal:
                item.append("".join(literal))
                literal.clear()
            item.append([_parse_range(text, part.strip()) for part in inner.split(",")])
            i = close + 1
            after_space = False
            continue
        if ch == "]":
            raise _bad(text, f"unbalanced ']' at position {i + lead}")
        if ch.isspace():
            # Slurm also accepts whitespace as a separator ("a b", "a, b").
            if literal or item:
                end_item()
                after_space = True
        elif ch == ",":
            if literal or item:
                end_item()
            elif not after_space:
                raise _bad(text, f"empty host name at position {i + lead} (doubled or stray comma)")
            after_space = False
        else:
            literal.append(ch)
            after_space = False
        i += 1
    end_item()
    return items


def _group_values(group: list[_Range]) -> list[str]:
    return [str(v).zfill(w) for lo, hi, w in group for v in range(lo, hi + 1)]


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm hostlist into host names, in order (duplicates kept).

    Raises ValueError naming ``text`` for empty or malformed input.
    """
    hosts: list[str] = []
    for item in _parse(text):
        size = 1
        for part in item:
            if isinstance(part, list):
                size *= sum(hi - lo + 1 for lo, hi, _ in part)
        if len(hosts) + size > _MAX_HOSTS:
            raise _bad(text, f"expands to more than {_MAX_HOSTS} hosts")
        choices = [[part] if isinstance(part, str) else _group_values(part) for part in item]
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return hosts


def first_host(text: str) -> str:
    """First host of a hostlist without expanding it (the whole text is still validated)."""
    first = _parse(text)[0]
    return "".join(part if isinstance(part, str) else str(part[0][0]).zfill(part[0][2]) for part in first)


def expand_tasks_per_node(text: str) -> list[int]:
    """Expand Slurm's compressed task counts (SLURM_TASKS_PER_NODE): ``"2(x3),1"`` -> ``[2, 2, 2, 1]``.

    Raises ValueError naming ``text`` when it is malformed.
    """
    counts: list[int] = []
    for part in text.split(","):
        match = _COUNT.fullmatch(part.strip())
        if not match:
            raise ValueError(f"invalid Slurm task count list {text!r}: {part.strip()!r} is not N or N(xM)")
        repeat = int(match.group(2) or 1)
        if len(counts) + repeat > _MAX_HOSTS:
            raise ValueError(f"invalid Slurm task count list {text!r}: more than {_MAX_HOSTS} nodes")
        counts.extend([int(match.group(1))] * repeat)
    return counts
