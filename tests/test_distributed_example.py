"""examples/ddp_user_script.py under real torchrun (2 gloo processes on CPU), then resumed as one process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain import checkpoint
from hpctrain.health import read_progress
from training_helpers import clean_environ, hpctrain, run_torchrun, torchrun

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
    args = ["--run-dir", "run", "--epochs", "2", "--device", "cpu"]
    proc = run_torchrun(["--standalone", "--nproc-per-node", "2"], [str(EXAMPLE)], args, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
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


# The example with rank 1 stuck in its 5th optimizer step (a stand-in for a hung data loader or device): the
# example itself is unchanged, only torch.optim.SGD.step is wrapped in rank 1.
HANGING = r"""
import os, runpy, sys, time
from pathlib import Path
import torch
if os.environ.get("RANK") == "1":
    step, calls = torch.optim.SGD.step, []
    def stuck(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            Path("stuck").touch()
            time.sleep(600)
        return step(self, *args, **kwargs)
    torch.optim.SGD.step = stuck
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_a_hung_rank_of_the_example_answers_debug_stacks_and_is_reported_as_the_recipes_are(tmp_path: Path) -> None:
    """A script built on the documented example gets what the built-in recipes get: live ranks answer `hpctrain
    debug stacks` (they used to be called "frozen, stopped or gone"), and a hang leaves every rank's stacks, the
    report naming the rank that never arrived, and stop_reason `hung` (on which a job requeues), exit 142."""
    import time

    (tmp_path / "hanging.py").write_text(HANGING)
    args = [str(EXAMPLE), "--run-dir", "run", "--epochs", "1", "--device", "cpu", "--hang-timeout", "20"]
    proc = torchrun(["--standalone", "--nproc-per-node", "2"], ["hanging.py"], args, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "stuck").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.2)
        stacks = hpctrain("debug", "stacks", "1", "--run-dir", "run", "--wait", "15", cwd=tmp_path, timeout=120)
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert stacks.returncode == 0 and "no answer" not in stacks.stdout, stacks.stdout + stacks.stderr
    assert (
        "time.sleep" in (tmp_path / "run" / "stacks" / "rank-1.txt").read_text()
        or "stuck" in (tmp_path / "run" / "stacks" / "rank-1.txt").read_text()
    )
    assert proc.returncode != 0
    report = (tmp_path / "run" / "hang" / "report.txt").read_text()
    assert "rank 1" in report and "outside any collective" in report, report + output
    assert (tmp_path / "run" / "stop_reason").read_text().strip() == "hung"
    assert {p.name for p in (tmp_path / "run" / "hang").glob("rank-*.txt")} == {"rank-0.txt", "rank-1.txt"}
