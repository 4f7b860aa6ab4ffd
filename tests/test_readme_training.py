"""The README's Training commands run in order, as a new user types them, in one directory (issue 17, section 2).

Each command is taken from README.md itself, with small limits appended so the block runs in seconds: the fast and
classic lines once shared a default run directory, and the second line was refused."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.training.metrics import read_metrics
from training_helpers import clean_environ

README = Path(__file__).parent.parent / "README.md"
# The floor environment (the oldest supported torch) runs these commands too: they are the first a user types.
pytestmark = pytest.mark.floor

QUICK = ["--train-limit", "224", "--test-limit", "200", "--epochs", "1", "--threads", "1", "--log-interval", "0"]


def training_block() -> list[list[str]]:
    """The commands of the first ```bash block under `## Training`, comments removed."""
    section = README.read_text().split("\n## Training\n", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def runnable(command: list[str], mirror: str) -> list[str]:
    """The command as this test runs it: this interpreter, a local mirror for the download, limits for training."""
    if command[0] == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", *command[1:]]
    elif command[0] == "hpctrain":
        command = [sys.executable, "-m", "hpctrain", *command[1:]]
    if "download" in command:
        return [*command, "--mirror", mirror]
    return [*command, *QUICK]


def test_the_readmes_training_commands_run_in_order(tmp_path: Path, fashion_mnist_source: Path) -> None:
    commands = training_block()
    assert len(commands) == 5 and commands[0][:2] == ["hpctrain", "download"], commands
    for command in commands:
        result = subprocess.run(
            runnable(command, fashion_mnist_source.as_uri()),
            cwd=tmp_path,
            env=clean_environ(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, (
            f"{shlex.join(command)}\nexit {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
    runs = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert runs == ["ddp", "mnist-fashion-mnist", "mnist-fashion-mnist-classic", "torchrun"], runs
    for run in runs:
        assert [r["epoch"] for r in read_metrics(tmp_path / "runs" / run)] == [1], run
