"""Sick ranks (hpctrain.health, hpctrain.training.watch): live per-rank progress, stragglers, the hang watchdog and
its report, stack requests.

The pure parts (the straggler rule, the hang report, the watchdog's limit) are checked on records made here. The
rest runs for real: two gloo ranks under torchrun training MNIST, one of them stopped with SIGSTOP (alive, silent,
as a rank stuck in a dead NIC or a swapped-out node) or slowed on its input or its forward pass by
tests/ailing_rank.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from hpctrain.health import (
    ProgressRecorder,
    RankProgress,
    Watchdog,
    find_stragglers,
    hang_report,
    read_progress,
    request_stacks,
)
from hpctrain.health.stacks import StackRequests, answers
from hpctrain.health.watchdog import HANG_FLOOR_S, HANG_STEP_FACTOR
from hpctrain.training.stopping import EXIT_HUNG, EXIT_SICK_NODE
from training_helpers import QUICK, hpctrain, until_explained, wait_for
from training_helpers import torchrun as warm_torchrun

HOST = socket.gethostname()
NOW = 1_000_000.0


def record(
    rank: int,
    data_s: float,
    compute_s: float,
    step_s: float = 0.1,
    phase: str = "training",
    waiting_in: str | None = None,
    step: int = 7,
    age: float = 1.0,
    world: int = 4,
    collectives: int | None = None,
) -> RankProgress:
    return RankProgress(
        rank,
        world,
        f"node{rank}",
        100 + rank,
        phase,
        1,
        step,
        step,
        50,
        10,
        step_s,
        data_s,
        compute_s,
        640.0,
        waiting_in,
        collectives,
        NOW - age,
    )


# ---- stragglers


def test_a_rank_slow_on_input_is_named_with_its_cause() -> None:
    records = [record(0, 0.002, 0.02), record(1, 0.002, 0.021), record(2, 0.060, 0.02), record(3, 0.003, 0.019)]
    [found] = find_stragglers(records, now=NOW)
    assert (found.rank, found.host, found.cause) == (2, "node2", "input")
    assert "rank 2 on node2 is a straggler" in found.describe() and "waiting for input" in found.describe()


def test_a_rank_slow_in_compute_is_named_with_its_cause() -> None:
    [found] = find_stragglers([record(0, 0.002, 0.02), record(1, 0.002, 0.05)], now=NOW)
    assert (found.rank, found.cause) == (1, "compute")


def test_even_ranks_and_tiny_differences_name_nobody() -> None:
    assert find_stragglers([record(0, 0.002, 0.020), record(1, 0.002, 0.022)], now=NOW) == []
    # twice as slow, but 2 ms of a 100 ms step is noise
    assert find_stragglers([record(0, 0.0005, 0.0005), record(1, 0.001, 0.002)], now=NOW) == []


def test_stale_records_and_a_single_rank_are_not_compared() -> None:
    assert find_stragglers([record(0, 0.002, 0.02), record(1, 0.2, 0.02, age=600)], now=NOW) == []
    assert find_stragglers([record(0, 0.2, 0.02)], now=NOW) == []


# ---- the hang report


def test_the_report_names_a_silent_rank_as_the_culprit(tmp_path: Path) -> None:
    records = [
        record(0, 0, 0, phase="hung", waiting_in="the stop vote after step 8", step=8, world=2),
        record(1, 0, 0, step=7, age=40, world=2),
    ]
    report = hang_report(records, 2, 30, 10, tmp_path, NOW)
    assert report.culprits == ["rank 1 on node1"] and report.silent  # perhaps gone with its node
    assert report.summary() == "hung at step 8: rank 1 on node1 never arrived"
    text = report.text()
    assert "rank 0 on node0: waits in the stop vote after step 8;" in text
    assert "culprit: rank 1 on node1 never arrived in the stop vote after step 8, where the other ranks wait" in text
    assert "rank 1 on node1: last seen 40 s ago at step 7" in text


def test_the_report_names_a_rank_stuck_outside_a_collective_and_a_missing_one(tmp_path: Path) -> None:
    records = [
        record(0, 0, 0, phase="hung", waiting_in="the stop vote after step 8", step=8, world=3),
        record(1, 0, 0, phase="hung", step=7, world=3),
    ]
    report = hang_report(records, 3, 30, 10, tmp_path, NOW)
    assert report.culprits == ["rank 1 on node1", "rank 2"] and report.silent  # rank 2: no record at all
    assert not hang_report(records[:2], 2, 30, 10, tmp_path, NOW).silent  # stuck but alive: its watchdog answered
    assert "outside any collective" in report.text() and "rank 2: never wrote a progress record" in report.text()


def test_when_every_rank_waits_in_the_same_place_nobody_is_blamed(tmp_path: Path) -> None:
    records = [
        record(
            r, 0, 0, phase="hung", waiting_in="step 9's gradient all-reduce (backward)", step=8, world=2, collectives=30
        )
        for r in range(2)
    ]
    report = hang_report(records, 2, 30, 10, tmp_path, NOW)
    assert report.culprits == [] and "none found" in report.text() and not report.silent


def test_a_victim_left_behind_by_a_half_done_collective_is_not_blamed(tmp_path: Path) -> None:
    # rank 2 stopped inside the stop vote after step 5: rank 0 had all it needed from it and went on to step 6's
    # backward; rank 1 still waits in the vote. Seen in benchmarks/hang_detection.py with three ranks.
    records = [
        record(
            0, 0, 0, phase="hung", waiting_in="step 6's gradient all-reduce (backward)", step=6, world=3, collectives=20
        ),
        record(1, 0, 0, phase="hung", waiting_in="the stop vote after step 5", step=5, world=3, collectives=18),
        record(2, 0, 0, step=5, age=12, world=3),
    ]
    report = hang_report(records, 3, 30, 10, tmp_path, NOW)
    assert report.culprits == ["rank 2 on node2"]
    assert "rank 1 on node1: waits in the stop vote after step 5, one collective behind the others" in report.text()


def test_a_rank_behind_the_others_is_the_culprit_even_inside_a_collective_context(tmp_path: Path) -> None:
    # rank 2's forward pass never returned (it counts as DDP's forward collective); the others wait in backward
    records = [
        record(
            r, 0, 0, phase="hung", waiting_in="step 9's gradient all-reduce (backward)", step=8, world=3, collectives=31
        )
        for r in (0, 1)
    ]
    records.append(record(2, 0, 0, phase="hung", waiting_in="step 9's forward pass", step=8, world=3, collectives=30))
    report = hang_report(records, 3, 30, 10, tmp_path, NOW)
    assert report.culprits == ["rank 2 on node2"]
    assert "rank 2 on node2: behind the others, still in step 9's forward pass" in report.text()
    assert "never arrived in step 9's gradient all-reduce (backward), where the other ranks wait" in report.text()


def test_status_lines_of_a_run_that_ended_hung(tmp_path: Path) -> None:
    from hpctrain.health.hang import report_path
    from hpctrain.health.view import hang_lines

    records = [
        record(0, 0, 0, phase="hung", waiting_in="the stop vote after step 8", world=2),
        record(1, 0, 0, world=2),
    ]
    report_path(tmp_path).parent.mkdir()
    report_path(tmp_path).write_text(hang_report(records, 2, 30, 10, tmp_path, NOW).text())
    (tmp_path / "stop_reason").write_text("hung\n")
    assert hang_lines(tmp_path) == [
        "hung: no training step completed for 30 s (limit 10 s; --hang-timeout)",
        "culprit: rank 1 on node1 never arrived in the stop vote after step 8, where the other ranks wait",
        f"stacks and the full report: {tmp_path / 'hang'}/",
    ]
    (tmp_path / "stop_reason").write_text("completed\n")  # a later attempt finished: nothing to say
    assert hang_lines(tmp_path) == []


def test_gpu_runs_get_the_nccl_flight_recorder_without_overriding_the_user(tmp_path: Path) -> None:
    # Only the environment is checked: no GPU here to run NCCL (benchmarks/gpu_check.sh runs GPU jobs where one is
    # lent).
    from types import SimpleNamespace

    import torch

    from hpctrain.training.watch import enable_flight_recorder

    environ = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}
    enable_flight_recorder(SimpleNamespace(device=torch.device("cuda", 0), run_dir=tmp_path), environ)
    assert environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50" and environ["TORCH_FR_BUFFER_SIZE"] == "2000"
    assert environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert environ["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "hang" / "nccl-trace-rank-")
    cpu: dict[str, str] = {}
    enable_flight_recorder(SimpleNamespace(device=torch.device("cpu"), run_dir=tmp_path), cpu)
    assert cpu == {}


# ---- the preflight's verdict


def test_a_slow_or_failed_rank_makes_its_node_sick() -> None:
    from hpctrain.health.preflight import RankCheck, judge

    checks = [
        RankCheck(0, "n1", 100.0),
        RankCheck(1, "n1", 96.0),
        RankCheck(2, "n2", 30.0),
        RankCheck(3, "n3", None, "RuntimeError: CUDA error: an illegal memory access"),
    ]
    verdict = judge(checks, 1.5)
    assert verdict.bad_nodes == ["n2", "n3"] and verdict.median_gflops == 96.0
    assert verdict.lines() == [
        "preflight: node n2 is sick: rank 2's GEMM runs at 30.0 GFLOP/s, 31% of the median rank's 96.0 (below 50%)",
        "preflight: node n3 is sick: rank 3's check failed: RuntimeError: CUDA error: an illegal memory access",
        "preflight: submit away from them with --exclude-nodes n2,n3",
    ]
    fine = judge(checks[:2] + [RankCheck(2, "n2", 60.0)], 1.5)
    assert fine.bad == {} and fine.lines() == [
        "preflight: 3 rank(s) on 2 node(s) passed (96.0 GFLOP/s median GEMM, all-reduce 1.50 GB/s)"
    ]


def test_a_node_whose_every_link_is_slow_is_sick_and_one_slow_link_blames_nobody() -> None:
    from hpctrain.health.preflight import RankCheck, judge

    def ring(rates: dict[tuple[str, str], float]) -> list[RankCheck]:  # both ends report each link; b's end is slower
        checks: dict[str, dict[str, float]] = {}
        for (a, b), rate in rates.items():
            checks.setdefault(a, {})[b] = rate * 1.1
            checks.setdefault(b, {})[a] = rate
        return [RankCheck(i, node, 100.0, None, links) for i, (node, links) in enumerate(sorted(checks.items()))]

    three = judge(ring({("n0", "n1"): 10.0, ("n1", "n2"): 2.0, ("n2", "n0"): 3.0}), 1.0)
    assert three.links == {"n0-n1": 10.0, "n1-n2": 2.0, "n0-n2": 3.0}  # the slower end's figure
    assert three.bad == {"n2": ["its links run at n0 3.00, n1 2.00 GB/s, below 50% of the fastest link's 10.00"]}
    four = judge(ring({("n0", "n1"): 10.0, ("n1", "n2"): 2.0, ("n2", "n3"): 9.0, ("n3", "n0"): 9.5}), 1.0)
    assert four.bad == {} and "4 node link(s) 2.00-10.00 GB/s" in four.lines()[0]  # n1-n2 alone: neither is blamed
    two = judge(ring({("n0", "n1"): 0.01}), 1.0)
    assert two.bad == {}  # one link: nothing to compare it with


def test_the_link_test_pairs_node_leaders_around_a_ring_one_pair_per_rank_per_round() -> None:
    from hpctrain.health.preflight import link_pairs

    assert link_pairs(["a", "a"]) == []
    assert link_pairs(["a", "a", "b", "b"]) == [[(0, 2)]]
    assert link_pairs(["a", "b", "c"]) == [[(0, 1)], [(1, 2)], [(2, 0)]]
    assert link_pairs(["a", "a", "b", "b", "c", "c", "d", "d"]) == [[(0, 2), (4, 6)], [(2, 4), (6, 0)]]
    five = link_pairs(list("abcde"))
    assert sorted(p for r in five for p in r) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0)] and len(five) == 3
    assert all(len({rank for pair in r for rank in pair}) == 2 * len(r) for r in five)


def test_the_preflight_is_on_by_default_only_for_gpu_jobs_on_several_nodes() -> None:
    from types import SimpleNamespace

    import torch

    from hpctrain.training.preflight_measure import wanted

    def run(nodes: int, device: str, chosen: bool | None = None, only: bool = False) -> SimpleNamespace:
        return SimpleNamespace(
            cfg=SimpleNamespace(preflight=chosen, preflight_only=only),
            env=SimpleNamespace(num_nodes=nodes),
            device=torch.device(device),
        )

    assert wanted(run(2, "cuda")) and not wanted(run(1, "cuda"))
    assert not wanted(run(4, "cpu"))  # shared CPU nodes: a busy neighbour is not a sick node
    assert wanted(run(1, "cpu", chosen=True)) and not wanted(run(2, "cuda", chosen=False))
    assert wanted(run(1, "cpu", only=True))


# ---- progress records


def test_records_are_written_read_and_filtered(tmp_path: Path) -> None:
    rec = ProgressRecorder(tmp_path, 1, 2, "here", 50, interval_s=0.0)
    rec.step(1, 1, 1, 32, 0.1, 0.02, 0.03)
    rec.step(1, 2, 2, 32, 0.3, 0.04, 0.05)  # interval 0: written at every step, with that step's means
    [r] = read_progress(tmp_path)
    assert (r.rank, r.step, r.steps, r.phase) == (1, 2, 1, "training")
    assert r.step_s == pytest.approx(0.3) and r.images_per_s == pytest.approx(32 / 0.3)
    (tmp_path / "progress" / "rank-0.json").write_text("{not json")
    (tmp_path / "progress" / "rank-5.json").write_text(json.dumps({**rec.as_dict(), "rank": 5, "updated": 1.0}))
    assert [r.rank for r in read_progress(tmp_path)] == [1]  # junk skipped; rank 5 is beyond the world of 2
    rec.phase("evaluating")
    [r] = read_progress(tmp_path)
    assert r.phase == "evaluating" and r.step_s == pytest.approx(0.3)  # the last timings stay


def test_a_rank_removes_the_temporaries_its_killed_predecessors_left_and_no_others(tmp_path: Path) -> None:
    # A process killed between write_atomic's write and its rename leaves `.NAME.tmp-PID`; the rank's next process
    # (a torchrun restart, a requeue) removes those of its own record: another rank's are that rank's business.
    folder = tmp_path / "progress"
    folder.mkdir()
    stale = [folder / ".rank-1.json.tmp-4242", folder / ".rank-1.json.tmp-4243"]
    other = [folder / ".rank-0.json.tmp-4244", folder / ".rank-11.json.tmp-4245", folder / "rank-1.json.tmp-4246"]
    for path in stale + other:
        path.write_text("{")
    ProgressRecorder(tmp_path, 1, 12, "here", 50)
    assert not any(p.exists() for p in stale) and all(p.exists() for p in other)


def test_the_first_step_after_another_phase_is_written_at_once(tmp_path: Path) -> None:
    rec = ProgressRecorder(tmp_path, 0, 1, "here", 50, interval_s=3600.0)
    rec.step(1, 1, 1, 32, 0.1, 0.0, 0.0)
    rec.step(1, 2, 2, 32, 0.1, 0.0, 0.0)  # within the interval: not written
    assert read_progress(tmp_path)[0].step == 1
    rec.phase("evaluating")
    rec.step(2, 3, 1, 32, 0.1, 0.0, 0.0)
    assert read_progress(tmp_path)[0].step == 3


# ---- the watchdog


def test_the_automatic_limit_follows_the_slowest_step() -> None:
    dog = Watchdog(None, 500.0, lambda *_: None)
    assert dog.limit() == 500.0  # no step yet
    dog.beat()
    dog._mark = (dog._mark[0] - 30.0, dog._mark[1])  # a 30 s step
    dog.beat()
    assert dog.limit() == pytest.approx(max(HANG_FLOOR_S, HANG_STEP_FACTOR * 30.0), abs=0.1)
    with dog.long_phase():
        assert dog.limit() == 500.0
    assert Watchdog(0, 500.0, lambda *_: None).enabled is False


def test_the_watchdog_fires_once_when_steps_stop() -> None:
    fired: list[tuple[float, float]] = []
    dog = Watchdog(0.3, 60.0, lambda quiet, limit: fired.append((quiet, limit)), poll_s=0.05).start()
    try:
        for _ in range(5):
            dog.beat()
            time.sleep(0.05)
        assert fired == []
        time.sleep(1.0)
        assert len(fired) == 1 and fired[0][0] > 0.3 and fired[0][1] == 0.3
    finally:
        dog.stop()


def test_a_stack_request_is_answered_with_every_threads_stack(tmp_path: Path) -> None:
    answering = StackRequests(tmp_path, 3, "here")
    parked = threading.Event()
    thread = threading.Thread(target=parked.wait, name="parked-thread", daemon=True)
    thread.start()
    try:
        time.sleep(0.01)
        asked = request_stacks(tmp_path)
        answering.check()
        [answer] = answers(tmp_path, asked)
        text = answer.read_text()
        assert answer.name == "rank-3.txt" and text.startswith("rank 3 on here")
        assert "test_a_stack_request_is_answered" in text and "in wait" in text  # this thread and the parked one
        answer.unlink()
        answering.check()  # the same request is answered once
        assert answers(tmp_path, asked) == []
    finally:
        parked.set()


# ---- for real: two ranks under torchrun


AILING = (str(Path(__file__).with_name("ailing_rank.py")),)  # torchrun's entry: hpctrain with one ailing rank


def classic_run(data_dir: Path, run_dir: Path) -> list[str]:
    return ["train", "mnist", *QUICK, "--recipe", "classic", "--data-dir", str(data_dir), "--run-dir", str(run_dir)]


def torchrun(
    data_dir: Path,
    run_dir: Path,
    *args: str,
    env: dict[str, str] | None = None,
    entry: tuple[str, ...] = ("-m", "hpctrain"),
):
    return warm_torchrun(
        ["--standalone", "--nproc-per-node", "2", "--max-restarts", "0"],
        list(entry),
        [
            "train",
            "mnist",
            *QUICK,
            "--recipe",
            "classic",
            "--data-dir",
            str(data_dir),
            "--run-dir",
            str(run_dir),
            *args,
        ],
        env={"PYTHONUNBUFFERED": "1", **(env or {})},
    )


@pytest.mark.slow
@pytest.mark.parametrize("frozen", [0, 1])
def test_a_frozen_rank_is_found_named_and_the_attempt_ends_as_hung(fashion_data_dir, tmp_path, frozen) -> None:
    run_dir = tmp_path / "run"
    process = torchrun(fashion_data_dir, run_dir, "--train-limit", "8192", "--hang-timeout", "4")

    def freeze() -> int:
        pid = next(r.pid for r in read_progress(run_dir) if r.rank == frozen)
        os.kill(pid, signal.SIGSTOP)  # alive but silent: what a rank stuck on a dead NIC or swapped out looks like
        return pid

    output = until_explained(process, "step 3/", freeze, "hpctrain: culprit:")
    text = "".join(output)
    other = 1 - frozen
    report = (run_dir / "hang" / "report.txt").read_text()
    assert f"culprit: rank {frozen} on {HOST} never arrived in " in report, text
    assert f"rank {other} on {HOST}: waits in " in report
    assert f"rank {frozen} on {HOST}: last seen" in report and "no stacks" in report
    stacks = (run_dir / "hang" / f"rank-{other}.txt").read_text()
    assert stacks.startswith(f"rank {other} on {HOST}") and "hpctrain/training/" in stacks
    assert not (run_dir / "hang" / f"rank-{frozen}.txt").exists()
    assert (run_dir / "stop_reason").read_text().strip() == "hung"
    assert f"exitcode  : {EXIT_HUNG} " in text  # torchrun's summary of the rank whose watchdog ended it
    # A silent rank may be a node gone without closing its connections: the loss is noted for torchrun's next
    # group (here there is none: --max-restarts 0), from the moment the reporting rank's wait began.
    lost = json.loads((run_dir / "peer_lost.json").read_text())
    reporter = next(r for r in read_progress(run_dir) if r.rank == other)
    assert lost["step"] == reporter.step and lost["step"] > 0, (lost, reporter)
    assert lost["seen_at"] <= (run_dir / "hang" / "report.txt").stat().st_mtime - 4, lost  # --hang-timeout 4


@pytest.mark.slow
def test_a_rank_whose_forward_pass_never_returns_is_named_as_behind(fashion_data_dir, tmp_path) -> None:
    run_dir = tmp_path / "run"
    said = tmp_path / "termination-log"  # what a Kubernetes pod's status would show (its terminationMessagePath)
    env = {
        "HPCTRAIN_TEST_AILING_RANK": "1",
        "HPCTRAIN_TEST_AILING": "stall",
        "HPCTRAIN_TEST_AILING_S": "5",
        "HPCTRAIN_TERMINATION_LOG": str(said),
    }
    process = torchrun(
        fashion_data_dir,
        run_dir,
        "--train-limit",
        "8192",
        "--hang-timeout",
        "4",
        env=env,
        entry=AILING,
    )
    output, _ = process.communicate(timeout=300)
    assert process.returncode != 0, output
    assert said.read_text().startswith("hung at step ") and said.read_text().endswith("hang/report.txt"), output
    report = (run_dir / "hang" / "report.txt").read_text()
    assert f"rank 1 on {HOST}: behind the others, still in step 6's forward pass" in report, output
    assert f"culprit: rank 1 on {HOST} never arrived in step 6's gradient all-reduce (backward)" in report, output
    stacks = (run_dir / "hang" / "rank-1.txt").read_text()  # its watchdog answered: the stack shows where it is
    assert "in stalled" in stacks and "ailing_rank.py" in stacks


@pytest.mark.slow
def test_debug_stacks_shows_where_each_rank_of_a_stuck_run_waits(fashion_data_dir, tmp_path) -> None:
    """`hpctrain debug stacks` on a run that makes no progress: rank 1's forward pass never returns (the hang limit
    is off, so nothing ends the run while the test asks), and both ranks' watchdog threads answer."""
    run_dir = tmp_path / "run"
    env = {"HPCTRAIN_TEST_AILING_RANK": "1", "HPCTRAIN_TEST_AILING": "stall", "HPCTRAIN_TEST_AILING_S": "3"}
    process = torchrun(
        fashion_data_dir,
        run_dir,
        "--hang-timeout",
        "0",
        "--train-limit",
        "8192",
        env=env,
        entry=AILING,
    )
    output: list[str] = []
    try:
        wait_for(process, "step 3/", output)
        asked = hpctrain("debug", "stacks", "any-job", "--run-dir", str(run_dir), "--wait", "120")
        assert asked.returncode == 0, asked.stdout + asked.stderr
        files = [Path(line) for line in asked.stdout.split()]
        assert [f.name for f in files] == ["rank-0.txt", "rank-1.txt"], asked.stdout
        for f in files:  # the main thread, in the loop, and the watchdog's thread that wrote it
            assert "hpctrain/training/" in f.read_text() and "hpctrain/health/watchdog.py" in f.read_text()
        assert "in stalled" in files[1].read_text() and "ailing_rank.py" in files[1].read_text()
        assert process.poll() is None, "".join(output)  # still stuck: nothing but the test ends it
    finally:
        for record in read_progress(run_dir):  # the ranks first: torchrun's agent would wait 30 s for them
            os.kill(record.pid, signal.SIGKILL)
        process.kill()
        process.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize("sick", [False, True])
