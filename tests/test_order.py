"""The order the suite runs in (tests/conftest.py: long tests first, one kind beside another)."""

from __future__ import annotations

from types import SimpleNamespace

from conftest import long_first


def _item(name: str, markers: tuple[str, ...] = (), fixtures: tuple[str, ...] = ()) -> SimpleNamespace:
    return SimpleNamespace(
        nodeid=name, fixturenames=list(fixtures), get_closest_marker=lambda m: m if m in markers else None
    )


def test_long_tests_come_first_and_the_real_node_ones_are_spread_among_them() -> None:
    items = [
        _item("fast1"),
        _item("node1", ("k8s", "slow"), ("real",)),
        _item("slurm1", ("slurm", "slow")),
        _item("node2", ("k8s", "slow"), ("real_cpu",)),
        _item("slow1", ("slow",)),
        _item("fast2"),
        _item("slurm2", ("slurm",)),
        _item("slow2", ("slow",)),
        _item("node3", (), ("real_free",)),
    ]
    assert [i.nodeid for i in long_first(items)] == [
        "node1",
        "slurm1",
        "slow1",
        "node2",
        "slurm2",
        "slow2",
        "node3",
        "fast1",
        "fast2",
    ]


def test_an_unmarked_suite_keeps_its_order() -> None:
    items = [_item(f"t{i}") for i in range(5)]
    assert long_first(items) == items
