"""Growth of the straggler check (rank 0, every 30 s, while the other ranks wait), the per-rank lines of `status JOB`
and `top JOB`, and the preflight judge, in the number of ranks and nodes: pinned by counting, not timing.

The figures fed in are float and str subclasses that count the operations done on them (additions and
comparisons of step timings; comparisons of node names). Doubling the ranks must not much more than double the
count (N log N: about 2.2 times from 1,000 to 2,000; the quadratic code this replaced grew 4 to 4.5 times). The
equivalence tests check, on random inputs, that the fast code gives exactly what the plain one (written out here)
gives. benchmarks/scale_health.py measures the time.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable
from statistics import StatisticsError, median

import pytest

from hpctrain.health import RankProgress, find_stragglers
from hpctrain.health.preflight import SLOW_SHARE, RankCheck, judge
from hpctrain.health.stragglers import NOISE_SHARE, STALE_S, STRAGGLER_FACTOR, Straggler
from hpctrain.health.view import rank_lines

NOW = 1_000_000.0
OPS = [0]
# Doubling N: N log N gives about 2.2; N^2 gives 4 and more. Anything under 3 is near-linear.
MOST_GROWTH = 3.0


class Timing(float):
    """A step timing that counts the additions and comparisons made with it (and passes the count to its sums)."""

    def _count(self) -> None:
        OPS[0] += 1

    def __add__(self, other: float) -> Timing:
        self._count()
        return Timing(float(self) + float(other))

    __radd__ = __add__

    def __lt__(self, other: float) -> bool:
        self._count()
        return float(self) < float(other)

    def __gt__(self, other: float) -> bool:
        self._count()
        return float(self) > float(other)

    def __le__(self, other: float) -> bool:
        self._count()
        return float(self) <= float(other)

    def __ge__(self, other: float) -> bool:
        self._count()
        return float(self) >= float(other)


class Name(str):
    """A node name that counts the comparisons made with it (equal hashes: the same as a plain str's)."""

    def __eq__(self, other: object) -> bool:
        OPS[0] += 1
        return str.__eq__(self, other)

    def __lt__(self, other: str) -> bool:
        OPS[0] += 1
        return str.__lt__(self, other)

    __hash__ = str.__hash__


def ranks(n: int, seed: int = 0) -> list[RankProgress]:
    """`n` ranks, 8 a node, with a few slow ones (on input or in compute)."""
    rnd = random.Random(seed)
    records = []
    for rank in range(n):
        data, compute = 0.002 + rnd.random() * 0.001, 0.02 + rnd.random() * 0.002
        if rank % 97 == 5:
            data *= 30
        elif rank % 89 == 7:
            compute *= 3
        records.append(
            RankProgress(
                rank,
                n,
                f"node{rank // 8:05d}",
                100,
                "training",
                1,
                10,
                10,
                50,
                10,
                Timing(0.1),
                Timing(data),
                Timing(compute),
                640.0,
                updated=NOW - 1,
            )
        )
    return records


def counted(work: Callable[..., object], *args: object) -> int:
    OPS[0] = 0
    work(*args)
    return OPS[0]


@pytest.mark.parametrize("view", [find_stragglers, rank_lines], ids=["straggler check", "status/top rank lines"])
def test_the_straggler_check_and_the_rank_lines_grow_as_n_log_n(view: Callable[..., object]) -> None:
    small, large = counted(view, ranks(1000), NOW), counted(view, ranks(2000), NOW)
    assert find_stragglers(ranks(2000), NOW)  # the inputs name stragglers: their extra medians are counted too
    assert large / small < MOST_GROWTH, f"{small} operations at 1,000 ranks, {large} at 2,000"


def ring_checks(nodes: int, per_node: int = 2, seed: int = 0) -> list[RankCheck]:
    """A job of `nodes` nodes whose leaders report their two ring links, as the link test measures them; a few
    nodes slow on every link."""
    rnd = random.Random(seed)
    names = [Name(f"n{i:05d}") for i in range(nodes)]
    slow = {i for i in range(nodes) if i % 50 == 3}

    def rate(a: int, b: int) -> float:
        return (0.5 if a in slow or b in slow else 10.0) + rnd.random()

    checks = []
    for i, node in enumerate(names):
        after, before = (i + 1) % nodes, (i - 1) % nodes
        links = {Name(names[after]): rate(i, after), Name(names[before]): rate(i, before)}
        for j in range(per_node):
            checks.append(RankCheck(i * per_node + j, node, 100.0, None, links if j == 0 else {}))
    return checks


def test_the_preflight_judge_grows_as_n_log_n() -> None:
    small, large = counted(judge, ring_checks(1000), 1.0), counted(judge, ring_checks(2000), 1.0)
    assert judge(ring_checks(2000), 1.0).bad  # the slow nodes are named: their lines are counted too
    assert large / small < MOST_GROWTH, f"{small} name comparisons at 1,000 nodes, {large} at 2,000"


# ---- the same answers as the plain code


def plain_stragglers(records: list[RankProgress], now: float) -> list[Straggler]:
    """The rule as the module's docstring states it, each rank against a list of all the others."""
    timed = [
        r for r in records if r.data_s is not None and r.compute_s is not None and r.step_s and r.age_s(now) <= STALE_S
    ]
    if len(timed) < 2:
        return []
    step = median(r.step_s for r in timed)
    found = []
    for r in timed:
        others = [o for o in timed if o.rank != r.rank]
        typical = median(o.data_s + o.compute_s for o in others)
        own = r.data_s + r.compute_s
        if own >= STRAGGLER_FACTOR * typical and own - typical >= NOISE_SHARE * step:
            extra_data = r.data_s - median(o.data_s for o in others)
            extra_compute = r.compute_s - median(o.compute_s for o in others)
            cause = "input" if extra_data >= extra_compute else "compute"
            found.append(Straggler(r.rank, r.host, cause, own, typical, min(1.0, (own - typical) / step), step))
    return found


def random_records(rnd: random.Random) -> list[RankProgress]:
    """Up to 40 records, from a few values (ties), some stale or untimed, and at times one rank twice."""
    n = rnd.randint(0, 40)
    values = [0.001, 0.002, 0.003, 0.02, 0.05, 0.08]
    records = []
    for i in range(n):
        rank = rnd.randrange(n) if rnd.random() < 0.1 else i
        data = rnd.choice(values + [None]) if rnd.random() < 0.1 else rnd.choice(values + [rnd.random() / 10])
        records.append(
            RankProgress(
                rank,
                max(n, 1),
                f"node{rank}",
                1,
                "training",
                1,
                1,
                1,
                1,
                1,
                rnd.choice([0.1, 0.1, 0.2]),
                data,
                rnd.choice(values),
                updated=NOW - rnd.choice([1.0, 1.0, 1.0, 600.0]),
            )
        )
    return records


def test_the_straggler_check_names_what_the_plain_rule_names() -> None:
    rnd = random.Random(32)
    named = 0
    for _ in range(3000):
        records = random_records(rnd)
        try:
            expected = plain_stragglers(records, NOW)
        except StatisticsError:  # every timed record is of one rank: no other to compare with
            with pytest.raises(StatisticsError):
                find_stragglers(records, NOW)
            continue
        assert find_stragglers(records, NOW) == expected
        named += bool(expected)
    assert named > 100  # the inputs do name stragglers


def plain_bad_links(checks: list[RankCheck]) -> dict[str, list[str]]:
    """The link rule as the module's docstring states it, each node against every link."""
    links: dict[tuple[str, str], float] = {}
    for c in checks:
        for peer, rate in c.links.items():
            pair = (min(c.node, peer), max(c.node, peer))
            links[pair] = min(rate, links.get(pair, rate))
    fastest = max(links.values(), default=0.0)
    bad: dict[str, list[str]] = {}
    for node in sorted({c.node for c in checks}):
        own = {pair: rate for pair, rate in links.items() if node in pair}
        if len(links) > 1 and own and all(rate < SLOW_SHARE * fastest for rate in own.values()):
            peers = ", ".join(
                f"{'-'.join(n for n in pair if n != node)} {rate:.2f}" for pair, rate in sorted(own.items())
            )
            bad[node] = [f"its links run at {peers} GB/s, below {SLOW_SHARE:.0%} of the fastest link's {fastest:.2f}"]
    return bad


def test_the_preflight_judge_blames_the_nodes_the_plain_rule_blames() -> None:
    rnd = random.Random(32)
    blamed = 0
    for _ in range(2000):
        nodes = [f"n{i}" for i in range(rnd.randint(1, 12))]
        checks = []
        for rank in range(rnd.randint(1, 20)):
            node = rnd.choice(nodes)
            links = (
                {
                    rnd.choice(nodes + ["elsewhere"]): rnd.choice([0.5, 1.0, 8.0, 10.0, rnd.random() * 10])
                    for _ in range(rnd.randint(0, 3))
                }
                if rnd.random() < 0.5
                else {}
            )
            checks.append(RankCheck(rank, node, 100.0, None, links))
        assert judge(checks, 1.0).bad == plain_bad_links(checks)
        blamed += bool(plain_bad_links(checks))
    assert blamed > 100


@pytest.mark.parametrize("world", [4, 8, 16])
def test_a_hang_report_reads_each_rank_record_once_in_all_not_once_per_rank(tmp_path, monkeypatch, world) -> None:
    """The hang's file-system load, counted: every rank but the last (frozen) notices the hang and runs the hang's
    file work (`RankWatch._hang_files`, here one rank after another in one process, the grace without sleeping).
    One rank reads the N records and writes the report; the others read its one-line verdict. Before, every rank
    that noticed read every rank's record: N (N - 1) opens, 240 at 16 ranks, where now there are 16."""
    from types import SimpleNamespace

    from hpctrain.health.progress import ProgressRecorder
    from hpctrain.training.watch import RankWatch

    monkeypatch.setenv("HPCTRAIN_TERMINATION_LOG", str(tmp_path / "said"))
    monkeypatch.setattr("time.sleep", lambda seconds: None)
    watches = []
    for rank in range(world):
        watch = object.__new__(RankWatch)
        watch.run = SimpleNamespace(
            run_dir=tmp_path,
            device=SimpleNamespace(type="cpu"),
            is_main=rank == 0,
            env=SimpleNamespace(rank=rank, world_size=world, is_distributed=True),
        )
        watch.host, watch._warned = f"node{rank // 8}", set()
        watch.progress = ProgressRecorder(tmp_path, rank, world, watch.host, 10)
        watch.progress.step(1, 8, 8, 64, 0.1, 0.01, 0.02)
        watches.append(watch)
    for watch in watches[:-1]:  # what each one's watchdog records as it fires, before the grace ends anywhere
        watch.progress.phase("hung", waiting_in="the stop vote after step 8", collectives=17)
    opened: list[str] = []
    real_open = os.open

    def counting_open(path, flags, *args, **kwargs):
        opened.append(os.path.basename(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    said = []
    for watch in watches[:-1]:
        watch._hang_files(30.0, 20.0, "the stop vote after step 8", 17, None, "(stacks)\n")
        said.append((tmp_path / "said").read_text())
    monkeypatch.setattr(os, "open", real_open)
    records = [name for name in opened if name.startswith("rank-") and name.endswith(".json")]
    assert len(records) == world, f"{len(records)} opens of progress records at {world} ranks"
    culprit = f"hung at step 8: rank {world - 1} on node{(world - 1) // 8} never arrived"
    assert said == [f"{culprit}; the report: {tmp_path / 'hang' / 'report.txt'}"] * (world - 1)
    assert (tmp_path / "stop_reason").read_text() == "hung\n"


def test_rank_zeros_training_step_reads_no_progress_record_the_straggler_check_runs_on_the_ticker(
    tmp_path, monkeypatch
) -> None:
    """Counted, not timed: the straggler check reads N records (and sorts their timings) every 30 s. It must not
    run in the training step, where every rank would wait for rank 0 meanwhile, but on the watchdog's ticker
    thread. Before, rank 0's `step()` read every record itself when the check was due."""
    from types import SimpleNamespace

    from hpctrain.health.progress import ProgressRecorder
    from hpctrain.training.watch import RankWatch

    world = 8
    for rank in range(1, world):
        other = ProgressRecorder(tmp_path, rank, world, "node0", 10)
        other.step(1, 8, 8, 64, 0.1, 0.01, 0.08 if rank == 5 else 0.02)  # rank 5: a slow forward pass
        other.write("training")
    watch = object.__new__(RankWatch)
    watch.run = SimpleNamespace(
        run_dir=tmp_path, is_main=True, env=SimpleNamespace(rank=0, world_size=world, is_distributed=True)
    )
    watch.progress = ProgressRecorder(tmp_path, 0, world, "node0", 10)
    watch.watchdog, watch.clock = SimpleNamespace(beat=lambda: None), SimpleNamespace(read=lambda: 0.02)
    watch._step_started, watch._data_before, watch._next_check = 0.0, 0.0, 0.0  # a check is due
    watch._suspects, watch._warned, watch.reported, watch._reported_lock = set(), set(), [], threading.Lock()
    opened: list[str] = []
    real_open = os.open

    def counting_open(path, flags, *args, **kwargs):
        opened.append(os.path.basename(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    watch.step(0, 9, 9, 64, 0.01)
    in_step = [name for name in opened if name.startswith("rank-") and name.endswith(".json")]
    assert in_step == [], f"the training step read {len(in_step)} progress records"
    watch._straggler_tick()
    monkeypatch.setattr(os, "open", real_open)
    assert len([name for name in opened if name.startswith("rank-") and name.endswith(".json")]) == world
    assert watch._suspects == {5}  # named once: reported when the next check names it again