def test_the_preflight_passes_or_stops_before_the_first_step_naming_the_node(fashion_data_dir, tmp_path, sick):
    run_dir = tmp_path / "run"
    env = {"HPCTRAIN_TEST_AILING_RANK": "1", "HPCTRAIN_TEST_AILING": "sick-gemm"} if sick else {}
    process = torchrun(
        fashion_data_dir,
        run_dir,
        "--epochs",
        "1",
        "--preflight",
        env=env,
        entry=AILING,
    )
    output, _ = process.communicate(timeout=300)
    record = json.loads((run_dir / "preflight.json").read_text())
    assert [c["rank"] for c in record["checks"]] == [0, 1] and record["allreduce_gbps"] > 0
    if not sick:
        assert process.returncode == 0, output
        assert "hpctrain: preflight: 2 rank(s) on 1 node(s) passed" in output
        assert not (run_dir / "bad_nodes").exists()
        return
    assert process.returncode != 0 and f"exitcode  : {EXIT_SICK_NODE} " in output, output
    assert f"hpctrain: preflight: node {HOST} is sick: rank 1's GEMM runs at " in output
    assert f"the preflight found sick node(s) before the first step: {HOST} " in output
    assert (run_dir / "bad_nodes").read_text() == f"{HOST}\n"
    assert (run_dir / "stop_reason").read_text().strip() == "sick_node"
    assert not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text().strip()


