"""How `hpctrain download` shows a download's events (hpctrain.data.download.Reporter): plain lines on stderr
(batch job logs) or a rich progress bar (a terminal).

`reporter_for(dataset, progress)` picks one: True for the bar, False for plain lines, None by whether stderr is
a terminal. Both say the same events: begin/advance/end of a file, notes and warnings.
"""

from __future__ import annotations

import sys

from hpctrain.data.download import LoggedReporter


class PlainReporter(LoggedReporter):
    """One line per event on stderr: readable in batch job logs, unlike a redrawn bar. The events are worded as
    the library's default reporter words them; only where they go differs."""

    def __enter__(self) -> PlainReporter:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def _print(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    def info(self, message: str) -> None:
        self._print(f"{self.dataset}: {message}")

    def warn(self, message: str) -> None:
        self._print(f"warning: {self.dataset}: {message}")


class RichReporter(PlainReporter):
    def __init__(self, dataset: str) -> None:
        super().__init__(dataset)
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.console = Console(stderr=True)
        self.progress = Progress(
            TextColumn("{task.description}", markup=False),  # a file name, shown as it is
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.task = None

    def __enter__(self) -> RichReporter:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def _print(self, message: str) -> None:
        from rich.text import Text

        # Text, not markup: URLs and error messages may contain [brackets].
        self.progress.console.print(Text(message, style="yellow" if message.startswith("warning") else ""))

    def begin(self, name: str, url: str, total: int | None) -> None:
        self.task = self.progress.add_task(f"{self.dataset}/{name}", total=total)

    def advance(self, n: int) -> None:
        self.progress.update(self.task, advance=n)

    def end(self, name: str, ok: bool, size: int) -> None:
        if self.task is not None and not ok:
            self.progress.remove_task(self.task)  # a failed attempt should not look finished
        elif self.task is not None:
            self.progress.update(self.task, total=size, completed=size)
        self.task = None


def reporter_for(dataset: str, progress: bool | None) -> PlainReporter:
    if progress is None:
        progress = sys.stderr.isatty()
    return RichReporter(dataset) if progress else PlainReporter(dataset)
