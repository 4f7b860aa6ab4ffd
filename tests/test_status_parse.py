"""Jobs from recorded squeue output, sacct's format, exit codes, output file lookup and following."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from hpctrain.schedulers.slurm.queries.job_states import (
    JobInfo,
    check_job_id,
    parse_exit_code,
    JOB_FIELDS,
    SQUEUE_FIELDS,
    parse_sacct,
    parse_squeue,
)
from hpctrain.schedulers.slurm.queries.records import Fields
from squeue_text import TOKEN, printed, recorded, relaid
from hpctrain.schedulers.slurm.queries.output import expand_pattern, follow, output_candidates
from hpctrain.errors import UserError

DATA = Path(__file__).parent / "data" / "slurm"


def one_job_query(name: str) -> list[JobInfo]:
    """get_job's squeue query (JOB_FIELDS) answered from a recording of those fields."""
    return parse_squeue(*relaid((DATA / name).read_text(), JOB_FIELDS))


def test_one_job_recorded() -> None:
    jobs = {j.job_id: j for j in one_job_query("squeue_job_22.05.txt")}
    assert sorted(jobs) == ["4", "5", "6", "7", "8", "9"]
    done = jobs["4"]
    assert (done.state, done.exit_code, done.elapsed_s, done.nodes, done.restarts) == ("COMPLETED", 0, 40, "node1", 0)
    assert done.stdout == "/home/alice/proj/slurm-4.out"
    assert done.finished
    failed = jobs["6"]
    assert (failed.state, failed.exit_code, failed.reason) == ("FAILED", 143, "NonZeroExitCode")
    running = jobs["7"]
    assert (running.state, running.exit_code, running.nodes, running.num_nodes) == ("RUNNING", None, "node[1-2]", 2)
    assert not running.finished
    pending = jobs["8"]
    assert (pending.state, pending.reason, pending.nodes, pending.time_limit_s) == ("PENDING", "Resources", None, 300)
    weird = jobs["9"]
    assert weird.name == "we|ird name"
    assert weird.stdout == "/home/alice/proj/out-9-we|ird name.txt"  # expanded by Slurm, spaces kept


def test_status_of_a_running_job_says_when_it_must_end_not_that_it_ended() -> None:
    """A running job's EndTime (squeue's %e) is its time limit: `status JOB` printed it as "ended:" (issue 39 §18)."""
    import dataclasses

    from hpctrain.schedulers.slurm.queries.display import job_view

    jobs = {j.job_id: j for j in one_job_query("squeue_job_22.05.txt")}
    running = dataclasses.replace(jobs["7"], end_time="2026-11-22T02:27:24")  # StartTime + TimeLimit
    done = jobs["4"]
    lines = [part for part in job_view(running).parts if isinstance(part, str)]
    assert "ends by:     2026-11-22T02:27:24" in lines and not any(line.startswith("ended:") for line in lines)
    assert done.end_time and any(line.startswith("ended:") for line in job_view(done).parts if isinstance(line, str))


def test_squeue_recorded() -> None:
    jobs = {j.job_id: j for j in parse_squeue(*relaid((DATA / "squeue_22.05.txt").read_text(), SQUEUE_FIELDS))}
    assert sorted(jobs) == ["4", "5", "6", "7", "8", "9"]
    assert jobs["9"].name == "we|ird name"
    assert (jobs["8"].state, jobs["8"].reason, jobs["8"].num_nodes) == ("PENDING", "Resources", 2)
    assert (jobs["7"].state, jobs["7"].nodes) == ("RUNNING", "node[1-2]")
    assert jobs["4"].elapsed_s == 40
    assert all(j.source == "squeue" and j.stdout is None for j in jobs.values())


def sacct_printed(rows: list[str], token: str = TOKEN) -> str:
    """sacct --parsable2 --delimiter=TOKEN: rows written with `|` between SACCT_FIELDS, as sacct prints them with
    the token (no accounting on the local cluster: its documented format; a `|` inside a value written `¦`)."""
    return "".join(token.join(v.replace("¦", "|") for v in row.split("|")) + "\n" for row in rows)


