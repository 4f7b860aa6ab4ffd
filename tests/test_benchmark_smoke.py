"""The benchmarks this project's figures come from still run: each in its smallest form, on the CPU (their figures
come from real runs, recorded in docs/benchmarks.md; these only keep the scripts from rotting between GPU leases)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from training_helpers import clean_environ

ROOT = Path(__file__).resolve().parents[1]


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=clean_environ(), capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_stop_vote_benchmark_measures_each_mode() -> None:
    result = bench("benchmarks/stop_vote.py", "--device", "cpu", "--steps", "5", "--blocks", "1")
    assert result.returncode == 0, result.stderr
    rows = [line.split("|")[1].strip() for line in result.stdout.splitlines() if line.startswith("| ")]
    assert rows[1:] == ["none", "agree", "stepvote"], result.stdout


@pytest.mark.slow
def test_mnist_step_cost_benchmark_compares_the_two_networks_and_the_two_types() -> None:
    result = bench("benchmarks/mnist_step_cost.py", "--threads", "1", "--steps", "2", "--rounds", "1")
    assert result.returncode == 0, result.stderr
    rows = [
        line.split(" us per image")[0].rsplit(None, 1) for line in result.stdout.splitlines() if "us per image" in line
    ]
    assert [name.strip() for name, _ in rows] == [
        "before (16, 32, 64 trained)",
        "now (8 frozen, 24, 64)",
        "now, float32",
        "now, bfloat16 autocast",
    ], result.stdout
    assert all(float(us) > 0 for _, us in rows), result.stdout
    assert "bfloat16 / float32 step time: " in result.stdout and "the table picked " in result.stdout, result.stdout


@pytest.mark.slow
def test_preflight_links_benchmark_times_a_ring_of_three() -> None:
    result = bench(
        "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3", "benchmarks/preflight_links.py"
    )
    assert result.returncode == 0, result.stderr
    assert "link test, 3 nodes: " in result.stdout and "rank 0's links: node1 " in result.stdout, result.stdout


@pytest.mark.slow
def test_imagenet_gpu_benchmark_smoke_run_with_hard_linked_copies(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    result = bench(
        "benchmarks/imagenet_gpu.py",
        "--device",
        "cpu",
        "--archs",
        "shufflenet_v2_x0_5",  # the smallest torchvision model the suite trains: the rows, not the model, are tested
        "--steps",
        "1",
        "--workers",
        "1",
        "--images",
        "6",
        "--copies",
        "3",
        "--backends",
        "cpu,raw",
        "--raw-max-side",
        "64",
        "--no-synthetic",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["backend"] for row in rows] == ["cpu", "raw"], rows
    assert all(row["images_per_s"] > 0 and "error" not in row for row in rows), rows
    assert "per image" in result.stdout  # the raw shards' size, as prepare states it


def test_decode_paths_benchmark_times_every_input_path() -> None:
    result = bench("benchmarks/decode_paths.py", "--images", "3", "--rounds", "1", "--size", "64", "--max-sides", "96")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {line.split("|")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("| ")}
    assert {"full", "draft", "jpeg 96", "raw 96"} <= set(rows), result.stdout


@pytest.mark.k8s
@pytest.mark.slow
@pytest.mark.real_node
def test_k8s_turnaround_benchmark_runs_on_the_real_node() -> None:
    from real_node import WHOLE, node_share
    from test_k8s_real_pods import node_status

    node_status()  # skips without a Ready node (where scripts/test.sh started one: fails)
    with node_share(WHOLE):  # its 2-pod job takes the node's CPUs
        result = bench("benchmarks/k8s_turnaround.py", "--runs", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "cancel -> pods gone" in result.stdout, result.stdout
    assert "kubernetes imported by the CLI and a Kubernetes render: False" in result.stdout, result.stdout


def test_scale_health_benchmark_times_each_call_before_and_now() -> None:
    # "before" is this same tree here: the point is that the compare path runs
    result = bench("benchmarks/scale_health.py", "--sizes", "16,32", "--repeat", "1", "--compare", str(ROOT / "src"))
    assert result.returncode == 0, result.stderr
    rows = [line.split("|")[1].strip() for line in result.stdout.splitlines() if line.startswith("| ")]
    assert rows == [
        "what",
        "straggler check (rank 0)",
        "status/top rank lines",
        "preflight judge (N nodes)",
        "preflight link pairs (N nodes)",
    ], result.stdout


@pytest.mark.slow
def test_launcher_cpu_benchmark_counts_every_process_of_a_run(fashion_mnist_source: Path) -> None:
    result = bench(
        "benchmarks/launcher_cpu.py", "--data-dir", str(fashion_mnist_source), "--repeat", "1", "--train-limit", "256"
    )
    assert result.returncode == 0, result.stderr
    [row] = [line for line in result.stdout.splitlines() if line.startswith("| this ")]
    assert float(row.split("median ")[1].split(" s")[0]) > 0, result.stdout


@pytest.mark.slow
def test_elastic_rendezvous_benchmark_counts_a_membership_change() -> None:
    result = bench("benchmarks/elastic_rendezvous.py", "--sizes", "2,3", "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert [row["agents"] for row in figures["rows"]] == [2, 3], figures
    assert all(row["rendezvous_requests"] > 0 and row["rendezvous_bytes"] > 0 for row in figures["rows"]), figures
    assert set(figures["at_1000"]) == {"rendezvous_requests", "rendezvous_requests_max_agent", "rendezvous_bytes"}


@pytest.mark.slow
def test_gloo_missed_close_benchmark_kills_a_peer_beside_a_running_and_a_stopped_rank() -> None:
    result = bench("benchmarks/gloo_missed_close.py", "--trials", "1", "--timeout", "3")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout.splitlines()[-1])
    assert [r["mode"] for r in rows] == ["running", "stopped"], rows
    # A rank whose gloo thread runs sees its peer's death at once; a stopped one may (the race the figure counts).
    assert rows[0]["verdict"] == "closed" and rows[1]["verdict"] in ("closed", "timed out"), rows
    assert all(r["ops"] >= 200 for r in rows), rows  # killed once going, never before
