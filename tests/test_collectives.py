"""hpctrain's collectives (hpctrain.distributed.collectives), with real torch.distributed over gloo.

The hazard they exist for: with torch releases before mid-2025, ending a gloo process group right after a
collective whose tensors only torch's worker thread still referenced could hang the process for good (a GIL
deadlock in the group's destructor; reproduced with torch 2.2: two processes doing init, torch's own
`all_gather_object`, barrier and destroy in a loop hung within the first 16 rounds in each of three tries). The
round-trip test below does the same with hpctrain's functions; under the floor environment's torch 2.2 it is the
test that fails if they stop keeping their tensors.
"""

from __future__ import annotations

import ast
import gc
import json
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hpctrain.distributed import all_gather_object, all_reduce, destroy_process_group
from hpctrain.distributed import collectives
from training_helpers import clean_environ

SRC = Path(__file__).resolve().parents[1] / "src" / "hpctrain"
COLLECTIVES = {
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "all_gather_into_tensor",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "all_to_all",
    "all_to_all_single",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
}

ROUNDS = r"""
import json, sys
from pathlib import Path
import torch.distributed as dist
from hpctrain.distributed import all_gather_object, barrier, destroy_process_group

rank, rounds, where = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
seen = []
for i in range(rounds):
    dist.init_process_group("gloo", init_method=(where / f"rdzv{i}").as_uri(), rank=rank, world_size=2)
    mine = {"rank": rank, "round": i, "pad": "x" * (5000 * rank + i)}  # the ranks' pickles differ in size
    seen.append([(o["rank"], o["round"], len(o["pad"])) for o in all_gather_object(mine)])
    barrier()
    destroy_process_group()
    print("round", i, file=sys.stderr, flush=True)
print(json.dumps(seen))
"""


def collective_calls(source: str) -> list[str]:
    """`dist.X(...)`, `torch.distributed.X(...)` and `from torch.distributed import X` for collectives X."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in COLLECTIVES:
            owner = ast.unparse(node.func.value)
            if owner in ("dist", "torch.distributed"):
                found.append(f"{owner}.{node.func.attr}")
        if isinstance(node, ast.ImportFrom) and node.module == "torch.distributed":
            found += [f"torch.distributed.{a.name}" for a in node.names if a.name in COLLECTIVES]
    return found


def test_the_scan_finds_a_direct_collective() -> None:
    assert collective_calls("import torch.distributed as dist\ndist.all_gather_object(out, x)\n") == [
        "dist.all_gather_object"
    ]
    assert collective_calls("from torch.distributed import broadcast\n") == ["torch.distributed.broadcast"]
    assert collective_calls("dist.get_rank()\n") == []


@pytest.mark.floor
def test_product_code_runs_collectives_only_through_the_collectives_module() -> None:
    direct = {}
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "distributed" / "collectives.py":
            continue
        calls = collective_calls(path.read_text())
        if calls:
            direct[str(path.relative_to(SRC))] = calls
    assert direct == {}, "use hpctrain.distributed.collectives (see its docstring for why)"


def held_count() -> int:
    """How many collectives' tensors collectives.py keeps now."""
    return len(collectives._held)


def held_bytes() -> int:
    """The bytes of the tensors it keeps."""
    return collectives._held_bytes


@pytest.fixture
def deadlock_era(monkeypatch):
    """This torch treated as one from before the destructor fix (torch < 2.8), so that tensors are kept here too."""
    monkeypatch.setattr(collectives, "FIXED_IN", (99, 0))
    monkeypatch.setattr(collectives, "_held", collectives.deque())
    monkeypatch.setattr(collectives, "_held_bytes", 0)


def test_a_collectives_tensors_outlive_it(tmp_path: Path, deadlock_era) -> None:
    dist.init_process_group("gloo", init_method=(tmp_path / "rdzv").as_uri(), rank=0, world_size=1)
    try:
        before = held_count()
        vote = torch.tensor([3], dtype=torch.int64)
        kept = weakref.ref(vote)
        assert all_reduce(vote, op="max") is vote and vote.item() == 3
        del vote
        gc.collect()
        time.sleep(0.2)  # torch's worker thread has let go of it long since
        assert kept() is not None
        assert held_count() == before + 1
        assert all_gather_object({"a": [1, 2]}) == [{"a": [1, 2]}]
    finally:
        destroy_process_group()


def test_kept_tensors_are_bounded_in_bytes_and_the_newest_is_always_kept(
    tmp_path: Path, deadlock_era, monkeypatch
) -> None:
    """The count bound alone (64 collectives, or all of the last 10 s) let a loop of large all-reduces pin tens of
    GB; now the bytes kept never pass HOLD_BYTES, except the newest collective's own, kept until the next one."""
    monkeypatch.setattr(collectives, "HOLD_BYTES", 1 << 20)
    dist.init_process_group("gloo", init_method=(tmp_path / "rdzv").as_uri(), rank=0, world_size=1)
    try:
        for _ in range(10):
            all_reduce(torch.ones(64 << 10))  # 256 KiB each, dropped by the caller at once
            assert held_bytes() <= 1 << 20
        assert held_count() == 4
        big = torch.ones(1 << 20)  # 4 MiB: over the bound on its own
        kept = weakref.ref(big)
        all_reduce(big)
        del big
        gc.collect()
        assert kept() is not None and held_count() == 1 and held_bytes() == 4 << 20
        all_reduce(torch.ones(1))
        gc.collect()
        assert kept() is None and held_count() == 1
    finally:
        destroy_process_group()


def test_nothing_is_kept_where_the_deadlock_cannot_happen(tmp_path: Path) -> None:
    """torch >= 2.8 (pytorch#154976) and NCCL: no tensor kept. Per-device backends: only gloo's device counts."""
    assert collectives.holds_for("gloo", "cpu") and not collectives.holds_for("nccl", "cuda")
    assert collectives.holds_for("cpu:gloo,cuda:nccl", "cpu")
    assert not collectives.holds_for("cpu:gloo,cuda:nccl", "cuda")
    if collectives.version_tuple(torch.__version__) < collectives.FIXED_IN:
        pytest.skip(f"torch {torch.__version__} has the deadlock: its gloo collectives keep their tensors")
    dist.init_process_group("gloo", init_method=(tmp_path / "rdzv").as_uri(), rank=0, world_size=1)
    try:
        before = held_count()
        all_reduce(torch.ones(4))
        assert held_count() == before
    finally:
        destroy_process_group()


def test_without_a_process_group_they_are_identities() -> None:
    t = torch.tensor([1.0, 2.0])
    assert all_reduce(t) is t and t.tolist() == [1.0, 2.0]
    assert all_gather_object("x") == ["x"]


@pytest.mark.floor
@pytest.mark.slow
def test_many_rounds_of_gather_then_destroy_all_end(tmp_path: Path) -> None:
    rounds = 30
    script = tmp_path / "rounds.py"
    script.write_text(ROUNDS)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(rounds), str(tmp_path)],
            env=clean_environ(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    results = []
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            _, err = proc.communicate()
            pytest.fail(f"rank {rank} never finished its rounds; it last said {err.strip().splitlines()[-1:]}")
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    expected = [[[0, i, i], [1, i, 5000 + i]] for i in range(rounds)]
    assert results == [expected, expected]