@pytest.mark.slow
def test_the_preflight_names_the_node_whose_links_are_slow(fashion_data_dir, tmp_path) -> None:
    """Three processes, each playing a node of its own (tests/ailing_rank.py); rank 2's link test reports a
    twentieth of its exchanges' rates, so both of node2's links are slow and node0-node1's is not."""
    run_dir = tmp_path / "run"
    process = warm_torchrun(
        ["--standalone", "--nproc-per-node", "3", "--max-restarts", "0"],
        list(AILING),
        [
            "train",
            "mnist",
            *QUICK,
            "--recipe",
            "classic",
            "--data-dir",
            str(fashion_data_dir),
            "--run-dir",
            str(run_dir),
        ]
        + ["--epochs", "1", "--batch-size", "66", "--preflight"],
        env={
            "PYTHONUNBUFFERED": "1",
            "HPCTRAIN_TEST_NODE_PER_RANK": "1",
            "HPCTRAIN_TEST_AILING_RANK": "2",
            "HPCTRAIN_TEST_AILING": "sick-link",
        },
    )
    output, _ = process.communicate(timeout=300)
    record = json.loads((run_dir / "preflight.json").read_text())
    assert sorted(record["links_gbps"]) == ["node0-node1", "node0-node2", "node1-node2"], record
    assert process.returncode != 0 and f"exitcode  : {EXIT_SICK_NODE} " in output, output
    assert "hpctrain: preflight: node node2 is sick: its links run at node0 " in output, output
    assert (run_dir / "bad_nodes").read_text() == "node2\n"