def test_sacct_format() -> None:
    text = sacct_printed(
        [
            "812|train¦a\n813¦x|COMPLETED|None|node[1-2]|2|75|0:0|debug|alice|2026-01-01T10:00:00|/home/alice|"
            "2026-01-01T10:00:01|2026-01-01T10:01:16",
            "813|hpctrain|CANCELLED by 1000|None|node1|1|9|0:15|debug|alice|2026-01-01T10:00:00|/home/alice|"
            "2026-01-01T10:00:01|2026-01-01T10:00:10",
        ]
    )
    first, second = parse_sacct(text, TOKEN)
    assert (first.job_id, first.name, first.state, first.elapsed_s, first.exit_code) == (
        "812",
        "train|a\n813|x",
        "COMPLETED",
        75,
        0,
    )
    assert (second.state, second.exit_code, second.source) == ("CANCELLED", 128 + 15, "sacct")


@pytest.mark.parametrize(("text", "code"), [("0:0", 0), ("2:0", 2), ("0:9", 137), ("143:0", 143), ("", None)])
def test_exit_codes(text: str, code: int | None) -> None:
    assert parse_exit_code(text) == code


@pytest.mark.parametrize("good", ["1234", "1234_7", "55+1"])
def test_job_ids_accepted(good: str) -> None:
    assert check_job_id(good) == good


@pytest.mark.parametrize("bad", ["", "abc", "12;rm -rf /", "-1", "1 2"])
def test_job_ids_rejected(bad: str) -> None:
    with pytest.raises(UserError, match="not a Slurm job id"):
        check_job_id(bad)


def test_expand_pattern() -> None:
    assert expand_pattern("logs/%x-%j.%%.out", "42", name="mnist") == "logs/mnist-42.%.out"
    assert expand_pattern("out-%N.txt", "42") == "out-%N.txt"  # per-node patterns are left alone


