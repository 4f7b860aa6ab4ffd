"""Growth of `hpctrain check`, `cluster` and `status` on a big Slurm cluster, pinned by counting, not timing.

A 10,000-node Slurm cannot run here: the answers come from benchmarks/scale_views.py's generators, which write
what `scontrol`/`squeue` print in the forms of tests/data/slurm/ (the first test checks they parse one record a
line), through a recording runner in place of subprocess.run. The harness itself times the commands.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from hpctrain.schedulers.slurm.queries.job_states import SQUEUE_FIELDS, list_jobs, parse_squeue
from hpctrain.schedulers.slurm.queries.records import Fields, parse_records
from hpctrain.schedulers.slurm.batch.options import SlurmOptions
from hpctrain.schedulers.slurm.scheduler import SlurmScheduler
from hpctrain.cli.tables import RICH_ROWS
from hpctrain.cli.views import show
from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.schedulers.slurm.queries import records, cluster_state, display

_spec = importlib.util.spec_from_file_location(
    "scale_views", Path(__file__).parents[1] / "benchmarks" / "scale_views.py"
)
scale = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scale)
ME = "alice"
ROWS = Fields(SQUEUE_FIELDS, scale.TOKEN)  # how scale.squeue_rows() is laid out


class Recorder:
    """subprocess.run for the Slurm commands: answers from a fake cluster of `n` nodes (10 n jobs) as the harness's
    stand-ins do (squeue for any of hpctrain's field lists, filters and orders; scontrol's records, one job's or
    all, and its stdin session), keeps argv."""

    def __init__(self, version: str, n: int) -> None:
        self.n = n
        self.answers = {
            "partition": scale.partitions_text(n),
            "node": scale.nodes_text(version, n),
            "job": scale.jobs_text(n, ME) if version == "22.05" else "",
        }
        self.records = {line.split()[0][len("JobId=") :]: line for line in self.answers["job"].splitlines()}
        self.calls: list[list[str]] = []
        self.out_bytes = 0

    def __call__(self, argv, input=None, **kwargs):
        self.calls.append(list(argv))
        status, err = 0, ""
        if argv[0] == "squeue":
            out = scale.squeue_answer(list(argv), self.n, ME)
        elif argv == ["scontrol", "-d", "-o"]:
            out, err, status = scale.scontrol_session((input or b"").decode(), self.records.get)  # bytes: run_text
        else:
            out = self.answers[argv[argv.index("show") + 1]]
        self.out_bytes += len(out)
        return subprocess.CompletedProcess(argv, status, stdout=out, stderr=err)


def test_the_harness_prints_what_hpctrain_parses() -> None:
    for version in scale.VERSIONS:
        nodes = cluster_state.parse_nodes(scale.nodes_text(version, 40))
        assert len(nodes) == 40 and all(n.gpus_total == 8 for n in nodes)
        assert any(n.shards_used is None for n in nodes) == (version == "22.05")  # 22.05: GPUs with shards
    assert [p.name for p in cluster_state.parse_partitions(scale.partitions_text(40))] == ["gpu", "debug"]
    assert len(parse_records(scale.jobs_text(40, ME))) == 400
    everyone, mine = scale.squeue_rows(40, ME)
    assert len(parse_squeue(everyone, ROWS)) == 400 and {j.user for j in parse_squeue(mine, ROWS)} == {ME}


def _big_job() -> JobSpec:
    return JobSpec(
        name="big", command=("python", "train.py"), resources=Resources(nodes=1000, nproc_per_node=8, gpus_per_node=8)
    )


@pytest.mark.parametrize("version", ["22.05", "25.11"])
def test_check_of_a_whole_gpu_job_never_lists_the_jobs(version: str) -> None:
    """The checks need each node's shard totals, never the shards in use: on 22.05 (shards in use not printed per
    GPU) the job list used to be read and parsed whole for every check, 100,000 records on a big cluster."""
    for n in (40, 80):
        run = Recorder(version, n)
        SlurmScheduler(SlurmOptions(partition="gpu"), run=run).check(_big_job())
        assert run.calls == [["scontrol", "show", "partition", "-o"], ["scontrol", "-d", "show", "node", "-o"]]


def test_cluster_splits_only_the_running_shard_jobs_into_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """Records split into fields by `hpctrain cluster` on 22.05: one per node and partition, and one per running job
    on shards; the pending and whole-GPU jobs (nine in ten of the queue) are passed over."""
    split = {"n": 0}
    real_record, real_pick, real_groups = records.parse_record, records.pick_record, cluster_state.field_groups

    def counting_record(line: str) -> dict[str, str]:
        split["n"] += 1
        return real_record(line)

    def counting_pick(line: str, keys: frozenset[str], spaced: bool = False) -> dict[str, str]:  # a node's keys
        split["n"] += 1
        return real_pick(line, keys, spaced)

    def counting_groups(line: str, first: str, keys: tuple[str, ...]):
        split["n"] += 1
        return real_groups(line, first, keys)

    monkeypatch.setattr(records, "parse_record", counting_record)
    monkeypatch.setattr(records, "pick_record", counting_pick)
    monkeypatch.setattr(cluster_state, "field_groups", counting_groups)
    for n in (40, 80):
        run = Recorder("22.05", n)
        split["n"] = 0
        info = cluster_state.query_cluster(run=run)
        shard_jobs = sum(
            1 for line in run.answers["job"].splitlines() if "JobState=RUNNING" in line and "GRES=shard" in line
        )
        assert shard_jobs and split["n"] == n + 2 + shard_jobs
        assert sum(node.shards_used or 0 for node in info.nodes) == 16 * shard_jobs


def test_cluster_on_22_05_reads_only_the_running_shard_jobs_records() -> None:
    """Before 23.11 Slurm prints the shards in use per node only, and the per-GPU count needs the jobs' records:
    squeue names the running jobs that asked for shards, one scontrol session reads just their records. The whole
    `scontrol -d show job` dump (10 n records, about 1.3 KB each) is never read."""
    for n in (40, 80):
        run = Recorder("22.05", n)
        info = cluster_state.query_cluster(run=run)
        held = [line for line in run.answers["job"].splitlines() if "JobState=RUNNING" in line and "shard" in line]
        token = run.calls[2][-1].rsplit(":", 1)[1]  # the holder query's own (its last field, Name, is free text)
        assert run.calls == [
            ["scontrol", "show", "partition", "-o"],
            ["scontrol", "-d", "show", "node", "-o"],
            cluster_state.shard_holders_argv(Fields(cluster_state.HOLDER_FIELDS, token)),
            ["scontrol", "-d", "-o"],
        ]
        job_bytes = run.out_bytes - len(run.answers["partition"]) - len(run.answers["node"])
        assert len(held) == n // 10 and job_bytes < 2 * sum(map(len, held)) + 100 * n  # the dump: 10 n records
        assert sum(node.shards_used or 0 for node in info.nodes) == 16 * len(held)


def test_cluster_says_when_scontrol_fails_and_skips_a_job_that_ended() -> None:
    from hpctrain.errors import UserError

    class Ended(Recorder):
        down = False  # the controller answers

        def __call__(self, argv, input=None, **kwargs):
            result = super().__call__(argv, input=input, **kwargs)
            if argv == ["scontrol", "-d", "-o"] and self.down:
                result = subprocess.CompletedProcess(
                    argv,
                    1,
                    "scontrol: \n",
                    "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n",
                )
            return result

    run = Ended("22.05", 40)
    run.records.pop(next(i for i, r in run.records.items() if "JobState=RUNNING" in r and "shard" in r))
    info = cluster_state.query_cluster(run=run)  # one shard job ended between squeue and scontrol: not counted
    assert sum(node.shards_used or 0 for node in info.nodes) == 16 * 3
    run.down = True
    with pytest.raises(UserError, match="could not reach the Slurm controller"):
        cluster_state.query_cluster(run=run)


def test_status_table_asks_squeue_for_its_columns_only_and_makes_no_records(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`status` (and `--all-users`: 100,000 jobs) asks squeue for the 9 fields its table prints, in id order, and
    makes the cells straight from squeue's text: no JobInfo, the same table as from every field's records."""
    from hpctrain.schedulers.slurm.queries import job_states
    from hpctrain.schedulers.slurm.queries import job_table

    made = {"n": 0}
    real = job_states.JobInfo

    def counting(*args, **kwargs):
        made["n"] += 1
        return real(*args, **kwargs)

    for n in (40, 80):
        run = Recorder("25.11", n)
        expected = display.job_rows(sorted(parse_squeue(scale.squeue_rows(n, ME)[0], ROWS), key=job_states._id_key))
        monkeypatch.setattr(job_states, "JobInfo", counting)
        made["n"] = 0
        show(SlurmScheduler(SlurmOptions(), run=run).status_view(None, all_users=True), as_json=False)
        monkeypatch.setattr(job_states, "JobInfo", real)
        out = capsys.readouterr().out
        (argv,) = run.calls
        token = argv[-1].rsplit(":", 1)[1]  # the query's own (the last field is free text)
        assert argv == job_table.table_argv(None, Fields(job_table.TABLE_FIELDS, token)) and "--sort=i" in argv
        # the nodes column from NodeList, NumNodes and MaxNodes (a pending node range: "(1:2 wanted)")
        assert argv[-1].removeprefix("--Format=").count(":") == len(display.JOB_COLUMNS) + 2
        assert made["n"] == 0 and run.out_bytes < 0.6 * len(scale.squeue_rows(n, ME)[0])
        show(
            display.jobs_view(sorted(parse_squeue(scale.squeue_rows(n, ME)[0], ROWS), key=job_states._id_key)),
            as_json=False,
        )
        assert out == capsys.readouterr().out and len(out.splitlines()) == len(expected) + 1