@pytest.mark.slow
@pytest.mark.parametrize("cause", ["input", "compute"])
def test_a_slow_rank_is_named_as_the_straggler_with_its_cause(fashion_data_dir, tmp_path, cause) -> None:
    run_dir = tmp_path / "run"
    env = {"HPCTRAIN_TEST_AILING_RANK": "1", "HPCTRAIN_TEST_AILING": cause, "HPCTRAIN_TEST_AILING_S": "0.03"}
    process = torchrun(
        fashion_data_dir,
        run_dir,
        "--train-limit",
        "6144",
        "--epochs",
        "1",
        env=env,
        entry=AILING,
    )
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    warnings = [line for line in output.splitlines() if "is a straggler" in line]
    assert warnings and all(f"rank 1 on {HOST} is a straggler" in w for w in warnings), output
    what = "waiting for input" if cause == "input" else "computing (forward pass)"
    assert what in warnings[0]
    [epoch] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(s["rank"], s["cause"]) for s in epoch["stragglers"]] == [(1, cause)]
    records = read_progress(run_dir)
    assert [r.phase for r in records] == ["finished", "finished"]


def test_termination_message_only_where_a_container_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hpctrain.training.stopping import write_termination_message

    target = tmp_path / "termination-log"
    monkeypatch.delenv("HPCTRAIN_TERMINATION_LOG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    write_termination_message("sick_node: n1")  # not in a container: nothing, anywhere
    monkeypatch.setenv("HPCTRAIN_TERMINATION_LOG", str(target))
    write_termination_message("x" * 5000)
    assert target.read_bytes() == b"x" * 4096  # what the kubelet keeps
    write_termination_message("sick_node: n1,n2")
    assert target.read_text() == "sick_node: n1,n2"  # replaced, not appended


def test_status_names_what_replicas_said_and_the_flag_for_sick_nodes() -> None:
    from hpctrain.schedulers.base import JobStatus, ReplicaStatus
    from hpctrain.schedulers.kubernetes.queries.display import ended_lines

    said = ("sick_node: gpu07", "sick_node: gpu07", "hung at step 5: rank 1 on w-1 never arrived; the report: R")
    status = JobStatus(
        job_id="j",
        state="FAILED",
        replicas=tuple(
            ReplicaStatus(name=f"worker-{i}", phase="Failed", exit_code=144, message=m) for i, m in enumerate(said)
        ),
    )
    assert ended_lines(status) == [
        "ended: worker-0, worker-1: sick_node: gpu07",
        "ended: worker-2: hung at step 5: rank 1 on w-1 never arrived; the report: R",
        "sick node(s) gpu07: pods restart in place, on the same nodes; submit again away from them with `hpctrain "
        "submit --exclude-nodes gpu07 ...` (and `train ... --resume` to continue from the newest checkpoint)",
    ]
    assert ended_lines(JobStatus(job_id="j", state="RUNNING")) == []
