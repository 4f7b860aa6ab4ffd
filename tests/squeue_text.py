"""What squeue prints for a records.Fields query, made from a recording of the fields' values.

The squeue recordings under tests/data/slurm/ are in the one-separator form hpctrain asked for before issue 39 (each
field's value followed by \\x1f, one job a line; none of their values holds \\x1f or a line end). squeue prints each
field the same whatever else it is asked for and in whichever order (`Field:SUFFIX`: the value, unpadded at width 0,
then the suffix: _parse_long_token in src/squeue/opts.c, _print_str in src/squeue/print.c), so the text for any
Fields query over those fields is the recorded values laid out as the query asks: each field followed by the query's
token, a line end after each job.
"""

from __future__ import annotations

from hpctrain.schedulers.slurm.queries.records import Fields

TOKEN = "\x1f5eed0f0f5eed0f0f"  # a fixed token for recorded text (hpctrain draws one per query)
RECORDED_SEP = "\x1f"  # the separator of the recordings


def recorded(text: str, names: tuple[str, ...]) -> list[dict[str, str]]:
    """A recording in the one-separator form of the fields `names` -> each job's values by field name.

    The recordings made before hpctrain asked for MaxNodes (issue 42) lack it: squeue prints a job's max_nodes, or
    its node count when that is unset (_print_job_max_nodes in src/squeue/print.c), which equals NumNodes for every
    job but a pending one that asked for a node range (none of those jobs did; seen on the local 22.05 cluster:
    `--nodes=2` pending prints 2 and 2, `--nodes=1-2` pending 1 and 2, running on one node 1 and 1). For those
    recordings MaxNodes is derived from NumNodes here, said where it is done; squeue_elastic_*_22.05.txt hold it
    as recorded."""
    rows = [line.split(RECORDED_SEP) for line in text.splitlines() if line.strip()]
    short = tuple(n for n in names if n != "MaxNodes")
    if rows and short != names and all(len(row) == len(short) + 1 for row in rows):  # recorded without MaxNodes
        return [{**job, "MaxNodes": job["NumNodes"]} for job in (dict(zip(short, row)) for row in rows)]
    assert all(len(row) == len(names) + 1 for row in rows), "a recorded value holds the separator"
    return [dict(zip(names, row)) for row in rows]


def printed(jobs: list[dict[str, str]], fields: Fields) -> str:
    """squeue's stdout for `fields.squeue_option()` with these jobs' values."""
    return "".join("".join(job[f] + fields.token for f in fields.names) + "\n" for job in jobs)


def relaid(text: str, names: tuple[str, ...], wanted: tuple[str, ...] | None = None) -> tuple[str, Fields]:
    """A one-separator recording of `names` as squeue prints it for Fields(wanted or names, TOKEN)."""
    fields = Fields(wanted or names, TOKEN)
    return printed(recorded(text, names), fields), fields
