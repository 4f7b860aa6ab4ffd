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
    from hpctrain.schedulers.kubernetes import pods
    from hpctrain.schedulers.kubernetes.rest import RawApi

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
