"""`top` and `status` on Kubernetes at scale (issue 32). The probe that reads a job's rank records in one of its pods
(hpctrain.servers.top.PROGRESS_PROBE), run here by /bin/sh on a real run directory: how many processes it starts
must not grow with the ranks (one `tr` per rank was 18 s of forks at 8,000), what it prints parses back to the
records read_progress reads, and what is not a regular file (a FIFO, a link) is passed over without blocking. And
the pods are probed side by side, not one exec after another."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from hpctrain.health import RankProgress
from hpctrain.health.progress import PROGRESS_DIR, read_progress
from hpctrain.servers.top import PROGRESS_PROBE, parse_probe, ranks_of

TOOLS = ("find", "awk", "tr", "cat")


def run_dir_of(tmp_path: Path, ranks: int) -> Path:
    run = tmp_path / f"run-{ranks}"
    (run / PROGRESS_DIR).mkdir(parents=True)
    for rank in range(ranks):
        record = RankProgress(rank=rank, world_size=ranks, host=f"node-{rank // 8}", pid=100 + rank, phase="training")
        record.step, record.updated = 10 + rank % 3, time.time()
        (run / PROGRESS_DIR / f"rank-{rank}.json").write_text(json.dumps(asdict(record)))  # as the writer: no newline
    return run


def counting_path(tmp_path: Path, tools: tuple[str, ...]) -> tuple[str, Path]:
    """A PATH of wrappers that log each start of `tools` and run the real one."""
    bin_dir, log = tmp_path / "bin", tmp_path / "started.log"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in tools:
        real = shutil.which(tool)
        assert real, f"{tool} is needed for this test"
        wrapper = bin_dir / tool
        wrapper.write_text(f'#!/bin/sh\necho {tool} >> "{log}"\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
    return str(bin_dir), log


def probe(run: Path, path: str) -> str:
    env = {"PATH": path, "HPCTRAIN_RUN_DIR": str(run)}
    result = subprocess.run(["/bin/sh", "-c", PROGRESS_PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def read_back(stdout: str) -> list[tuple[int, int, str]]:
    return [(r.rank, r.step, r.host) for r in ranks_of(parse_probe("@node pod\n" + stdout, labelled=False))]


@pytest.mark.parametrize("tools", [TOOLS, ("tr",)], ids=["find-and-awk", "shell-loop-without-them"])
def test_the_probe_prints_every_record_as_read_progress_reads_it(tmp_path: Path, tools: tuple[str, ...]) -> None:
    run = run_dir_of(tmp_path, 12)
    os.mkfifo(run / PROGRESS_DIR / "rank-12.json")  # a reader that opened it would wait forever
    (run / PROGRESS_DIR / "rank-13.json").symlink_to(run / PROGRESS_DIR / "rank-0.json")
    path, _ = counting_path(tmp_path, tools)
    expected = [(r.rank, r.step, r.host) for r in read_progress(run)]
    assert len(expected) == 12
    assert read_back(probe(run, path)) == expected


def test_the_probe_starts_as_many_processes_for_64_ranks_as_for_4(tmp_path: Path) -> None:
    started = {}
    for ranks in (4, 64):
        path, log = counting_path(tmp_path / str(ranks), TOOLS)
        assert len(read_back(probe(run_dir_of(tmp_path, ranks), path))) == ranks
        started[ranks] = log.read_text().split()
    assert started[64] == started[4], started  # one find and one awk: the old loop started one tr per rank


def test_the_pods_are_probed_side_by_side_and_come_back_in_their_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four pods: each fake exec waits at a barrier of four, which one exec after another never passes (the bound
    only ends a failing run). Stand-in: the exec stream (the real one: tests/test_top.py on the real node)."""
    client = pytest.importorskip("kubernetes.client")
    from hpctrain.schedulers.kubernetes.services import pods
    from hpctrain.schedulers.kubernetes.api.rest import RawApi

    barrier = threading.Barrier(4, timeout=60)
    asked: dict[str, str] = {}

    def fake_exec(raw: object, namespace: str, pod: str, container: str | None, probe: str) -> tuple[str, str]:
        asked[pod] = probe
        barrier.wait()
        return "@node ignored\n@cpus 2\n@load 0.50 0.40 0.30 1/99 7\n@nogpu\n", '{"status": "Success"}'

    monkeypatch.setattr(pods, "exec_probe", fake_exec)
    job = [  # the pods' JSON, as the API server sends it
        {
            "status": {"phase": "Running"},
            "metadata": {"name": f"job-worker-{i}", "namespace": "ns"},
            "spec": {"nodeName": f"node-{i}", "containers": [{"name": "pytorch"}]},
        }
        for i in range(4)
    ]
    samples = pods.sample_pods(RawApi(client.ApiClient(client.Configuration())), job)
    assert [s.node for s in samples] == [f"node-{i} (job-worker-{i})" for i in range(4)]
    assert [PROGRESS_PROBE in asked[f"job-worker-{i}"] for i in range(4)] == [True, False, False, False]


