"""What hpctrain says below cli/ goes through one channel, Python's logging (hpctrain.channel), and only a face
decides where it goes (issue 40 item 3).

A library user (`import hpctrain`, no logging configured) gets nothing on stdout or stderr from functions that
warn or report, the same functions that printed before (a skipped broken checkpoint, a compatibility note, a
training step's progress line); with logging configured the same calls arrive as records. Each runs in a fresh
interpreter: a face's handler installed by another test in this process must not hide a print. The terminal
handler of the CLI (hpctrain.cli.terminal) prints the forms users have always seen, on the streams they were on;
the training tests (test_train.py, test_stop_messages.py, ...) pin those lines byte for byte end to end."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import hpctrain

SRC = str(Path(hpctrain.__file__).parent.parent)

# Calls that said something before the channel: each printed to stderr (the checkpoint's warning through Python's
# last-resort handler, which a NullHandler on "hpctrain" now keeps silent).
CALLS = """
import torch
from hpctrain import checkpoint, compat
from hpctrain.training.metrics import Progress

folder = sys.argv[1]
checkpoint.save({"model": {"w": torch.zeros(4)}}, folder, "checkpoint_step_1.pt", epoch=0, step=1)
newest = checkpoint.save({"model": {"w": torch.ones(4)}}, folder, "checkpoint_step_2.pt", epoch=0, step=2)
with open(newest, "r+b") as f:
    f.truncate(newest.stat().st_size // 2)
assert checkpoint.find_latest(folder).step == 1  # the broken newest is skipped, with a warning
compat.say_once("library-test", "a compatibility note")
progress = Progress(1, 2, 0.0)
progress.start_epoch(1, 0)
progress.step(2, 2, lambda: (0.5, 10.0))  # the epoch's last step is always shown
progress.end_epoch()
"""


def run_library(tmp_path: Path, setup: str = "") -> subprocess.CompletedProcess[str]:
    script = "import sys\n" + setup + CALLS
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("RANK", None)
    return subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, env=env, timeout=300
    )


def test_a_library_user_without_logging_gets_nothing_printed(tmp_path: Path) -> None:
    done = run_library(tmp_path)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", ""), "hpctrain printed to a library user:\n" + done.stdout + done.stderr


def test_a_library_user_who_configures_logging_gets_the_records(tmp_path: Path) -> None:
    setup = "import logging\nlogging.basicConfig(level=logging.INFO, format='%(name)s %(levelname)s %(message)s')\n"
    done = run_library(tmp_path, setup)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert any(line.startswith("hpctrain.checkpoint WARNING ") and "checkpoint_step_2.pt" in line for line in lines)
    assert "hpctrain.compat NOTE note: a compatibility note" in lines, lines
    assert any(line.startswith("hpctrain.training.metrics NOTE epoch 1/1 step 2/2 loss 0.5000") for line in lines)
    assert done.stdout == ""


def test_the_terminal_shows_the_lines_hpctrain_has_always_printed(capsys) -> None:
    from hpctrain.channel import BARE, NOTE
    from hpctrain.cli.terminal import install

    install("train")
    log = logging.getLogger("hpctrain.training.example")
    log.info("training mnist/default")
    log.log(NOTE, "the time limit ends in 60 s")
    log.warning("the straggler check failed")
    log.error("the run dir is locked")
    log.log(NOTE, "epoch 1/2 step 3/10 loss 0.1000  5 img/s", extra=BARE)
    log.warning("a name from outside: \x1b]52;c;bad\x07")
    logging.getLogger("elsewhere").warning("another library's warning")  # not hpctrain's: not shown by its handler
    out, err = capsys.readouterr()
    assert out == "hpctrain: training mnist/default\n"
    assert err == textwrap.dedent(
        """\
        hpctrain: the time limit ends in 60 s
        hpctrain: warning: the straggler check failed
        hpctrain train: error: the run dir is locked
        epoch 1/2 step 3/10 loss 0.1000  5 img/s
        hpctrain: warning: a name from outside: \\x1b]52;c;bad\\x07
        """
    )
