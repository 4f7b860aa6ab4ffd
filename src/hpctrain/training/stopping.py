"""Stop requests from signals: the handler only sets a flag; the loop acts on it at its next stop vote.

Saving inside a signal handler is how checkpoints get corrupted (the handler can run in the middle of an optimizer
step or of another save). Here a handler records *why* the run should stop, and the loop, between two steps, asks
every rank (one collective, every few steps: `StepVote`) whether any of them was told to stop, so all ranks
checkpoint the same step and exit.

    SIGUSR1  Slurm's warning before the time limit (``#SBATCH --signal=B:USR1@120``) or a preemption rehearsal:
             checkpoint, stop, and let the batch script requeue the job.
    SIGTERM  ``scancel``, a node shutdown, torchrun stopping its workers: checkpoint and stop, no requeue.
    SIGINT   Ctrl-C: like SIGTERM; a second Ctrl-C interrupts at once.

On Kubernetes the job's own timer plays Slurm's part: a pod rendered with --time carries HPCTRAIN_TIME_LIMIT_S (the
training time of one attempt) and HPCTRAIN_TIME_WARNING_S (--signal-grace), and `install` arms a timer that asks the
run to stop, as SIGUSR1 would, that many seconds before the limit, counted from this process's start. Values that
cannot arm that timer (not a number, beyond threading's longest wait, a warning as long as the limit) are refused
in one line before the run starts (`time_limit`), never ignored.

Once the run has ended (`StopRequest.finish`), these signals are ignored until the process exits: the outcome is
written, and a time-limit warning or scancel arriving in the last moments must not turn a completed run into one
killed by a signal (exit 138/143, a failed job).

A run whose loss becomes non-finite stops too (`StopReason.DIVERGED`), through the same vote, without a checkpoint.

Users' own training scripts can use `StopRequest` the same way (see examples/). Under `hpctrain submit` (which
exports HPCTRAIN_RUN_DIR) two words in that directory tell the batch script what the program can do and did:
`install()` leaves SIGNALS_FILE ("this program handles SIGUSR1: pass the time-limit warning on"; a program that
never says so is not sent it, since Python's default action for SIGUSR1 ends the process), and `announce_stop()`
leaves STOP_REASON_FILE once the stop's state is saved ("preempted": requeue me). The job is requeued after a
warning only on that word.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

from hpctrain.errors import UserError, brief
from hpctrain.fsutil import write_atomic
from hpctrain.training.provenance import record_attempt_end

# The exit statuses, stop reasons and the words and variables a run shares with the script that started it live in
# hpctrain.stops, which the schedulers import too; these names stay importable from here.
from hpctrain.stops import (  # `X as X`: re-exported
    EXIT_CANCELLED as EXIT_CANCELLED,
    EXIT_COMPLETED as EXIT_COMPLETED,
    EXIT_DIVERGED as EXIT_DIVERGED,
    EXIT_HUNG as EXIT_HUNG,
    EXIT_PREEMPTED as EXIT_PREEMPTED,
    EXIT_SICK_NODE as EXIT_SICK_NODE,
    RUN_DIR_ENV as RUN_DIR_ENV,
    SIGNALS_FILE as SIGNALS_FILE,
    STOP_REASON_FILE as STOP_REASON_FILE,
    TIME_LIMIT_ENV as TIME_LIMIT_ENV,
    TIME_WARNING_ENV as TIME_WARNING_ENV,
    StopReason as StopReason,
)
from hpctrain.channel import note

log = logging.getLogger(__name__)


_SIGNAL_REASONS = {
    signal.SIGUSR1: StopReason.PREEMPTED,
    signal.SIGTERM: StopReason.CANCELLED,
    signal.SIGINT: StopReason.CANCELLED,
}


class StopRequest:
    """Installs handlers that only record the strongest stop reason seen; `reason` reads it."""

    def __init__(self) -> None:
        self._reason = StopReason.NONE
        self._signal: int | None = None
        self._previous: dict[int, object] = {}
        self._finished = False
        self._timer: threading.Timer | None = None

    @property
    def reason(self) -> StopReason:
        return self._reason

    @property
    def signal_name(self) -> str | None:
        return signal.Signals(self._signal).name if self._signal is not None else None

    def request(self, reason: StopReason, signum: int | None = None) -> None:
        if reason > self._reason:
            self._reason, self._signal = reason, signum

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._finished:
            return
        if signum == signal.SIGINT and self._reason >= StopReason.CANCELLED:
            raise KeyboardInterrupt  # the second Ctrl-C: the user does not want to wait for the checkpoint
        self.request(_SIGNAL_REASONS[signum], signum)

    def install(self, environ: Mapping[str, str] | None = None) -> StopRequest:
        """Install the handlers (main thread only; elsewhere this is a no-op and signals keep their defaults), and
        the time-limit timer where the environment asks for one (see the module docstring).

        Inside a job's run directory ($HPCTRAIN_RUN_DIR), also say that this program now handles SIGUSR1, so that
        the batch script passes the time-limit warning on to it (see the module's docstring)."""
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNAL_REASONS:
                self._previous[signum] = signal.signal(signum, self._handle)
            _announce_signals()
        self.arm_time_limit(os.environ if environ is None else environ)
        return self

    def arm_time_limit(self, environ: Mapping[str, str], started: float | None = None) -> float | None:
        """Ask for a stop (PREEMPTED: checkpoint, exit 75) HPCTRAIN_TIME_WARNING_S seconds before the end of
        HPCTRAIN_TIME_LIMIT_S seconds after `started` (default: this process's start). Returns the delay, or None
        when no timer is asked for (no limit, or a warning of 0 s, which on Slurm too means no warning); a
        UserError for values that cannot arm one (`time_limit`)."""
        asked = time_limit(environ)
        if asked is None or self._timer is not None:
            return None
        limit, warning = asked
        begun = process_start_time() if started is None else started
        delay = max(0.0, begun + limit - warning - time.time())

        def time_up() -> None:
            if not self._finished:
                note(
                    log,
                    f"the time limit ({limit:g} s of training, {TIME_LIMIT_ENV}) ends in {warning:g} s: "
                    "checkpointing and stopping",
                )
                self.request(StopReason.PREEMPTED)

        self._timer = threading.Timer(delay, time_up)
        self._timer.daemon = True
        self._timer.start()
        return delay

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def uninstall(self) -> None:
        self._disarm()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def finish(self) -> None:
        """The run's outcome is settled: ignore these signals from now until the process exits.

        Not `uninstall`: the previous (default) actions would let a late SIGUSR1/SIGTERM kill a finished process.
        SIG_IGN rather than a Python handler, because Python resets its handlers to the default action while the
        interpreter shuts down, and the kernel-level ignore also covers those last moments."""
        self._finished = True
        self._disarm()
        if self._previous and threading.current_thread() is threading.main_thread():
            for signum in self._previous:
                signal.signal(signum, signal.SIG_IGN)
            self._previous.clear()

    def __enter__(self) -> StopRequest:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


_SECONDS = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?")


def time_limit(environ: Mapping[str, str]) -> tuple[float, float] | None:
    """(limit, warning) in seconds from HPCTRAIN_TIME_LIMIT_S and HPCTRAIN_TIME_WARNING_S, checked for the timer
    they arm: None when no timer is asked for (no limit set, or a warning of 0 s); a UserError naming the variable
    for a value that is not a number of seconds, a limit of 0 or one beyond the longest wait Python's timer takes
    (threading.TIMEOUT_MAX), or a warning not shorter than the limit (the run would checkpoint and stop at once,
    at every start). Read before anything starts (`hpctrain train` checks it with its options)."""
    text = environ.get(TIME_LIMIT_ENV, "").strip()
    if not text:
        return None
    limit = _seconds(TIME_LIMIT_ENV, text)
    if limit == 0:
        raise UserError(f"{TIME_LIMIT_ENV}=0: a time limit of no time; set a number of seconds above 0, or unset it")
    warning = _seconds(TIME_WARNING_ENV, environ.get(TIME_WARNING_ENV, "0").strip() or "0")
    if warning == 0:
        return None
    if warning >= limit:
        raise UserError(
            f"{TIME_WARNING_ENV}={warning:g} is not shorter than {TIME_LIMIT_ENV}={limit:g}: the run would "
            "checkpoint and stop as soon as it starts, at every start; give a warning shorter than the limit "
            "(--signal-grace below --time)"
        )
    return limit, warning


def _seconds(name: str, text: str) -> float:
    """A number of seconds a timer can wait, from the environment variable `name` (`text` its value)."""
    if not _SECONDS.fullmatch(text):
        raise UserError(f"{name}={brief(text, 40)} is not a number of seconds; set it as e.g. {name}=3600, or unset it")
    value = float(text)
    if not value <= threading.TIMEOUT_MAX:  # inf ("1e999") too
        raise UserError(
            f"{name}={brief(text, 40)} is more seconds than a timer can wait ({threading.TIMEOUT_MAX:.0f}); "
            "give the time one attempt may run"
        )
    return value


def process_start_time() -> float:
    """When this process started (seconds since the epoch), from /proc on Linux; now elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])  # field 22, starttime, after the command name
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def agree(local: StopReason, group: object = None) -> StopReason:
    """Every rank learns the strongest stop reason any rank has seen: one small all-reduce when a process group is
    initialized, nothing otherwise. Call it at the same point (a step boundary) on every rank.

    Right on any backend by construction: without `group`, the vote goes over `vote_group()` (the default group if
    it can all-reduce CPU tensors, else a gloo side group made once, here, on the first vote); with a `group`, the
    vote's tensor is put on a device that group's backend accepts (`collective_device`), e.g. the current GPU for an
    NCCL group (which then costs a GPU synchronisation per call)."""
    import torch
    import torch.distributed as dist

    from hpctrain.distributed import all_reduce
    from hpctrain.distributed.collectives import collective_device

    if not (dist.is_available() and dist.is_initialized()):
        return local
    if group is None:
        group = vote_group()
    vote = torch.tensor([int(local)], dtype=torch.int64, device=collective_device(group))
    all_reduce(vote, op="max", group=group)
    return StopReason(int(vote.item()))


class StepVote:
    """The training loop's stop vote: often enough that a stop comes within about PERIOD_S seconds, rarely enough
    that it costs a step next to nothing.

    A vote is a round trip between the ranks: on an H200 `agree` after every step took the fast MNIST recipe's 2.6 ms
    step to 3.1 ms (benchmarks/stop_vote.py). So the ranks vote every `every` steps, and each vote also settles the
    next `every`: every rank proposes as many steps as fit in PERIOD_S at its own pace (at least 1), and all take the
    smallest proposal. Ranks that all received the same result vote at the same steps, without a word more. A stop
    therefore comes after the step in flight and at most PERIOD_S seconds of steps more (one step when steps are
    longer); nothing is lost, since the stop writes its checkpoint. The epoch's last step always votes
    (`settle=True`): a stop seen there never waits out the evaluation.

    A vote's own cost grows with the world: gloo all-reduces over a ring, 2 (N - 1) hops one after another (about
    a second at 8,000 ranks if a hop between hosts takes 60 µs; two local processes take 0.6 ms). So each rank also
    proposes no fewer steps than keep the votes under MAX_SHARE of the time, from how long its last vote took: the
    last rank to arrive (its vote is the pure round trip, it waited for no one) proposes the fewest, and all take
    that. A stop then comes within PERIOD_S or 1 / MAX_SHARE votes' time, whichever is longer (50 s of steps when a
    vote takes 1 s), and the votes never cost the job more than MAX_SHARE, whatever its size.

    One instance per epoch loop, called at every step boundary on every rank. Without a process group, the local
    reason is the answer, at once."""

    PERIOD_S = 0.05
    MAX_SHARE = 0.02

    def __init__(self, group: object = None) -> None:
        self.group = group
        self.every = 1  # steps from one vote to the next, as the last vote settled it
        self._since = 0  # steps since the last vote
        self._voted_at: float | None = None  # when the last vote ended (time.perf_counter)
        self._vote_s = 0.0  # how long the last vote took here

    def after_step(self, local: StopReason, settle: bool = False) -> StopReason:
        import time

        import torch
        import torch.distributed as dist

        from hpctrain.distributed import all_reduce
        from hpctrain.distributed.collectives import collective_device

        if not (dist.is_available() and dist.is_initialized()):
            return local
        self._since += 1
        if self._since < self.every and not settle:
            return StopReason.NONE
        started = time.perf_counter()
        proposal = 1
        if self._voted_at is not None:
            step_s = (started - self._voted_at) / self._since
            spacing_s = max(self.PERIOD_S, self._vote_s / self.MAX_SHARE)
            proposal = max(1, min(10_000, int(spacing_s / max(step_s, 1e-6))))
        group = vote_group() if self.group is None else self.group
        vote = torch.tensor([int(local), -proposal], dtype=torch.int64, device=collective_device(group))
        all_reduce(vote, op="max", group=group)  # the strongest reason; the smallest proposal (negated)
        reason, every = vote.tolist()
        first, self._voted_at = self._voted_at is None, time.perf_counter()
        if not first:  # the first vote also connected the ranks (a lazy gloo group): not what a vote costs
            self._vote_s = self._voted_at - started
        self.every, self._since = -every, 0
        return StopReason(reason)


# The side group `vote_group` made, with the default group it was made for (a new default group, after
# destroy_process_group + init_process_group, needs a new one).
_side_group: tuple[object, object] | None = None


def vote_group() -> object:
    """The group the stop vote runs on: the default group when its backend all-reduces CPU tensors (gloo, or
    torch's "cpu:gloo,cuda:nccl"), else a gloo group over the same ranks, made on the first call and kept.

    Why not vote on the GPU over NCCL: reading the vote back (`.item()`) waits for everything queued on the GPU,
    so the CPU could no longer run ahead of the GPU by a step; a gloo vote costs a TCP round trip between hosts
    instead, while the GPU keeps working. `new_group` is a collective: the first call must happen at the same point
    on every rank (the first `agree`, or the training loop's setup, is such a point).

    The side group connects lazily (`_lazy_gloo_group`): a rank opens sockets only to the peers it exchanges with,
    the two neighbours of gloo's ring all-reduce, so each rank holds O(1) sockets and makes O(1) store requests
    for it, whatever the world size. Made eagerly, as gloo does by default, every rank would connect to every other
    (N - 1 sockets and about 2 N store requests a rank, N² in all: 7,999 sockets a rank at 8,000 ranks)."""
    import torch.distributed as dist

    from hpctrain.distributed.collectives import collective_device_type

    global _side_group
    world = dist.group.WORLD
    if collective_device_type(world) == "cpu":
        return world
    if _side_group is None or _side_group[0] is not world:
        _side_group = (world, _lazy_gloo_group())
    return _side_group[1]


# Lazy gloo groups, from torch 2.8: torch reads this variable when it makes a gloo group (ProcessGroupGloo's
# constructor), so it is set only around that call.
GLOO_LAZY_INIT_ENV = "TORCH_GLOO_LAZY_INIT"
LARGE_WORLD = 64  # ranks from which an eager (full-mesh) vote group is worth a note


def _lazy_gloo_group() -> object:
    """A gloo group over every rank that connects each pair of ranks at their first exchange (torch >= 2.8), unless
    the user set TORCH_GLOO_LAZY_INIT themselves (their word stands). On an older torch the group connects eagerly,
    and a large world is told once what that costs."""
    import torch
    import torch.distributed as dist

    from hpctrain import compat

    users_word = GLOO_LAZY_INIT_ENV in os.environ
    if users_word or not compat.gloo_connects_lazily():
        if not users_word and dist.get_world_size() >= LARGE_WORLD:
            compat.say_once(
                "gloo_lazy",
                f"torch {torch.__version__} connects the stop vote's gloo group at start-up, "
                "every rank to every other (torch >= 2.8 connects only the peers a vote uses)",
            )
        return dist.new_group(backend="gloo")
    os.environ[GLOO_LAZY_INIT_ENV] = "1"
    try:
        return dist.new_group(backend="gloo")
    finally:
        os.environ.pop(GLOO_LAZY_INIT_ENV, None)


# Kubernetes keeps what a container writes to its terminationMessagePath (by default this file, which the kubelet
# mounts into every container) in the pod's status, where `hpctrain status` and `kubectl describe pod` show it.
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LOG_ENV = "HPCTRAIN_TERMINATION_LOG"  # another terminationMessagePath, for a pod template that sets one
TERMINATION_MESSAGE_MAX = 4096  # bytes the kubelet keeps


def write_termination_message(text: str) -> None:
    """Leave `text` ("sick_node: node07", "hung: ...") where Kubernetes reads a container's last words, so that the
    scheduler side can say why this pod ended without reading the run directory. Only in a container that has the
    file (or where $HPCTRAIN_TERMINATION_LOG names one): elsewhere nothing is written. Best effort."""
    path = os.environ.get(TERMINATION_LOG_ENV) or (TERMINATION_LOG if os.environ.get("KUBERNETES_SERVICE_HOST") else "")
    if not path or (path == TERMINATION_LOG and not os.path.isfile(path)):
        return
    try:
        with open(path, "wb") as f:
            f.write(text.encode()[:TERMINATION_MESSAGE_MAX])
    except OSError:
        pass


def _job_run_dir() -> Path | None:
    value = os.environ.get(RUN_DIR_ENV)
    return Path(value) if value else None


def _announce_signals() -> None:
    """Leave SIGNALS_FILE in the job's run directory (once: every rank checks, the first writes). Best effort: a
    run directory that cannot be written only means the warning is not passed on."""
    run_dir = _job_run_dir()
    if run_dir is None or os.path.lexists(run_dir / SIGNALS_FILE):
        return
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / SIGNALS_FILE, b"USR1 TERM INT\n")
    except OSError:
        pass


def announce_stop(reason: StopReason, run_dir: Path | str | None = None) -> None:
    """Say how the run ended, where the batch script of `hpctrain submit` reads it: `run_dir`, else the job's run
    directory ($HPCTRAIN_RUN_DIR); nothing outside a job when `run_dir` is not given. Call it on one rank, after the
    stop's checkpoint is saved: `preempted` (a time-limit warning, `reason.exit_code` 75) is the only word on which
    the job is requeued, so it must mean "my state is saved, start me again"."""
    folder = Path(run_dir) if run_dir is not None else _job_run_dir()
    if folder is not None:
        write_stop_reason(folder, reason)


def write_stop_reason(run_dir: Path, reason: StopReason) -> None:
    """Record how the run ended, for the batch script: `preempted` asks for a requeue, `cancelled` does not, and
    `completed` forbids one (a time-limit warning can reach torchrun after training has finished). Written by
    rename: a symbolic link there is replaced, never followed."""
    label = "completed" if reason is StopReason.NONE else reason.label
    write_atomic(run_dir / STOP_REASON_FILE, (label + "\n").encode())
    record_attempt_end(run_dir, label)  # the attempt's record says it too, for the job page and `status`
