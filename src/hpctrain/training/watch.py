"""The loop's side of hpctrain.health: this rank's live progress record, its hang watchdog and stack requests, and
on rank 0 the straggler check (on the watchdog's ticker thread, off the training step).

Per step the loop hands over what it measured (the step's time, its wait for input, its forward pass); that costs
a few additions. Files are written every few seconds, by each rank into its own file: no collective, no lock.
"""

from __future__ import annotations

import logging
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from hpctrain.distributed.failures import current_collective
from hpctrain.errors import UserError
from hpctrain.fsutil import write_atomic
from hpctrain.health.hang import (
    REPORT_GRACE_S,
    await_summary,
    claim_report,
    forget_report_claim,
    hang_report,
    publish_summary,
    report_path,
)
from hpctrain.health.preflight import node_name
from hpctrain.health.progress import PROGRESS_INTERVAL_S, ProgressRecorder, read_progress
from hpctrain.health.stacks import HANG_DIR, StackRequests, capture_stacks, dump_stacks, main_thread_at
from hpctrain.health.stragglers import Straggler, find_stragglers
from hpctrain.health.watchdog import LONG_MARGIN_S, Watchdog
from hpctrain.readback import BadRunFile
from hpctrain.training.run import Run
from hpctrain.training.rundir import note_peer_lost
from hpctrain.training.stopping import EXIT_HUNG, StopReason, write_stop_reason, write_termination_message
from hpctrain import channel
from hpctrain.channel import note

log = logging.getLogger(__name__)

STRAGGLER_CHECK_S = 30.0
"""How often rank 0 compares the ranks' records; a straggler is reported when two checks in a row name it."""
HANG_FILES_DEADLINE_S = 30.0
"""Once a hang is noticed and said: how long writing its files may take (after REPORT_GRACE_S on several ranks)
before the process ends with EXIT_HUNG without them."""
ALARM_MARGIN_S = 10.0
SUMMARY_WAIT_S = HANG_FILES_DEADLINE_S - 5.0
"""How long a rank that did not write the report waits for the reporter's verdict (its own last words)."""


# NCCL's flight recorder (torch's ring buffer of the last collectives per rank): its variables were renamed from
# TORCH_NCCL_* to TORCH_FR_* in 2025; both are set, neither overrides a value the user set.
FLIGHT_RECORDER_ENV = (
    ("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000"),
    ("TORCH_FR_BUFFER_SIZE", "2000"),
    ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"),
)
FLIGHT_RECORDER_FILES = ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE")
FLIGHT_RECORDER_PREFIX = "nccl-trace-rank-"


def enable_flight_recorder(run: Run, environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """On a GPU run, before the process group starts: NCCL's flight recorder on, dumping into RUN/hang/ when torch's
    own collective timeout fires (a rank's file: nccl-trace-rank-N). The hang watchdog dumps it too (`_on_hang`)."""
    if run.device.type != "cuda":
        return
    for name, value in FLIGHT_RECORDER_ENV:
        environ.setdefault(name, value)
    prefix = str(run.run_dir / HANG_DIR / FLIGHT_RECORDER_PREFIX)
    for name in FLIGHT_RECORDER_FILES:
        environ.setdefault(name, prefix)
    (run.run_dir / HANG_DIR).mkdir(parents=True, exist_ok=True)


def dump_flight_recorder(path: Path) -> bool:
    """The NCCL flight recorder's buffer of this process (torch's pickled trace) to `path`; False where this torch
    has no recorder or no NCCL group ran."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_nccl_available()):
        return False
    dump = getattr(getattr(torch._C, "_distributed_c10d", None), "_dump_nccl_trace", None)
    if dump is None:
        return False
    try:
        data = dump()
    except Exception:  # an empty or disabled recorder raises; the stacks are written either way
        return False
    write_atomic(path, bytes(data))
    return True


class ForwardClock:
    """Seconds of the model's last forward pass, timed by hooks on the model inside DDP (so DDP's own buffer
    broadcast, which waits for the other ranks, is not counted). On a GPU, by CUDA events read back only when they
    have completed (no synchronization): the value may lag a step behind.

    Under DataParallel (--strategy dp) the hooks fire in each replica's thread at once (the replicas share the
    module's hooks): each thread times its own replica, under a lock, and a forward pass counts as its slowest
    replica's time (each replica's CUDA events are on its own GPU, so only times within one thread compare)."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.seconds = 0.0
        self._cuda = device.type == "cuda"
        self._lock = threading.Lock()
        self._started: dict[int, Any] = {}  # thread -> its replica's start (perf_counter, or a CUDA event)
        self._running = 0  # replicas inside forward now
        self._round: list[Any] = []  # this forward pass's finished replicas: seconds, or (start, end) CUDA events
        self._pending: list[Any] = []  # the last pass's CUDA event pairs, read once they have completed
        self._hooks = [model.register_forward_pre_hook(self._start), model.register_forward_hook(self._end)]

    def _now(self) -> Any:
        """A point in time on this replica's clock: a recorded CUDA event, or perf_counter seconds."""
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _capturing(self) -> bool:
        """A CUDA graph is being captured (hpctrain.training.graphed): its replays run no hooks, and an event
        recorded into it could not be timed, so the captured forward is not timed (one process: no peers to
        compare it with)."""
        return self._cuda and torch.cuda.is_current_stream_capturing()

    def _start(self, *_: Any) -> None:
        if self._capturing():
            return
        start = self._now()
        with self._lock:
            if self._running == 0:
                self._round = []
            if threading.get_ident() not in self._started:  # else its last forward raised: it was counted then
                self._running += 1
            self._started[threading.get_ident()] = start

    def _end(self, *_: Any) -> None:
        if self._capturing():
            return
        end = self._now()
        with self._lock:
            start = self._started.pop(threading.get_ident(), None)
            if start is None:
                return
            self._running -= 1
            self._round.append((start, end) if self._cuda else end - start)
            if self._running > 0:
                return
            if self._cuda:
                self._pending = self._round
            else:
                self.seconds = max(self._round)

    def read(self) -> float:
        with self._lock:
            if self._pending and all(end.query() for _, end in self._pending):
                self.seconds = max(start.elapsed_time(end) for start, end in self._pending) / 1000.0
                self._pending = []
            return self.seconds

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()


