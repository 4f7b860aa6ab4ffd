"""scontrol records, durations and the cluster view, from Slurm 22.05 output recorded on the local cluster."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from hpctrain.schedulers.slurm.commands import slurm
from hpctrain.schedulers.slurm.queries.cluster_state import (
    ClusterInfo,
    fill_shard_use,
    parse_nodes,
    parse_partitions,
    parse_shard_use,
    record_shard_use,
)
from hpctrain.jobs.values import format_duration
from hpctrain.schedulers.slurm.queries.records import (
    parse_record,
    parse_records,
    pick_record,
    printed_duration,
    printed_mem_mb,
)
from hpctrain.errors import UserError

DATA = Path(__file__).parent / "data" / "slurm"


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def test_record_values_may_contain_spaces_and_equals() -> None:
    rec = parse_record(
        "NodeName=n1 OS=Linux 6.1 #1 SMP  RealMemory=9642 CPUs/Task=1 AllocNode:Sid=host:33 TRES=cpu=1,node=1 "
        "Power= X=1"
    )
    assert rec["OS"] == "Linux 6.1 #1 SMP"
    assert rec["CPUs/Task"] == "1"
    assert rec["AllocNode:Sid"] == "host:33"
    assert rec["TRES"] == "cpu=1,node=1"
    assert rec["Power"] == ""
    assert rec["X"] == "1"


PICKED = frozenset(("NodeName", "State", "Partitions", "Gres", "GresUsed", "CPUTot"))
CRAFTED = [
    "NodeName=n1 State=IDLE Reason=bad State=DOWN NodeName=evil Gres=gpu:8",  # a later key in a value: the first wins
    "NodeName=n1 Reason=x State=DOWN",
    "NodeName=n1 State=IDLE foo Gres=gpu:1",  # a value with a space
    "NodeName=n1 State=IDLE  x y=1 Gres=",
    "NodeName=n1 State=IDLE Reason=a b State=c d",  # a later value with a space: the first still wins
    "NodeName=n1\tState=IDLE Gres=gpu:1",  # whitespace other than the space separates fields too
    "NodeName=n1 State=IDLE\x1fGres=gpu:1",
    "NodeName=n1 State=IDLE\u3000Gres=gpu:1 Partitions=\xa0a",
    "NodeName=n1 State=IDLE\x0bGres=gpu:1",
    "  NodeName=n1   State=   Gres=gpu:1   ",
    "XNodeName=n1 Foo:State=IDLE =State=x  State=ok GresUsed=a=b",
    "NodeName=n1 Partitions=a,b Partitions=c NodeName=n2",
    "NodeName=n1 OS=Linux 6.1 #1 SMP State=IDLE Gres=gpu:1 x",
    "State=IDLE",
    "NodeName=",
    "NodeName=n1 State=IDLE State",
    "NodeName=n1 State=a=b Gres=c GresUsed=",
    "Gres=gpu:1 GresUsed=gpu:1(IDX:0) State=MIXED+DRAIN NodeName=n1 CPUTot=8 Reason=x y NodeName=n2",
]


def fuzzed_lines(count: int) -> list[str]:
    """Lines of keys (those picked, others, odd ones), values (empty, with spaces, `=` or keys) and separators
    (spaces, a tab, separators beyond ASCII, none), drawn with a fixed seed."""
    rng = random.Random(41)
    keys = [*sorted(PICKED), "Reason", "OS", "Foo:Bar", "XState", "9State", ""]
    values = ["", "a", "a b", "x=y", "State=1", " NodeName=z", "Gres=g y", "IDLE ", "(null)", "1\t2", "\u2003"]
    separators = [" ", " ", " ", "  ", "\t", "\xa0", "\x1c", "\x1f", ""]
    return [
        "".join(rng.choice(separators) + rng.choice(keys) + "=" + rng.choice(values) for _ in range(rng.randint(1, 9)))
        for _ in range(count)
    ]


def test_picked_keys_are_read_as_the_whole_record_reads_them() -> None:
    """pick_record (the node parse: one scan a line for the keys it reads) gives each key's value exactly as
    parse_record does (the first field of a key wins; a key starts a field only after whitespace; a value runs to
    the next key), on every recorded node line, hand-made forgeries and 5,000 drawn lines."""
    recorded = [line for path in sorted(DATA.rglob("nodes*.txt")) for line in read_lines(path)]
    assert len(recorded) > 10
    lines = [*recorded, *CRAFTED, *fuzzed_lines(5000)]
    for line in lines:
        whole = {key: value for key, value in parse_record(line).items() if key in PICKED}
        assert pick_record(line, PICKED) == whole, line
    spaced = [line for line in lines if line.isascii() and line.isprintable()]  # the space its only whitespace
    assert 300 < len(spaced) < len(lines)
    # parse_records checks a whole text once: the spaced lines alone, and with one line of each other blank
    texts = ["\n".join(spaced), *("\n".join([*spaced, f"NodeName=n1 State=a{blank}Gres=b"]) for blank in "\t\x1f\xa0")]
    for text in ["\n".join(lines), *texts]:
        wholes = [{k: v for k, v in rec.items() if k in PICKED} for rec in parse_records(text)]
        assert parse_records(text, PICKED) == wholes


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_fields_written_into_a_node_reason_are_not_read_as_the_nodes() -> None:
    """A drain reason is free text that comes after the fields the node view reads (24.11's record, drained with a
    reason): a reason that spells them out changes nothing of the node."""
    real = read("24.11/nodes.txt")
    reason = "Reason=bad ib link [root@2025-06-12T18:00:00]"
    assert reason in real
    forged = real.replace(
        reason,
        reason + " NodeName=evil State=IDLE Partitions=all CPUEfctv=999 CPUAlloc=0 RealMemory=1 AllocMem=0 "
        "Gres=gpu:h100:64 GresUsed=gpu:h100:0(IDX:N/A)",
    )
    assert parse_nodes(forged) == parse_nodes(real)
    assert [n.state for n in parse_nodes(forged)] == ["allocated", "idle+drain"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("00:30:00", 1800),
        ("30", 1800),
        ("0:40", 40),
        ("1-02:03:04", 93784),
        ("2-12", 216000),
        ("1-00:01", 86460),
        ("UNLIMITED", None),
        ("INFINITE", None),
        ("N/A", None),
    ],
)
def test_parse_duration(text: str, seconds: int | None) -> None:
    assert printed_duration(text) == seconds


def test_duration_round_trip_and_errors() -> None:
    assert format_duration(93784) == "1-02:03:04"
    assert format_duration(1800) == "00:30:00"
    assert format_duration(None) == "UNLIMITED"
    with pytest.raises(ValueError):
        printed_duration("ten minutes")


@pytest.mark.parametrize(("text", "mb"), [("9642", 9642), ("9642M", 9642), ("16G", 16384), ("UNLIMITED", None)])
def test_parse_mem(text: str, mb: int | None) -> None:
    assert printed_mem_mb(text) == mb


def test_partitions_recorded() -> None:
    parts = {p.name: p for p in parse_partitions(read("partitions_22.05.txt"))}
    assert set(parts) == {"debug", "short"}
    assert parts["debug"].default and not parts["short"].default
    assert parts["debug"].max_time_s is None
    assert parts["short"].max_time_s == 30 * 60
    assert parts["short"].nodes == ("node1", "node2")
    assert parts["debug"].state == "UP"


def test_nodes_recorded_busy() -> None:
    nodes = parse_nodes(read("nodes_22.05_busy.txt"))
    assert [n.name for n in nodes] == ["node1", "node2"]
    for n in nodes:
        assert n.state == "allocated"
        assert (n.cpus_total, n.cpus_alloc) == (2, 2)
        assert n.mem_mb_total == 9642
        assert n.partitions == ("debug", "short")
        assert (n.gpus_total, n.gpus_used, n.shards_total, n.shards_used) == (2, 0, 128, 0)
        assert n.usable


def test_nodes_recorded_with_gpu_and_shard_jobs() -> None:
    node1, node2 = parse_nodes(read("nodes_22.05_gpu_and_shards.txt"))
    assert (node1.gpus_used, node2.gpus_used) == (1, 0)
    assert node1.shards_used is None  # 22.05 says "1(IDX:0)": GPUs, not shards
    assert node2.shards_used == 0


def test_shards_in_use_come_from_the_running_jobs_on_22_05() -> None:
    nodes = parse_nodes(read("nodes_22.05_typed_shards.txt"))
    assert [n.gpu_type for n in nodes] == ["Quadro_RTX_4000", "Quadro_RTX_4000"]
    use: dict[str, dict[int, int]] = {}
    for line in read("jobs_22.05_typed_shards.txt").splitlines():  # the whole dump: one record a line
        record_shard_use(line, parse_record(line)["JobName"], use)
    assert use == {"t1": {0: 56}}  # shard:16 and shard:40 on GPU 0; the gpu:1 job on t2 holds no shards
    t1, t2 = fill_shard_use(nodes, use)
    assert t1.shards_used == 56
    assert t1.shards_per_gpu == ((56, 64), (0, 64))
    assert (t2.shards_used, t2.gpus_used) == (0, 1)


def test_cluster_info_lookups_and_json() -> None:
    info = ClusterInfo(
        partitions=tuple(parse_partitions(read("partitions_22.05.txt"))),
        nodes=tuple(parse_nodes(read("nodes_22.05_busy.txt"))),
    )
    assert info.default_partition is not None and info.default_partition.name == "debug"
    assert info.partition("nope") is None
    short = info.partition("short")
    assert short is not None and [n.name for n in info.nodes_in(short)] == ["node1", "node2"]
    data = json.loads(json.dumps(info.to_dict()))
    assert data["nodes"][0]["shards_per_gpu"] == [[0, 64], [0, 64]]
    assert data["partitions"][1] == {
        "name": "short",
        "default": False,
        "max_time_s": 1800,
        "nodes": ["node1", "node2"],
        "state": "UP",
        "max_nodes": None,
    }


def test_missing_slurm_client_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a real lookup that finds no scontrol
    with pytest.raises(UserError, match="scontrol.*not found.*Slurm client commands"):
        slurm(["scontrol", "show", "node", "-o"])


def test_failing_command_reports_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "scontrol"  # stands in for a controller that is down (the local one must stay up for others)
    fake.write_text(
        "#!/bin/sh\necho 'slurm_load_node error: Unable to contact slurm controller (connect failure)' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HPCTRAIN_SLURM_TIMEOUT", "0.5")  # a query is asked again only while the deadline allows
    with pytest.raises(UserError, match="could not reach the Slurm controller.*scontrol ping"):
        slurm(["scontrol", "show", "node", "-o"])


def test_cluster_commands_do_not_import_torch() -> None:
    """status/logs/cancel/cluster must start fast on a login node: no torch, no numpy."""
    import subprocess
    import sys

    modules = [
        "hpctrain.cli.status",
        "hpctrain.cli.logs",
        "hpctrain.cli.cancel",
        "hpctrain.cli.cluster",
        "hpctrain.schedulers.slurm.checks.live",
        "hpctrain.schedulers.slurm.queries.job_states",
        "hpctrain.schedulers.slurm.queries.cluster_state",
        "hpctrain.schedulers.slurm.queries.output",
        "hpctrain.schedulers.slurm.queries.display",
        "hpctrain.cli.views",
    ]
    code = (
        f"import sys, importlib; [importlib.import_module(m) for m in {modules!r}]; "
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_shard_holders_and_their_records_recorded_on_22_05() -> None:
    """The two steps of `held_shards`, from real 22.05 output of the local cluster while `--gres=shard:16` and
    `--gres=shard:40` jobs (the second named `shard40 JobState=PENDING`) ran on node1's GPU 0 and a `--gres=gpu:1`
    job on node2: squeue names the two shard jobs (query.HOLDER_FIELDS with the token squeue_text.TOKEN); scontrol,
    reading `show job ID` and `show hostnames MARKER<i>` lines on stdin (one unknown id among them), echoes each
    command after its readline prompt and prints the records one a line, each followed by its marker."""
    from hpctrain.schedulers.slurm.queries.cluster_state import HOLDER_FIELDS, parse_shard_holders, session_input
    from hpctrain.schedulers.slurm.queries.records import Fields
    from squeue_text import TOKEN

    holders = parse_shard_holders(read("squeue_shard_holders_22.05.txt"), Fields(HOLDER_FIELDS, TOKEN))
    assert holders == [("143", "shard 16"), ("144", "shard40 JobState=PENDING")]
    marker = "x5eed0f0f5eed0f0f"
    commands = session_input(["143", "144", "99999"], marker)
    session = read("scontrol_session_22.05.txt")
    assert [line for line in session.splitlines() if line.startswith("scontrol: ") and line != "scontrol: "] == [
        "scontrol: " + command for command in commands.splitlines()
    ]
    assert parse_shard_use(session, ["shard 16", "shard40 JobState=PENDING", "gone"], marker) == {"node1": {0: 56}}