def test_the_stand_ins_answer_what_hpctrain_asks() -> None:
    """The harness's squeue stand-in answers a fixed list of command lines: hpctrain's own are among them."""
    from hpctrain.schedulers.slurm.queries import job_states
    from hpctrain.schedulers.slurm.queries import job_summaries, job_table

    known = scale.squeue_argvs(ME)
    listed, table = Fields(job_states.SQUEUE_FIELDS, scale.TOKEN), Fields(job_table.TABLE_FIELDS, scale.TOKEN)
    for argv in (
        job_states.squeue_argv(None, fields=listed),
        job_states.squeue_argv(ME, fields=listed),
        job_table.table_argv(None, table),
        job_table.table_argv(ME, table),
    ):
        assert argv in known
    assert cluster_state.shard_holders_argv(Fields(cluster_state.HOLDER_FIELDS, scale.TOKEN)) in known
    summaries = Fields(job_summaries.SUMMARY_FIELDS, scale.TOKEN)  # the web console's jobs table
    assert job_summaries.summary_argv(None, summaries) in known and job_summaries.summary_argv(ME, summaries) in known
    everyone = scale.squeue_answer(job_table.table_argv(None, table), 40, ME)
    assert [line.split(scale.TOKEN)[0] for line in everyone.splitlines()] == [str(100000 + j) for j in range(400)]
    unsorted = scale.squeue_answer(
        job_states.squeue_argv(None, fields=listed), 40, ME
    )  # squeue's default: pending first
    assert unsorted.splitlines()[0].split(scale.TOKEN)[2] == "PENDING"