def test_output_candidates_for_a_forgotten_job(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "mnist-77"
    run.mkdir(parents=True)
    (run / "job.yaml").write_text(yaml.safe_dump({"name": "mnist", "output": "logs/%x-%j.out", "error": "logs/%j.err"}))
    assert output_candidates("77", None, base=tmp_path) == [tmp_path / "logs/mnist-77.out", tmp_path / "slurm-77.out"]
    assert output_candidates("77", None, "stderr", base=tmp_path)[0] == tmp_path / "logs/77.err"
    # While the controller knows the job, its own (expanded) path comes first.
    known = JobInfo(job_id="77", name="mnist", state="RUNNING", stdout="/scratch/o-77.txt", work_dir=str(tmp_path))
    assert output_candidates("77", known, base=tmp_path)[0] == Path("/scratch/o-77.txt")


def test_a_submission_record_is_read_back_as_untrusted(tmp_path: Path) -> None:
    """runs/*-JOB/job.yaml is read through readback: a FIFO is never waited on (a subprocess with a safety limit,
    since the old read blocked for ever), a link is not followed, and YAML aliases (an alias bomb's tool) are
    refused; each such record is passed over, leaving sbatch's default place."""
    for job_id, kind in (("78", "fifo"), ("79", "alias"), ("80", "link")):
        run = tmp_path / "runs" / f"mnist-{job_id}"
        run.mkdir(parents=True)
        if kind == "fifo":
            os.mkfifo(run / "job.yaml")
        elif kind == "alias":
            (run / "job.yaml").write_text("name: &n mnist\noutput: *n\n")
        else:
            (tmp_path / "elsewhere.yaml").write_text("output: /etc/hostname\n")
            (run / "job.yaml").symlink_to(tmp_path / "elsewhere.yaml")
    code = (
        "import sys; from pathlib import Path; from hpctrain.schedulers.slurm.queries.output import output_candidates; "
        "base = Path(sys.argv[1]); print([str(p.relative_to(base)) for j in ('78', '79', '80') "
        "for p in output_candidates(j, None, base=base)])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['slurm-78.out', 'slurm-79.out', 'slurm-80.out']"


def test_follow_reads_until_finished_and_catches_the_tail(tmp_path: Path) -> None:
    path = tmp_path / "job.out"  # does not exist yet, like a pending job's output
    finished = threading.Event()
    got: list[str] = []

    def writer() -> None:
        time.sleep(0.2)
        with open(path, "w") as f:
            for i in range(5):
                f.write(f"line {i}\n")
                f.flush()
                time.sleep(0.05)
        with open(path, "a") as f:
            f.write("last line\n")  # written just before the job counts as finished
        finished.set()

    thread = threading.Thread(target=writer)
    thread.start()
    follow(path, got.append, finished.is_set, poll_s=0.02, check_every_s=0.05)
    thread.join()
    assert "".join(got) == "".join(f"line {i}\n" for i in range(5)) + "last line\n"


def test_follow_restarts_after_truncation(tmp_path: Path) -> None:
    path = tmp_path / "job.out"
    path.write_text("first attempt, a long line\n")
    got: list[str] = []
    calls = {"n": 0}

    def finished() -> bool:
        calls["n"] += 1
        if calls["n"] == 2:
            path.write_text("second\n")  # a requeue that truncates the file
        return calls["n"] >= 3

    follow(path, got.append, finished, poll_s=0.0, check_every_s=0.0)
    assert "".join(got) == "first attempt, a long line\nsecond\n"


def test_the_table_query_gives_the_cells_of_the_full_query_recorded() -> None:
    """squeue with job_table.table_argv() and with jobs.squeue_argv(), recorded one after the other on the local
    22.05 cluster: the table's columns built straight from the first are display.job_rows of the second's records,
    sorted by id."""
    from hpctrain.schedulers.slurm.queries import display
    from hpctrain.schedulers.slurm.queries.job_table import TABLE_FIELDS, table_columns
    from hpctrain.schedulers.slurm.queries.job_states import _id_key

    full = sorted(parse_squeue(*relaid((DATA / "squeue_full_22.05_live.txt").read_text(), SQUEUE_FIELDS)), key=_id_key)
    cells = table_columns(*relaid((DATA / "squeue_table_22.05.txt").read_text(), TABLE_FIELDS))
    assert len(cells) == 20 and list(cells) == display.job_rows(full)
    assert cells[19] == ("59", "gpu1", "RUNNING", "", "node2", "00:00:18", "0")


def test_a_pending_node_range_shows_as_wanted_in_both_tables() -> None:
    """Issue 42: squeue's own MaxNodes beside NumNodes, in the table's one query and in the records' (recorded on the
    local 22.05 cluster: `--nodes=1-2` held and waiting, `--nodes=2` held), gives a pending elastic job's nodes cell
    "(1:2 wanted)", the same from both queries; a fixed request stays "(2 wanted)"."""
    from hpctrain.schedulers.slurm.queries import display
    from hpctrain.schedulers.slurm.queries.job_table import TABLE_FIELDS, table_columns
    from hpctrain.schedulers.slurm.queries.job_states import _id_key

    full = sorted(
        parse_squeue(*relaid((DATA / "squeue_elastic_full_22.05.txt").read_text(), SQUEUE_FIELDS)), key=_id_key
    )
    cells = table_columns(*relaid((DATA / "squeue_elastic_table_22.05.txt").read_text(), TABLE_FIELDS))
    assert list(cells) == display.job_rows(full)
    assert {row[0]: row[4] for row in cells} == {"362": "(1:2 wanted)", "363": "(1:2 wanted)", "364": "(2 wanted)"}
    assert [(j.num_nodes, j.max_nodes) for j in full] == [(1, 2), (1, 2), (2, 2)]


@pytest.mark.parametrize("name", ["squeue_22.05.txt", "20.11/squeue.txt", "24.11/squeue.txt", "25.11/squeue.txt"])
def test_the_table_from_squeue_is_the_records_table(name: str) -> None:
    """The table's squeue text for the same jobs (the 8 fields picked from each recorded line: squeue prints each
    field the same whatever else it is asked for) gives display.job_rows of the full records, in the same order:
    array tasks, a pending array's `4100_[3-10]`, heterogeneous components, names with `|` and spaces, unknown
    states."""
    from hpctrain.schedulers.slurm.queries import display
    from hpctrain.schedulers.slurm.queries.job_table import TABLE_FIELDS, table_columns
    from hpctrain.schedulers.slurm.queries.job_states import _id_key

    jobs = recorded((DATA / name).read_text(), SQUEUE_FIELDS)
    expected = display.job_rows(sorted(parse_squeue(*relaid((DATA / name).read_text(), SQUEUE_FIELDS)), key=_id_key))
    fields = Fields(TABLE_FIELDS, TOKEN)
    for order in (jobs, jobs[::-1]):  # in squeue's order or not
        assert list(table_columns(printed(order, fields), fields)) == expected