def logging_awk(tmp_path: Path) -> tuple[str, Path]:
    """A PATH whose awk logs the files it is handed, one a line, then runs the real awk."""
    path, _ = counting_path(tmp_path, ("find", "tr"))
    real, log = shutil.which("awk"), tmp_path / "awk-files.log"
    wrapper = Path(path) / "awk"
    wrapper.write_text(f'#!/bin/sh\nprogram="$1"\nshift\nprintf "%s\\n" "$@" >> "{log}"\nexec {real} "$program" "$@"\n')
    wrapper.chmod(0o755)
    return path, log


@pytest.mark.parametrize("tools", [TOOLS, ("tr",)], ids=["find-and-awk", "shell-loop-without-them"])
def test_a_record_over_the_local_readers_bound_is_dropped_by_the_probe(tmp_path: Path, tools: tuple[str, ...]) -> None:
    """read_progress reads at most MAX_RECORD_BYTES of a record; the probe drops a larger one too (before: every
    byte of it was printed, 16 MiB in 3.8 s of mawk), and find never hands it to awk."""
    from hpctrain.health.progress import MAX_RECORD_BYTES

    run = run_dir_of(tmp_path, 3)
    folder = run / PROGRESS_DIR
    at_bound = (folder / "rank-1.json").read_bytes()
    (folder / "rank-1.json").write_bytes(at_bound + b" " * (MAX_RECORD_BYTES - len(at_bound)))  # still read
    (folder / "rank-2.json").write_bytes(at_bound.replace(b'"rank": 1', b'"rank": 2') + b" " * MAX_RECORD_BYTES)
    expected = [(r.rank, r.step, r.host) for r in read_progress(run)]
    assert [rank for rank, _, _ in expected] == [0, 1]
    if tools == TOOLS:
        path, log = logging_awk(tmp_path)
    else:
        path, log = counting_path(tmp_path, tools)
    stdout = probe(run, path)
    assert read_back(stdout) == expected
    assert len(stdout) < 2 * MAX_RECORD_BYTES
    if tools == TOOLS:
        assert sorted(Path(f).name for f in log.read_text().split()) == ["rank-0.json", "rank-1.json"]


def test_awk_drops_a_record_that_outgrew_the_bound_after_find_looked(tmp_path: Path) -> None:
    from hpctrain.health.progress import MAX_RECORD_BYTES
    from hpctrain.servers.top import _JOIN_RECORDS

    run = run_dir_of(tmp_path, 2)
    grown = run / PROGRESS_DIR / "rank-1.json"
    grown.write_bytes(grown.read_bytes() + b"\n" + b" " * MAX_RECORD_BYTES)
    files = sorted((run / PROGRESS_DIR).iterdir())
    out = subprocess.run(["awk", _JOIN_RECORDS, *map(str, files)], capture_output=True, check=True).stdout.decode()
    assert read_back(out) == [(0, 10, "node-0")]
    assert len(out) < MAX_RECORD_BYTES


@pytest.mark.parametrize("separator", ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"])
def test_a_character_that_splitlines_splits_at_cannot_forge_a_probe_line(tmp_path: Path, separator: str) -> None:
    """A record is JSON, whose whitespace may be a \\r: a rank's record (or anyone's who can write the run
    directory) that holds `\\r@gpu 0, 0, ...` made `top` show an idle GPU when lines were split with splitlines."""
    run = run_dir_of(tmp_path, 2)
    forged = run / PROGRESS_DIR / "rank-1.json"
    text = forged.read_text()
    forged.write_bytes((text[:-1] + f"{separator}@gpu 7, 0, 10, 81559{separator}@nogpu{separator}}}").encode())
    stdout = subprocess.run(
        ["/bin/sh", "-c", PROGRESS_PROBE],
        env={"PATH": os.environ["PATH"], "HPCTRAIN_RUN_DIR": str(run)},
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()  # bytes, as the exec stream hands them over (text=True would turn \r into \n)
    (sample,) = parse_probe("@node pod\n@gpu 0, 97, 30000, 81559\n" + stdout, labelled=False)
    assert [g.index for g in sample.gpus] == [0] and sample.nvidia_smi
    assert [r.rank for r in ranks_of([sample])] == [0]


@pytest.mark.parametrize("labelled", [False, True])
def test_a_probe_that_printed_nothing_is_no_sample(labelled: bool) -> None:
    """A pod whose probe could not start (no shell in its image) prints nothing: that must read as no sample, so
    `top` says the probe failed, not a node with nothing on it (splitting at `\\n` leaves an empty last piece)."""
    assert parse_probe("", labelled=labelled) == []
    assert parse_probe("\n", labelled=labelled) == []
    (sample,) = parse_probe("@node pod\n", labelled=False)
    assert sample.node == "pod"