@pytest.mark.parametrize(
    "rows",
    [
        [("a", "bb", "")],
        [("x\x1by", "", "z "), ("", "long cell", "")],
        [],
    ],
)
def test_the_plain_printer_lays_out_as_before(rows: list[tuple[str, ...]]) -> None:
    """plain_columns prints what the one-format-a-row printer it replaced printed: cells padded to the column, two
    spaces between, each line's trailing spaces dropped, control characters escaped; from rows or ColumnCells."""
    import io

    from hpctrain.cli.tables import plain_columns
    from hpctrain.safetext import for_terminal
    from hpctrain.schedulers.base import ColumnCells

    header = ("h1", "h2", "h3")
    table = [header, *rows]
    cells = [[for_terminal(c) for c in column] for column in zip(*table)]
    widths = [max(map(len, column)) for column in cells]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    before = "\n".join(line.format(*row).rstrip() for row in zip(*cells)) + "\n"
    for body in (rows, ColumnCells([list(column) for column in zip(*rows)] if rows else [[], [], []])):
        out = io.StringIO()
        plain_columns(header, body, out)
        assert out.getvalue() == before


def test_long_tables_are_printed_plain_one_line_a_row(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rich lays a table out at about 0.7 ms a row (7 s for 10,000 nodes): above RICH_ROWS rows the same header
    and cells are printed as plain aligned text. Names stay text: markup is not read, control characters escaped."""

    def no_rich_layout(*args, **kwargs):
        raise AssertionError("a rich table was laid out")

    n = RICH_ROWS  # 10 n jobs in the queue, n of them the caller's
    everyone, _ = scale.squeue_rows(n, ME)
    jobs = parse_squeue(everyone, ROWS)
    jobs[0] = replace(jobs[0], name="[bold]x[/bold]\x1b[2J")
    monkeypatch.setattr("rich.table.Table.__rich_console__", no_rich_layout)
    show(display.jobs_view(jobs), as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(jobs) + 1 and lines[0].split() == [
        "job",
        "name",
        "state",
        "reason",
        "nodes",
        "elapsed",
        "restarts",
    ]
    assert lines[1].split()[:2] == [jobs[0].job_id, "[bold]x[/bold]\\x1b[2J"]
    info = cluster_state.ClusterInfo(
        partitions=tuple(cluster_state.parse_partitions(scale.partitions_text(n + 1))),
        nodes=tuple(cluster_state.parse_nodes(scale.nodes_text("25.11", n + 1))),
    )
    view = display.cluster_view(info)  # its partitions table (two rows, laid out by rich) as one line
    show(replace(view, parts=(*view.text_parts()[:-1], "partitions")), as_json=False)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "nodes (used/total)" and len(out) == 1 + 1 + n + 1 + 1
    assert out[2].split() == [
        "gpu00001",
        "mixed",
        "gpu",
        "48/96",
        "879",  # fsutil.format_bytes, the one byte formatter: "879 GiB/1.91 TiB"
        "GiB/1.91",
        "TiB",
        "4/8",
        "h100",
        "56/512",
        "(gpu0:",
        "0/64,",
        "gpu1:",
        "0/64,",
        "gpu2:",
        "0/64,",
        "gpu3:",
        "0/64,",
        "gpu4:",
        "16/64,",
        "gpu5:",
        "40/64,",
        "gpu6:",
        "0/64,",
        "gpu7:",
        "0/64)",
    ]


def test_status_asks_squeue_for_the_callers_jobs_only() -> None:
    run = Recorder("25.11", 40)
    mine = list_jobs(user=ME, run=run)
    assert len(mine) == 40 and any(a == f"--user={ME}" for a in run.calls[0])


def test_long_json_is_the_same_data_one_record_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    """json's indented printer is pure Python (1.6 s for 100,000 jobs): a long list gets one compact record a line,
    still the same JSON document."""
    everyone, _ = scale.squeue_rows(RICH_ROWS, ME)
    jobs = parse_squeue(everyone, ROWS)
    show(display.jobs_view(jobs), as_json=True)
    out = capsys.readouterr().out
    assert json.loads(out) == [j.to_dict() for j in jobs] and len(out.splitlines()) == len(jobs) + 2
    info = cluster_state.ClusterInfo(
        partitions=tuple(cluster_state.parse_partitions(scale.partitions_text(RICH_ROWS + 1))),
        nodes=tuple(cluster_state.parse_nodes(scale.nodes_text("22.05", RICH_ROWS + 1))),
    )
    show(display.cluster_view(info), as_json=True)
    out = capsys.readouterr().out
    assert json.loads(out) == json.loads(json.dumps(info.to_dict()))
    assert sum(line.startswith('    {"name": "gpu') for line in out.splitlines()) == RICH_ROWS + 1  # a node a line


@pytest.mark.slow
def test_the_harness_runs_in_its_smallest_form() -> None:
    """benchmarks/scale_views.py end to end (stand-ins on PATH, fresh hpctrain processes, --compare, the fit), tiny
    sizes, with the src/ of the hpctrain under test (the harness's answers are this checkout's)."""
    import os
    import sys

    import hpctrain

    SRC = Path(hpctrain.__file__).parents[1]
    result = subprocess.run(
        [
            sys.executable,
            "benchmarks/scale_views.py",
            "--sizes",
            "10,20",
            "--versions",
            "22.05",
            "--repeat",
            "1",
            "--only",
            "cluster,status (N",
            "--compare",
            str(SRC),
        ],
        cwd=Path(__file__).parents[1],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if " N=" in line]
    assert len(rows) == 12 and not any("EXIT" in row for row in rows), result.stdout
    assert "4 Slurm call(s)" in rows[0] and "1 Slurm call(s)" in rows[4], result.stdout  # cluster on 22.05; status
    assert all("(compare)" in row for row in rows[1::2]) and "4 Slurm call(s)" in rows[1], result.stdout
    assert "fitted" in result.stdout or "growth fitted" in result.stdout, result.stdout


def test_the_node_views_caches_are_bounded_and_a_cluster_of_distinct_nodes_reads_right() -> None:
    """The cluster view works a repeated value out once (a node's fields after its name, GRES, cells) in caches of a
    fixed size: a cluster whose 6,000 nodes all differ (more than a cache holds) is read node for node as its
    records say, and no cache grows past its size."""
    from hpctrain.fsutil import format_bytes
    from hpctrain.schedulers.slurm.queries import gres

    caches = [
        cluster_state._node_values,
        gres.node_usage,
        gres._job_shards,
        display._shards_text,
        display._memory_text,
        records._keys_pattern,
        records.printed_mem_mb,
    ]
    assert all(0 < cache.cache_info().maxsize <= 4096 for cache in caches)
    text = "".join(
        f"NodeName=n{i} CPUAlloc={i % 97} CPUTot=96 Gres=gpu:8 GresUsed=gpu:{i % 9}(IDX:N/A) RealMemory=2000000 "
        f"AllocMem={i} State=MIXED Partitions=p{i % 7} Reason=x State=IDLE AllocMem=0\n"
        for i in range(6000)
    )
    nodes = cluster_state.parse_nodes(text)
    assert [(n.name, n.cpus_alloc, n.gpus_used, n.mem_mb_alloc, n.state, n.partitions) for n in nodes] == [
        (f"n{i}", i % 97, i % 9, i, "mixed", (f"p{i % 7}",)) for i in range(6000)
    ]
    rows = display.node_rows(cluster_state.ClusterInfo(partitions=(), nodes=tuple(nodes)))
    assert len({(n.mem_mb_alloc, n.mem_mb_total) for n in nodes}) > 4096  # more than the memory cells' cache holds
    assert [row[4] for row in rows] == [f"{format_bytes(i << 20)}/{format_bytes(2000000 << 20)}" for i in range(6000)]
    assert all(cache.cache_info().currsize <= cache.cache_info().maxsize for cache in caches)
