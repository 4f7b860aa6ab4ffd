"""The Slurm parsers against the output of several Slurm releases, 20.11 to 25.11 (tests/data/slurm/<version>/).

Only Debian's 22.05 runs here (its recordings are the tests/data/slurm/*_22.05*.txt files, used by
test_cluster_parse.py and test_status_parse.py). The other versions' files are written by hand from those releases'
source and changelogs, field by field, as tests/data/slurm/README.md says with the source of each format fact: they
are what those versions print, not recordings. They include jobs hpctrain did not submit (interactive, array,
heterogeneous, other users' batch jobs) and job states hpctrain does not know, which must be shown as printed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.cli import views
from hpctrain.cli.tables import rich_table
from hpctrain.schedulers import base
from hpctrain.schedulers.slurm.queries.job_states import JOB_FIELDS, SQUEUE_FIELDS, _id_key, parse_sacct, parse_squeue
from hpctrain.schedulers.slurm.queries.cluster_state import parse_nodes, parse_partitions
from hpctrain.schedulers.slurm.queries.records import parse_records
from hpctrain.schedulers.slurm.scheduler import job_status, neutral_state
from squeue_text import TOKEN, relaid
from hpctrain.schedulers.slurm.queries import display

DATA = Path(__file__).parent / "data" / "slurm"
VERSIONS = ("20.11", "23.11", "24.11", "25.11")


def listed(text: str) -> list:
    """squeue with jobs.squeue_argv() (the list), from a recording of its fields' values (tests/squeue_text.py)."""
    return parse_squeue(*relaid(text, SQUEUE_FIELDS))


def one_job(text: str) -> list:
    """squeue with JOB_FIELDS (jobs.get_job: one job in full), from a recording of its fields' values."""
    return parse_squeue(*relaid(text, JOB_FIELDS))


PARSERS = {
    "nodes.txt": parse_nodes,
    "partitions.txt": parse_partitions,
    "jobs.txt": parse_records,  # `scontrol -d show job -o`: read by `cluster` for shards only (query.py)
    "squeue.txt": listed,
    "squeue_job.txt": one_job,
    "sacct.txt": lambda text: parse_sacct(text, TOKEN),
}


