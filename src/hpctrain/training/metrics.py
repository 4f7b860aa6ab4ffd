"""Where a run's numbers go: metrics.jsonl (one object per epoch), TensorBoard scalars under tb/ (and the start-up
line that says how to watch them), and live progress.

Only rank 0 constructs these. Progress decides when a step is shown; a ProgressView shows it: plain lines every few
seconds through the logging channel (hpctrain.channel) by default, so `slurm-*.out` holds readable lines rather
than carriage-return spam, or what a face gives (`hpctrain train` on an interactive terminal: a rich bar,
hpctrain.cli.progress_bar).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Protocol

from hpctrain.channel import note
from hpctrain.errors import brief
from hpctrain.fsutil import append_line, refuse_symlinks, write_atomic
from hpctrain.readback import BadRunFile, parse_json_lines, read_bytes, split_lines

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
MAX_METRICS_BYTES = 64 << 20
"""Read back at most this much of metrics.jsonl (a record is under 1 kB: tens of thousands of epochs)."""
# The record's numbers (`finish_epoch`): a number or null each (NaN too: a diverged epoch's loss).
_NUMBERS = (
    "train_loss",
    "test_loss",
    "test_accuracy",
    "test_top5",
    "images_per_s",
    "epoch_seconds",
    "data_wait_seconds",
    "lr",
)
TENSORBOARD_DIR = "tb"


def train_hint(run_dir: str | Path, environ: Mapping[str, str] = os.environ) -> str:
    """The line `hpctrain train` prints at start: how to watch this run. In the pod of a job `hpctrain submit` made
    on Kubernetes (every pod has KUBERNETES_SERVICE_HOST; such a job's pods HPCTRAIN_RUN_DIR, which a dev pod has
    not) the run directory is a path in the pod, which the submitting machine does not have: TensorBoard then runs
    in a pod of its own, on the volume that holds the run."""
    if environ.get("KUBERNETES_SERVICE_HOST") and environ.get("HPCTRAIN_RUN_DIR"):
        return (
            "TensorBoard: where you submitted, hpctrain tensorboard --scheduler kubernetes --on-cluster --volume "
            f"VOLUME {shlex.quote(str(run_dir))} (a path in this job's pods; VOLUME: the --volume that holds it)"
        )
    return f"TensorBoard: hpctrain tensorboard {shlex.quote(str(run_dir))}"


class MetricsLog:
    """Appends epoch records to metrics.jsonl and mirrors them as TensorBoard scalars."""

    def __init__(self, run_dir: Path, resumed_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.path = run_dir / METRICS_FILE
        if resumed_step is not None:
            _drop_records_after(self.path, resumed_step)
        # purge_step hides scalars a killed attempt logged after the checkpoint we resume from. Those logged *at* its
        # step came before it was written (that step's running loss; the epoch's scalars for an epoch-end one) and
        # stay: TensorBoard's reader drops every event whose step is at least purge_step.
        purge_step = resumed_step + 1 if resumed_step is not None else None
        refuse_symlinks(run_dir, (TENSORBOARD_DIR,))  # event files are never written through a linked folder
        self.tensorboard = SummaryWriter(str(run_dir / TENSORBOARD_DIR), purge_step=purge_step)

    def epoch(self, record: dict[str, Any]) -> None:
        append_line(self.path, json.dumps(record))  # never through a symbolic link
        step = record["step"]
        for key, tag in (
            ("train_loss", "train/loss"),
            ("test_loss", "test/loss"),
            ("test_accuracy", "test/accuracy"),
            ("images_per_s", "perf/images_per_s"),
            ("epoch_seconds", "perf/epoch_seconds"),
            ("lr", "train/lr"),
        ):
            if record.get(key) is not None:
                self.tensorboard.add_scalar(tag, record[key], step)
        self.tensorboard.flush()

    def train_loss(self, step: int, loss: float) -> None:
        self.tensorboard.add_scalar("train/loss_running", loss, step)

    def close(self) -> None:
        self.tensorboard.close()


def read_metrics(run_dir: str | Path, on_bad: Callable[[BadRunFile], None] | None = None) -> list[dict[str, Any]]:
    """The epoch records of RUN/metrics.jsonl, oldest first; none when there is no file. A line that is not a
    record (not UTF-8, not JSON, not an epoch's) is skipped (and given to `on_bad`); a file that cannot be read
    (special, a link, too large) raises BadRunFile."""
    path = Path(run_dir) / METRICS_FILE
    try:
        data = _read(path)
    except FileNotFoundError:
        return []
    records = []
    for _, value in _records(data, path):
        if isinstance(value, BadRunFile):
            if on_bad is not None:
                on_bad(value)
        else:
            records.append(value)
    return records


def _read(path: Path) -> bytes:
    return read_bytes(path, MAX_METRICS_BYTES, within=path.parent)


def _records(data: bytes, path: Path) -> list[tuple[int, dict[str, Any] | BadRunFile]]:
    """metrics.jsonl's lines, each decoded, parsed and checked on its own (BadRunFile for one that is not a record)."""
    return [
        (number, value if isinstance(value, BadRunFile) else _checked(value, f"{path}, line {number}"))
        for number, value in parse_json_lines(data, path, allow_nan=True)
    ]


def _checked(value: Any, source: str) -> dict[str, Any] | BadRunFile:
    """`value` if it is an epoch record (an object with a whole `step`, and numbers or null where the loop writes
    them), else the BadRunFile saying why."""
    if not isinstance(value, dict):
        return BadRunFile(source, "not a JSON object")
    for key in ("step", "epoch", "world_size"):
        number = value.get(key)
        if (key == "step" or number is not None) and (type(number) is not int or number < 0):
            return BadRunFile(source, f"{key!r} is {brief(number, 40)}, not a whole number of at least 0")
    for key in _NUMBERS:
        number = value.get(key)
        if number is not None and (isinstance(number, bool) or not isinstance(number, (int, float))):
            return BadRunFile(source, f"{key!r} is {brief(number, 40)}, not a number")
    return value


def _drop_records_after(path: Path, step: int) -> None:
    """A resumed run's metrics.jsonl without the records a killed attempt wrote after the checkpoint at `step`. A
    line cut short by the kill is dropped; other lines that are not records (not UTF-8 among them) are kept as they
    are, byte for byte."""
    try:
        data = _read(path)
    except FileNotFoundError:
        return
    lines = split_lines(data)
    kept = [
        lines[number - 1]
        for number, value in _records(data, path)
        if isinstance(value, BadRunFile) or value["step"] <= step
    ]
    write_atomic(path, b"".join(line + b"\n" for line in kept))


class ProgressView(Protocol):
    """How the steps Progress shows are shown. `interactive`: redrawn in place (shown every 0.25 s, not every
    interval_s or --print-freq steps)."""

    interactive: bool

    def start_epoch(self, epoch: int, epochs: int, steps_per_epoch: int, first_step: int) -> None: ...

    def show(self, epoch: int, epochs: int, step_in_epoch: int, steps_per_epoch: int, status: str) -> None: ...

    def end_epoch(self) -> None: ...


class ProgressLines:
    """The default view: a line per shown step through the logging channel, as it is (a NOTE: stderr on a
    terminal)."""

    interactive = False

    def start_epoch(self, epoch: int, epochs: int, steps_per_epoch: int, first_step: int) -> None:
        pass

    def show(self, epoch: int, epochs: int, step_in_epoch: int, steps_per_epoch: int, status: str) -> None:
        note(log, f"epoch {epoch}/{epochs} step {step_in_epoch}/{steps_per_epoch} {status}", bare=True)

    def end_epoch(self) -> None:
        pass


class Progress:
    """Per-step progress. `step()` is called every step and is cheap; its numbers (running loss, images/s) are asked
    for only when something is shown, so the GPU is not synchronized every step."""

    def __init__(
        self,
        epochs: int,
        steps_per_epoch: int,
        interval_s: float,
        view: ProgressView | None = None,
        on_report: Callable[[int, float], None] | None = None,
        every_steps: int | None = None,
    ) -> None:
        self.epochs = epochs
        self.every_steps = every_steps  # report every N steps instead of every interval_s (--print-freq)
        self.steps_per_epoch = steps_per_epoch
        self.view: ProgressView = ProgressLines() if view is None else view
        self.interactive = self.view.interactive
        self.interval_s = 0.25 if self.interactive else interval_s
        self.on_report = on_report
        self._last = 0.0
        self._epoch = 0

    def start_epoch(self, epoch: int, first_step: int) -> None:
        self._epoch = epoch
        self._last = time.monotonic()
        self.view.start_epoch(epoch, self.epochs, self.steps_per_epoch, first_step)

    def step(self, step_in_epoch: int, global_step: int, numbers: Callable[[], tuple[float, float]]) -> None:
        """`numbers()` gives the running loss and images/s (the caller's measure, the same as its epoch summary's)."""
        now = time.monotonic()
        due = (
            step_in_epoch % self.every_steps == 0
            if self.every_steps and not self.interactive
            else now - self._last >= self.interval_s
        )
        if not due and step_in_epoch != self.steps_per_epoch:
            return
        self._last = now
        loss, rate = numbers()
        status = f"loss {loss:.4f}  {rate:,.0f} img/s"
        if self.on_report is not None:
            self.on_report(global_step, loss)
        self.view.show(self._epoch, self.epochs, step_in_epoch, self.steps_per_epoch, status)

    def end_epoch(self) -> None:
        self.view.end_epoch()
