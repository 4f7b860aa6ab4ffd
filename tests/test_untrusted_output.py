"""What hpctrain prints of text it does not control (job and node names, paths, records read back) is printed as
that text: never as rich markup, never as an unquoted word of a paste-ready command, never with a URL's password.

The Slurm cases run against the real local cluster (its job names are anyone's); the rest are pure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.errors import UserError
from hpctrain.schedulers.slurm.display import print_cluster
from hpctrain.schedulers.slurm.query import ClusterInfo, NodeInfo, PartitionInfo

HOSTILE_NAMES = ("exp[bs=64]", "[/data/x]", "[bold red]loud[/]", "a[/]b", "[link=http://x]y")


def hpctrain(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpctrain", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slurm
def test_status_prints_job_names_as_they_are(slurm_cluster, tmp_path: Path) -> None:
    jobs = [slurm_cluster.sbatch("-J", name, "--hold", "-o", "/dev/null", "--wrap", "true", cwd=tmp_path)
            for name in HOSTILE_NAMES]
    try:
        for listing in (hpctrain("status"), hpctrain("status", "--all-users")):
            assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing
            for name in HOSTILE_NAMES:
                assert name in listing.stdout, listing.stdout
        for job, name in zip(jobs, HOSTILE_NAMES):
            one = hpctrain("status", job)
            assert one.returncode == 0 and "Traceback" not in one.stderr, one
            assert name in one.stdout, one.stdout
    finally:
        for job in jobs:
            slurm_cluster.cancel_quietly(job)


def test_cluster_prints_node_and_partition_names_as_they_are(capsys) -> None:
    nodes = tuple(NodeInfo(name=name, state="idle", partitions=(f"p{name}",), cpus_total=4, cpus_alloc=0,
                           mem_mb_total=1024, mem_mb_alloc=0, gpu_type=f"t{name}", gpus_total=1, gpus_used=0,
                           shards_total=0, shards_used=None, shards_per_gpu=None) for name in HOSTILE_NAMES)
    parts = tuple(PartitionInfo(name=f"p{name}", state="up", default=False, max_time_s=None, nodes=(name,))
                  for name in HOSTILE_NAMES)
    print_cluster(ClusterInfo(partitions=parts, nodes=nodes), as_json=False)
    out = capsys.readouterr().out
    for name in HOSTILE_NAMES:
        assert name in out and f"p{name}" in out, out
