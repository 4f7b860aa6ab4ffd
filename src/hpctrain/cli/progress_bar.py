"""`hpctrain train`'s progress on an interactive terminal: a rich bar per epoch on stderr, redrawn in place and
gone when the epoch ends (hpctrain.training.metrics.ProgressView). Elsewhere (a batch log) the loop's plain lines."""

from __future__ import annotations

import sys
from typing import Any


class ProgressBar:
    interactive = True

    def __init__(self) -> None:
        self._bar: Any = None
        self._task: Any = None

    def start_epoch(self, epoch: int, epochs: int, steps_per_epoch: int, first_step: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeRemainingColumn

        self._bar = Bar(
            TextColumn("epoch {task.fields[epoch]}/{task.fields[epochs]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeRemainingColumn(),
            transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(
            "", total=steps_per_epoch, completed=first_step, epoch=epoch, epochs=epochs, status=""
        )

    def show(self, epoch: int, epochs: int, step_in_epoch: int, steps_per_epoch: int, status: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=step_in_epoch, status=status)

    def end_epoch(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def progress_view() -> ProgressBar | None:
    """The bar where stderr is a terminal; None (the loop's plain lines) elsewhere."""
    return ProgressBar() if sys.stderr.isatty() else None
