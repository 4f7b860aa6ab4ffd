"""The hang watchdog: a thread in every rank that takes no part in training and notices when no step completes.

The loop calls `beat()` after every step. When none comes within the limit, the watchdog calls `on_hang` once (in
its own thread: the main thread is the one that is stuck) and stops. The limit:

- `timeout_s` given (`--hang-timeout S`): that, between steps; 0 turns the watchdog off.
- automatic (the default): HANG_STEP_FACTOR times the slowest step seen so far (the first step, which includes
  warm-up, not counted), and never less than HANG_FLOOR_S;
- before the second step completes (the first includes warm-up), and inside `long_phase()` (evaluation, a
  checkpoint write), `long_s`: those are legitimately long and have no step to measure by. The loop passes its
  --dist-timeout plus LONG_MARGIN_S: there, a rank that never arrives is named by the collective's own timeout
  (hpctrain.distributed.failures) and the watchdog is the backstop for what no collective waits on.

A stopped process is not a hung one: a job suspended (SIGSTOP, as Slurm's `scontrol suspend` and
`PreemptMode=SUSPEND` stop every process of it) and continued finds its clock jumped, for every thread alike. The
watchdog sees it as its own sleep overshooting: the seconds it was not running, as the training thread was not, are
no one's fault and do not count as quiet (a hang of another rank still does: that rank's peers ran meanwhile).

The `ticks` it is given (answering `hpctrain debug stacks` requests) run once per poll on a thread of their own, so
a request file on a blocked file system silences the answers, never the watch.
"""

from __future__ import annotations

import logging
import contextlib
import threading
import time
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

HANG_FLOOR_S = 120.0
HANG_STEP_FACTOR = 20.0
LONG_MARGIN_S = 60.0
POLL_S = 1.0


class Watchdog:
    def __init__(
        self,
        timeout_s: float | None,
        long_s: float,
        on_hang: Callable[[float, float], None],
        ticks: tuple[Callable[[], None], ...] = (),
        poll_s: float = POLL_S,
    ) -> None:
        self.timeout_s = timeout_s
        self.long_s = long_s
        self.on_hang = on_hang  # (seconds since the last step, the limit it passed)
        self.ticks = ticks
        self.poll_s = poll_s
        self._mark = (time.monotonic(), 0.0)  # the last step's time, and `_stopped` then (one assignment: no race)
        self._stopped = 0.0  # seconds this thread overslept so far: the process was stopped (or starved)
        self._beats = 0
        self._slowest = 0.0
        self._long = 0  # nesting depth of long_phase()
        self._warned: set[object] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hpctrain-watchdog", daemon=True)
        self._ticker = threading.Thread(target=self._tick, name="hpctrain-stack-requests", daemon=True)

    @property
    def enabled(self) -> bool:
        return self.timeout_s != 0

    def start(self) -> Watchdog:
        self._thread.start()
        if self.ticks:
            self._ticker.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5 * self.poll_s)

    def beat(self) -> None:
        now = time.monotonic()
        if self._beats >= 1:  # the first step's time includes warm-up; later ones set the pace
            self._slowest = max(self._slowest, self.quiet(now))
        self._beats += 1
        self._mark = (now, self._stopped)

    @contextlib.contextmanager
    def long_phase(self) -> Iterator[None]:
        self._long += 1
        try:
            yield
        finally:
            self._long -= 1
            self._mark = (time.monotonic(), self._stopped)  # the phase's time is not the next step's

    def _warn_once(self, key: object, line: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(line)

    def limit(self) -> float:
        """The seconds without a step that count as a hang now."""
        if self._long or self._beats == 0:
            return self.long_s
        if self._beats < 2:
            return self.long_s
        if self.timeout_s is not None:
            return self.timeout_s
        return max(HANG_FLOOR_S, HANG_STEP_FACTOR * self._slowest)

    def quiet(self, now: float) -> float:
        """Seconds since the last step (or phase) that this process was running."""
        last, stopped_then = self._mark
        return now - last - (self._stopped - stopped_then)

    def _watch(self) -> None:
        before = time.monotonic()
        while not self._stop.wait(self.poll_s):
            now = time.monotonic()
            self._stopped += max(0.0, now - before - self.poll_s)  # asleep longer than asked: we were not running
            before = now
            if not self.enabled:
                continue
            quiet, limit = self.quiet(now), self.limit()
            if quiet > limit:
                self.on_hang(quiet, limit)
                return

    def _tick(self) -> None:
        while not self._stop.wait(self.poll_s):
            for tick in self.ticks:
                try:
                    tick()
                except Exception as err:  # nothing a tick meets (files others wrote) stops the watch
                    what = getattr(tick, "__qualname__", "task")
                    self._warn_once(
                        (tick, type(err)),
                        f"the watchdog's {what} failed ({type(err).__name__}: {err}); the watch goes on",
                    )