class RankWatch:
    """Started once the process group is up; `close()` in the loop's `finally`."""

    def __init__(self, run: Run, model: torch.nn.Module, steps_per_epoch: int) -> None:
        self.run = run
        self.host = node_name()
        env = run.env
        self.progress = ProgressRecorder(
            run.run_dir, env.rank, env.world_size, self.host, steps_per_epoch, PROGRESS_INTERVAL_S
        )
        self.progress.phase("starting")
        if run.is_main:  # every rank of this attempt is here: a hang claim or verdict left there is an earlier one's
            forget_report_claim(run.run_dir)
        self.clock = ForwardClock(model, run.device)
        self._step_started = time.perf_counter()
        self._data_before = 0.0
        self._next_check = time.monotonic() + STRAGGLER_CHECK_S
        self._suspects: set[int] = set()
        self._warned: set[str] = set()  # bad progress records already named
        self._reported_lock = threading.Lock()  # `reported` is filled on the ticker's thread, taken on the loop's
        self.reported: list[Straggler] = []  # rank 0: stragglers named so far this epoch (for its metrics record)
        ticks = (StackRequests(run.run_dir, env.rank, self.host).check,)
        if run.is_main and env.is_distributed:
            ticks += (self._straggler_tick,)
        self.watchdog = Watchdog(run.cfg.hang_timeout, run.cfg.dist_timeout + LONG_MARGIN_S, self._on_hang, ticks=ticks)
        self.watchdog.start()

    def epoch_started(self, data_wait_s: float) -> None:
        self._step_started = time.perf_counter()
        self._data_before = data_wait_s

    def step(self, epoch: int, step: int, step_in_epoch: int, images: int, data_wait_s: float) -> None:
        """After each step (`epoch`: epochs completed, as the loop's Position counts): `images` this rank trained
        on, `data_wait_s` its input wait so far this epoch."""
        now = time.perf_counter()
        self.watchdog.beat()
        self.progress.step(
            epoch + 1,
            step,
            step_in_epoch,
            images,
            now - self._step_started,
            data_wait_s - self._data_before,
            self.clock.read(),
        )
        self._step_started, self._data_before = now, data_wait_s

    @contextlib.contextmanager
    def long_phase(self, phase: str) -> Iterator[None]:
        """Evaluation or a checkpoint: recorded as such, with the long allowance."""
        self.progress.phase(phase)
        with self.watchdog.long_phase():
            yield
        self._step_started = time.perf_counter()

    def close(self, phase: str) -> None:
        self.watchdog.stop()
        self.clock.remove()
        self.progress.phase(phase)

    def _straggler_tick(self) -> None:
        """Rank 0, once a second on the watchdog's ticker thread: the straggler check when it is due. Off the training
        thread: the N records it reads (and a file system that is slow to give them) never hold a step, nor the
        ranks waiting for rank 0's next collective."""
        if time.monotonic() >= self._next_check:
            self._check_stragglers()

    def _check_stragglers(self) -> None:
        """Rank 0, every STRAGGLER_CHECK_S. The records are other processes' files: nothing in them may stop
        training, so a bad one is skipped with a warning (once per file) and any failure here is a warning."""
        self._next_check = time.monotonic() + STRAGGLER_CHECK_S
        try:
            found = {s.rank: s for s in find_stragglers(read_progress(self.run.run_dir, self._bad_record))}
        except Exception as err:  # advisory: the training step goes on
            log.warning(f"the straggler check failed ({type(err).__name__}: {err}); training goes on")
            return
        for rank in sorted(found.keys() & self._suspects):  # named twice in a row: persistent
            with self._reported_lock:
                new = all(s.rank != rank for s in self.reported)
                if new:
                    self.reported.append(found[rank])
            if new:
                log.warning(found[rank].describe())
        self._suspects = set(found)

    def _bad_record(self, err: BadRunFile) -> None:
        if err.path not in self._warned:
            self._warned.add(err.path)
            log.warning(f"skipped a progress record: {err}")

    def take_reported(self) -> list[dict[str, object]]:
        with self._reported_lock:
            taken, self.reported = self.reported, []
        return [s.as_dict() for s in taken]

    def _on_hang(self, quiet_s: float, limit_s: float) -> None:
        """In the watchdog's thread, while the main thread is stuck: say so first, then the files (stacks, record,
        report) on a thread of their own under a deadline, and end the process with EXIT_HUNG either way: a file
        system that blocks (a hung NFS server) must not keep a hung rank alive, nor silence its report."""
        run, env = self.run, self.run.env
        waiting, entered = current_collective()
        here = main_thread_at()
        stacks = capture_stacks()  # in memory: nothing before the deadline is armed waits on a file system
        deadline = HANG_FILES_DEADLINE_S + (REPORT_GRACE_S if env.is_distributed else 0.0)
        _arm_alarm(deadline + ALARM_MARGIN_S)
        path = run.run_dir / HANG_DIR / f"rank-{env.rank}.txt"
        note(
            log,
            f"rank {env.rank} on {self.host}: no training step for {quiet_s:.0f} s (limit {limit_s:.0f} s)"
            + (f", waiting in {waiting}" if waiting else ", outside any collective")
            + (f", at {here}" if here and not env.is_distributed else "")
            + f"; stacks in {path}",
        )
        work = threading.Thread(
            target=self._hang_files,
            name="hpctrain-hang-report",
            daemon=True,
            args=(quiet_s, limit_s, waiting, entered, here, stacks),
        )
        work.start()
        work.join(deadline)
        if work.is_alive():
            note(
                log,
                f"rank {env.rank}: the hang's files in {run.run_dir} were not written within "
                f"{deadline:.0f} s (its file system blocks?); ending without them",
            )
        channel.flush()
        os._exit(EXIT_HUNG)

    def _hang_files(
        self, quiet_s: float, limit_s: float, waiting: str | None, entered: int, here: str | None, stacks: str
    ) -> None:
        """The hang's file work, on a thread of its own: this rank's stacks and record; after `REPORT_GRACE_S`, the
        report from every rank's record (by the lowest rank that noticed)."""
        run, env = self.run, self.run.env
        path = run.run_dir / HANG_DIR / f"rank-{env.rank}.txt"
        try:
            dump_stacks(
                path,
                f"rank {env.rank} on {self.host} (pid {os.getpid()}): no training step for "
                f"{quiet_s:.0f} s" + (f", waiting in {waiting}" if waiting else ""),
                stacks,
            )
        except (OSError, UserError) as err:
            note(log, f"rank {env.rank}: could not write its stacks to {path}: {err}")
        self.progress.phase("hung", waiting_in=waiting, collectives=entered)
        recorder = run.run_dir / HANG_DIR / f"{FLIGHT_RECORDER_PREFIX}{env.rank}"
        if run.device.type == "cuda" and dump_flight_recorder(recorder):
            note(log, f"rank {env.rank}: NCCL's flight recorder in {recorder}")
        if env.is_distributed:
            time.sleep(REPORT_GRACE_S)  # the other ranks' watchdogs fire at about the same time
            if not claim_report(run.run_dir):  # another rank reads the records and writes the report
                summary = await_summary(run.run_dir, SUMMARY_WAIT_S)
                write_termination_message(
                    f"{summary or f'hung at step {self.progress.record.step}'}; the report: {report_path(run.run_dir)}"
                )
                return
        try:  # the other ranks' records are files anyone may have written: the rank exits EXIT_HUNG regardless
            records = read_progress(run.run_dir, self._bad_record)
            report = hang_report(records, env.world_size, quiet_s, limit_s, run.run_dir, time.time(), here)
            write_termination_message(f"{report.summary()}; the report: {report_path(run.run_dir)}")
        except Exception as err:
            note(log, f"rank {env.rank}: could not write the hang report ({type(err).__name__}: {err})")
            return
        for line in report.text().rstrip("\n").split("\n"):
            note(log, line)
        if report.silent:  # a node gone without closing its connections: torchrun's next group says when
            note_peer_lost(run, time.time() - quiet_s)
        try:
            write_atomic(report_path(run.run_dir), report.text().encode())
            if env.is_distributed:
                publish_summary(run.run_dir, report.summary())
            write_stop_reason(run.run_dir, StopReason.HUNG)
        except (OSError, UserError) as err:
            note(log, f"could not write the hang report: {err}")


def _arm_alarm(seconds: float) -> None:
    """The last resort: the kernel ends the process with SIGALRM (a shell's status 142, EXIT_HUNG) after `seconds`,
    should even the deadline's own thread not run again (a thread blocked in a file system while holding the
    interpreter's lock). Only where nobody else handles SIGALRM."""
    try:
        if signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None):
            signal.setitimer(signal.ITIMER_REAL, seconds)
    except (OSError, ValueError):
        pass
