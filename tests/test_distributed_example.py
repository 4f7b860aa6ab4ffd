"""examples/ddp_user_script.py under real torchrun (2 gloo processes on CPU), then resumed as one process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain import checkpoint
from hpctrain.health import read_progress
from training_helpers import clean_environ

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ddp_user_script.py"


def run(cmd: list[str], cwd: Path) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=clean_environ(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def losses(output: str) -> list[float]:
    return [float(m) for m in re.findall(r"^epoch \d+ loss ([0-9.e-]+)$", output, re.MULTILINE)]


@pytest.mark.floor
@pytest.mark.slow
def test_example_under_torchrun_then_resumed_single_process(tmp_path: Path) -> None:
    out = run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(EXAMPLE), "--run-dir", "run", "--epochs", "2", "--device", "cpu"],
        tmp_path,
    )
    assert "[rank 0] rank 0/2 (local 0/2, node 0/1) via torchrun" in out
    assert "[rank 1] rank 1/2 (local 1/2, node 0/1) via torchrun" in out
    first = losses(out)
    assert len(first) == 2 and first[1] < first[0]  # the two ranks trained one model together
    ckpt_dir = tmp_path / "run" / "checkpoints"
    assert checkpoint.find_latest(ckpt_dir).world_size == 2
    records = read_progress(tmp_path / "run")  # the example's live records (hpctrain.health)
    assert [(r.rank, r.phase, r.step) for r in records] == [(0, "finished", 64), (1, "finished", 64)]

    # The DDP checkpoint resumes in a single process, which trains one more epoch.
    out = run([sys.executable, str(EXAMPLE), "--run-dir", "run", "--epochs", "3", "--device", "cpu"], tmp_path)
    assert "single process (launcher none)" in out
    assert "resumed from epoch 2" in out
    assert len(losses(out)) == 1
    latest = checkpoint.find_latest(ckpt_dir)
    assert (latest.epoch, latest.world_size) == (3, 1)
    assert sorted(p.name for p in ckpt_dir.glob("*.pt")) == ["checkpoint_epoch_2.pt", "checkpoint_epoch_3.pt"]
