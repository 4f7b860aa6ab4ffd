"""Slurm hostlists and task-count lists, parsed in Python (no scontrol)."""

from __future__ import annotations

import pytest

from hpctrain.distributed.hostlist import expand_hostlist, expand_tasks_per_node, first_host


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-3,7]", ["node1", "node2", "node3", "node7"]),
        ("gpu-a[01-02],gpu-b5", ["gpu-a01", "gpu-a02", "gpu-b5"]),
        ("node[08-10]", ["node08", "node09", "node10"]),  # padding kept past the width change
        ("n[001-002,010]", ["n001", "n002", "n010"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),  # product, left slowest
        ("a[1-2]b", ["a1b", "a2b"]),
        ("x[3]", ["x3"]),
        ("a,b c", ["a", "b", "c"]),
        ("  node[1-2] ", ["node1", "node2"]),
        ("node[1-2],node1", ["node1", "node2", "node1"]),  # duplicates are Slurm's business
        ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
    ],
)
def test_expand(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts
    assert first_host(text) == hosts[0]


def test_first_host_does_not_expand_huge_ranges() -> None:
    assert first_host("big[0000001-9999999]") == "big0000001"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("node[1-3", "unbalanced '['"),
        ("node1-3]", "unbalanced ']'"),
        ("node[[1]]", "unbalanced '['"),
        ("node[3-1]", "reversed (write 1-3)"),
        ("node[a-b]", "not numeric"),
        ("node[1-]", "empty bound"),
        ("node[]", "empty brackets"),
        ("a,,b", "doubled or stray comma"),
        (",a", "doubled or stray comma"),
        ("n[1-2000000]", "more than"),
    ],
)
def test_malformed_hostlists_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="invalid Slurm hostlist") as info:
        expand_hostlist(text)
    assert message in str(info.value)
    if message != "more than":  # first_host validates the syntax too (but does not expand)
        with pytest.raises(ValueError, match="invalid Slurm hostlist"):
            first_host(text)


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("4", [4]),
        ("2(x3),1", [2, 2, 2, 1]),
        ("1,2", [1, 2]),
        ("8(x2)", [8, 8]),
    ],
)
def test_tasks_per_node(text: str, counts: list[int]) -> None:
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "2(x", "2(x3", "2(3)", "a", "2,,1", "-1", "²"])
def test_tasks_per_node_malformed(text: str) -> None:
    with pytest.raises(ValueError, match="invalid Slurm task count list"):
        expand_tasks_per_node(text)
