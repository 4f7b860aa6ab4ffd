"""GRES strings as Slurm prints them (recorded from 22.05 here; the per-GPU shard form from newer Slurm)."""

from __future__ import annotations

import pytest

from hpctrain.schedulers.slurm.queries.gres import GresEntry, job_shards_by_gpu, node_usage, parse_gres, split_top_level


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("(null)", []),
        ("", []),
        ("gpu:2,shard:128", [GresEntry("gpu", None, 2), GresEntry("shard", None, 128)]),
        (
            "gpu:Quadro_RTX_4000:2,shard:Quadro_RTX_4000:128",
            [GresEntry("gpu", "Quadro_RTX_4000", 2), GresEntry("shard", "Quadro_RTX_4000", 128)],
        ),
        (
            "gpu:Quadro_RTX_4000:1(IDX:0),shard:Quadro_RTX_4000:32(0/64,32/64)",
            [
                GresEntry("gpu", "Quadro_RTX_4000", 1, indexes=(0,)),
                GresEntry("shard", "Quadro_RTX_4000", 32, per_device=((0, 64), (32, 64))),
            ],
        ),
        ("gpu:a100:4(S:0-1)", [GresEntry("gpu", "a100", 4)]),
        ("gpu:1,shard:(null):1(IDX:0)", [GresEntry("gpu", None, 1), GresEntry("shard", None, 1, indexes=(0,))]),
        ("gpu:0,shard:(null):0(IDX:N/A)", [GresEntry("gpu", None, 0), GresEntry("shard", None, 0, indexes=())]),
        (
            "gpu:a100:3(IDX:0-1,3),mps:400",
            [GresEntry("gpu", "a100", 3, indexes=(0, 1, 3)), GresEntry("mps", None, 400)],
        ),
        ("bandwidth:lustre:no_consume:4G", [GresEntry("bandwidth", "lustre", 4 * 1024**3)]),
    ],
)
def test_parse_gres(text: str, expected: list[GresEntry]) -> None:
    assert parse_gres(text) == expected


@pytest.mark.parametrize("bad", ["gpu", "gpu:two", "gpu:2(IDX:0", "gpu:1(IDX:x)"])
def test_parse_gres_rejects_unknown_forms(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_gres(bad)


def test_split_keeps_commas_inside_parentheses() -> None:
    assert split_top_level("gpu:3(IDX:0-1,3),shard:8(0/4,8/8)") == ["gpu:3(IDX:0-1,3)", "shard:8(0/4,8/8)"]


@pytest.mark.parametrize(
    ("gres", "used", "gpus", "shards_used", "per_gpu"),
    [
        # idle local node: nothing in use, shards spread evenly over the 2 GPUs
        ("gpu:2,shard:128", "gpu:0,shard:(null):0(IDX:N/A)", (2, 0), 0, ((0, 64), (0, 64))),
        # 22.05 with shards in use: the count is GPUs-with-shards, so shards in use are unknown here
        ("gpu:2,shard:128", "gpu:1,shard:(null):1(IDX:0)", (2, 1), None, None),
        # newer Slurm: exact per GPU
        (
            "gpu:Quadro_RTX_4000:2,shard:Quadro_RTX_4000:128",
            "gpu:Quadro_RTX_4000:1(IDX:0),shard:Quadro_RTX_4000:32(0/64,32/64)",
            (2, 1),
            32,
            ((0, 64), (32, 64)),
        ),
        ("gpu:a100:4(S:0-1)", "gpu:a100:4(IDX:0-3)", (4, 4), 0, None),
        ("(null)", "(null)", (0, 0), 0, None),
    ],
)
def test_node_usage(gres, used, gpus, shards_used, per_gpu) -> None:
    usage = node_usage(gres, used)
    assert (usage.gpus_total, usage.gpus_used) == gpus
    assert usage.shards_used == shards_used
    assert usage.shards_per_gpu == per_gpu


def test_typed_gpu_reported() -> None:
    assert node_usage("gpu:Quadro_RTX_4000:2,shard:Quadro_RTX_4000:128", None).gpu_type == "Quadro_RTX_4000"


@pytest.mark.parametrize(
    ("job_gres", "expected"),
    [
        ("shard:16(IDX:0)", {0: 16}),
        ("shard:Quadro_RTX_4000:40(IDX:1)", {1: 40}),
        ("gpu:1(IDX:0)", {}),
        ("shard:5(IDX:0-1)", {0: 3, 1: 2}),
        ("", {}),
    ],
)
def test_job_shards_by_gpu(job_gres: str, expected: dict[int, int]) -> None:
    assert job_shards_by_gpu(job_gres) == expected


# Issue 39, item 8: counts are checked for their use. A node line as `scontrol -d show node -o` prints it (the local
# cluster's gres.conf cannot be given such counts: it is shared, and slurmd refuses them), with an implausible GRES.
IMPLAUSIBLE = [
    ("gpu:99999999999999", "gpu:0", "more than the 1024 GPUs a node can hold"),
    ("gpu:99999999999999,shard:64", "shard:(null):1(IDX:0)", "more than the 1024 GPUs a node can hold"),
    ("gpu:a100:600,gpu:h100:600", "gpu:0", "more than the 1024 GPUs a node can hold"),
    ("gpu:2", "gpu:1(IDX:0-99999999999)", "bad GRES index list"),
    ("gpu:2", "gpu:2(IDX:0-5000)", "names devices beyond the 1024 a node holds"),
    ("gpu:x:(", "gpu:0", "unbalanced parenthesis"),
]


@pytest.mark.parametrize("gres,used,why", IMPLAUSIBLE)
def test_a_node_with_an_implausible_gres_is_refused_in_one_line(gres: str, used: str, why: str) -> None:
    """`Gres=gpu:99999999999999` made `cluster` spin (the shards were split over that many GPUs, one by one); a
    malformed one gave a ValueError traceback."""
    import signal

    from hpctrain.errors import UserError
    from hpctrain.schedulers.slurm.queries.cluster_state import fill_shard_use, parse_nodes

    line = (
        f"NodeName=node9 Arch=x86_64 CPUAlloc=0 CPUEfctv=8 CPUTot=8 Gres={gres} GresUsed={used} "
        "RealMemory=64000 AllocMem=0 State=IDLE Partitions=gpu\n"
    )

    def expired(*_: object) -> None:
        raise TimeoutError("parsing one node line took more than 10 s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(10)
    try:
        with pytest.raises(UserError) as refused:
            fill_shard_use(parse_nodes(line), {"node9": {0: 1}})
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    message = str(refused.value)
    assert why in message and "\n" not in message and message.startswith(f"Slurm reports a node with Gres='{gres}'")
    with pytest.raises(UserError, match="names devices beyond the 1024"):
        job_shards_by_gpu("shard:16(IDX:0-99999999)")
    assert node_usage("gpu:1024", "gpu:1024(IDX:0-1023)").gpus_used == 1024  # the largest plausible node still reads