def read(version: str, name: str) -> str:
    return (DATA / version / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("version", VERSIONS)
def test_every_recorded_output_parses_one_record_per_line(version: str) -> None:
    files = sorted(p.name for p in (DATA / version).iterdir() if p.suffix == ".txt")
    assert files and set(files) <= set(PARSERS)
    for name in files:
        text = read(version, name)
        records = PARSERS[name](text)
        assert len(records) == len([line for line in text.splitlines() if line.strip()]), name


def test_20_11_nodes_without_cpuefctv_and_with_its_state_suffixes() -> None:
    gpu01, gpu02, cpu07 = parse_nodes(read("20.11", "nodes.txt"))
    assert (gpu01.cpus_total, gpu01.cpus_alloc) == (32, 8)  # CPUTot: 20.11 prints no CPUEfctv
    assert (gpu01.gpu_type, gpu01.gpus_total, gpu01.gpus_used, gpu01.shards_used) == ("v100", 4, 2, 0)
    assert (gpu02.state, gpu02.usable, gpu02.gpus_used) == ("idle+cloud+power", False, 0)
    assert (cpu07.state, cpu07.usable, cpu07.gpus_total) == ("down*", False, 0)


def test_20_11_partitions() -> None:
    gpu, cpu = parse_partitions(read("20.11", "partitions.txt"))
    assert (gpu.max_time_s, gpu.max_nodes, gpu.default, gpu.nodes) == (2 * 86400, 4, False, ("gpu01", "gpu02"))
    assert (cpu.max_time_s, cpu.max_nodes, cpu.default, len(cpu.nodes)) == (None, None, True, 8)


def test_jobs_hpctrain_did_not_submit() -> None:
    jobs = {j.job_id: j for j in one_job(read("20.11", "squeue_job.txt"))}
    interactive = jobs["4111"]  # salloc: no batch script, so no StdOut/StdErr; no time limit of its own yet
    assert (interactive.state, interactive.user, interactive.stdout, interactive.stderr) == (
        "PENDING",
        "bob",
        None,
        None,
    )
    assert interactive.time_limit_s is None and interactive.finished is False
    array_task, hetjob = jobs["4100_2"], jobs["4200+0"]
    assert (array_task.state, array_task.exit_code, array_task.stderr) == (
        "COMPLETED",
        0,
        "/home/carol/sweep-4100_2.err",
    )
    assert (hetjob.state, hetjob.nodes, hetjob.num_nodes) == ("RUNNING", "cpu[04-05]", 2)
    held = jobs["4150"]
    assert (held.state, neutral_state(held.state), held.reason) == ("RESV_DEL_HOLD", base.PENDING, "ReservationDeleted")

    queue = listed(read("20.11", "squeue.txt"))
    ids = [j.job_id for j in sorted(queue, key=_id_key)]
    assert ids == ["4100_[3-10]", "4107", "4111", "4150", "4200+0", "4200+1"]
    by_id = {j.job_id: j for j in queue}
    assert by_id["4111"].time_limit_s is None  # squeue says NOT_SET
    assert by_id["4107"].time_limit_s == 86400 and by_id["4107"].elapsed_s == 3723


def test_sacct_states_exit_codes_and_unassigned_nodes() -> None:
    jobs = {j.job_id: j for j in parse_sacct(read("20.11", "sacct.txt"), TOKEN)}
    assert (jobs["4090"].state, jobs["4090"].exit_code) == ("CANCELLED", 128 + 15)  # `CANCELLED by 1001`, 0:15
    assert (jobs["4091"].nodes, jobs["4091"].start_time) == (None, None)
    later = {j.job_id: j for j in parse_sacct(read("24.11", "sacct.txt"), TOKEN)}
    assert (later["88100"].state, later["88100"].exit_code) == ("OUT_OF_MEMORY", 128 + 125)
    assert later["88101"].name == "a|b"


def test_23_11_prints_shards_in_use_per_gpu() -> None:
    g1, g2 = parse_nodes(read("23.11", "nodes.txt"))
    assert (g1.shards_used, g1.shards_per_gpu, g1.gpus_used) == (40, ((16, 32), (24, 32), (0, 32), (0, 32)), 1)
    assert (g2.shards_used, g2.shards_per_gpu) == (0, ((0, 32), (0, 32)))
    assert (g2.state, g2.usable) == ("idle+planned", True)  # PLANNED: backfill has a job in mind, still schedulable


def test_24_11_counts_the_cpus_left_after_core_specialization() -> None:
    busy, drained = parse_nodes(read("24.11", "nodes.txt"))
    assert (busy.cpus_total, busy.cpus_alloc, busy.gpus_used) == (120, 64, 8)  # CPUEfctv, not CPUTot=128
    assert (drained.state, drained.usable) == ("idle+drain", False)
    jobs = {j.job_id: j for j in one_job(read("24.11", "squeue_job.txt"))}
    notebook = jobs["88240"]  # another user's job, its output and error files of its own
    assert (notebook.work_dir, notebook.stdout, notebook.stderr) == (
        "/home/bob",
        "/home/bob/jupyter-88240.log",
        "/home/bob/jupyter-88240.err",
    )
    assert (jobs["88231"].restarts, jobs["88231"].elapsed_s) == (2, 3 * 86400 + 4364)
    assert (jobs["88199"].state, jobs["88199"].finished) == ("COMPLETING", False)


def test_25_11_new_and_unknown_states_and_a_blank_stderr() -> None:
    jobs = {j.job_id: j for j in one_job(read("25.11", "squeue_job.txt"))}
    requeueing = jobs["120455"]
    assert (requeueing.state, requeueing.finished, neutral_state(requeueing.state)) == (
        "EXPEDITING",
        False,
        base.RESTARTING,
    )
    assert requeueing.stderr == requeueing.stdout == "/scratch/alice/run3/slurm-120455.out"  # StdErr= (empty)
    unknown = jobs["120460"]
    assert (unknown.state, unknown.finished, unknown.elapsed_s) == ("FUTURE_STATE_X", False, None)  # RunTime=INVALID
    assert job_status(unknown).state == base.UNKNOWN
    queue = listed(read("25.11", "squeue.txt")) + parse_sacct(read("25.11", "sacct.txt"), TOKEN)
    assert {j.state for j in queue} >= {"EXPEDITING", "FUTURE_STATE_X", "SOME_NEW_STATE", "PREEMPTED"}
    table = display.jobs_table(queue)
    console = views.console()
    with console.capture() as captured:
        console.print(rich_table(table.columns, table.rows))
    assert "FUTURE_STATE_X" in captured.get() and "SOME_NEW_STATE" in captured.get()  # shown as Slurm says it
    nodes = parse_nodes(read("25.11", "nodes.txt"))
    assert [(n.state, n.usable) for n in nodes] == [("allocated", True), ("idle+blocked", False)]
