"""Run Slurm client commands (argv lists, never a shell) and turn their failures into errors that name the fix.

Every `squeue`, `sinfo`, `scontrol`, `sacct`, `sbatch`, `scancel` and `srun` hpctrain runs goes through `slurm()`:
  * a deadline for the whole call (HPCTRAIN_SLURM_TIMEOUT, default a minute): a client that hangs (`sacct` behind
    a stuck slurmdbd, a wedged shared file system, a stopped controller) is killed with what it started;
  * a bound on what it may print (MAX_OUTPUT_BYTES per stream);
  * retries, within that deadline, only of a command that changes nothing (queries) and only when Slurm said it
    was busy or out of reach: an `sbatch` or `scancel` that timed out may have been carried out;
  * one-line errors that say which command, what it waited for and how long, and what to check.
`poll_until` is the one loop that polls a job until something holds, with one retry policy (a poll that found
Slurm out of reach is asked again at the next poll, for up to one command deadline, never past the loop's own).
"""

from __future__ import annotations

import math
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from hpctrain.errors import UserError
from hpctrain.fsutil import format_bytes

Runner = Callable[..., "subprocess.CompletedProcess[Any]"]
T = TypeVar("T")

TIMEOUT_ENV = "HPCTRAIN_SLURM_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 24 * 3600.0
MAX_OUTPUT_BYTES = 256 * 2**20
"""What one stream of one command may print: `squeue --all-users` on a cluster of 100,000 jobs prints ~30 MB."""
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 8.0

# Slurm's words (src/common/slurm_errno.c; EAGAIN's strerror) for "the daemon did not answer, or was too busy to".
BUSY = (
    "socket timed out on send/recv operation",
    "unable to contact slurm controller",
    "resource temporarily unavailable",
    "zero bytes were transmitted or received",
    "communication connection failure",
    "slurm backup controller in standby mode",
)
QUERIES = frozenset({"squeue", "sinfo", "sacct", "sprio", "sshare", "sstat", "sdiag"})
SCONTROL_READS = frozenset({"show", "ping", "version"})


class SlurmUnavailable(UserError):
    """A Slurm command got no answer within the deadline, or Slurm said it was out of reach until then."""


class OutputTooLarge(Exception):
    """A command printed more than the runner keeps."""


def command_timeout_s() -> float:
    """The deadline of one Slurm command: HPCTRAIN_SLURM_TIMEOUT seconds, default DEFAULT_TIMEOUT_S."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_TIMEOUT_S:
        raise UserError(
            f"{TIMEOUT_ENV}={text[:40]!r}: give the seconds hpctrain waits for a Slurm command, above 0 and at most "
            f"{MAX_TIMEOUT_S:g} (e.g. {TIMEOUT_ENV}=120), or unset it for {DEFAULT_TIMEOUT_S:g}"
        )
    return value


def decoded(data: bytes | str | None) -> str:
    """A Slurm client's output as text: UTF-8, a byte that is not (a job name holds any byte but NUL, and `status
    --all-users` prints everyone's) shown as `\\xff` rather than failing the whole command. Decoded here, not by
    subprocess's text mode, which also turns every `\\r` into a line end."""
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode("utf-8", "backslashreplace")


def run_text(
    run: Callable[..., subprocess.CompletedProcess], argv: Sequence[Any], input: str | None = None, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """`run(argv, capture_output=True, ...)` with byte pipes, its stdout and stderr decoded(); `input` goes in as
    UTF-8. Every command hpctrain runs for Slurm is run so."""
    if input is not None:
        kwargs["input"] = input.encode("utf-8", "surrogateescape")
    result = run(argv, capture_output=True, **kwargs)
    return subprocess.CompletedProcess(result.args, result.returncode, decoded(result.stdout), decoded(result.stderr))


def run_bounded(
    argv: Sequence[str],
    *,
    input: bytes | None = None,
    timeout: float | None = None,
    limit: int | None = None,
    env: dict[str, str] | None = None,
    **_: Any,
) -> subprocess.CompletedProcess[bytes]:
    """subprocess.run(argv, input=..., capture_output=True, timeout=...) with bytes, but in a session of its own,
    killed with every process it started when `timeout` passes (subprocess.TimeoutExpired) or when it prints more
    than `limit` bytes on a stream (default MAX_OUTPUT_BYTES; OutputTooLarge), or when this process is interrupted."""
    limit = MAX_OUTPUT_BYTES if limit is None else limit
    deadline = None if timeout is None else time.monotonic() + timeout
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    kept = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    try:
        with selectors.DefaultSelector() as selector:
            for fd in kept:
                selector.register(fd, selectors.EVENT_READ)
            pending = memoryview(input or b"")
            if proc.stdin is not None:
                if pending:
                    selector.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
                else:
                    proc.stdin.close()
            while selector.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(list(argv), timeout or 0.0)
                for key, _events in selector.select(left):
                    if key.fd in kept:
                        data = os.read(key.fd, 65536)
                        if not data:
                            selector.unregister(key.fd)
                        elif len(kept[key.fd]) + len(data) > limit:
                            raise OutputTooLarge(f"more than {limit} bytes")
                        else:
                            kept[key.fd] += data
                        continue
                    try:
                        pending = pending[os.write(key.fd, pending[:65536]) :]
                    except BrokenPipeError:
                        pending = pending[len(pending) :]  # it stopped reading: what it printed tells why
                    if not pending:
                        selector.unregister(key.fd)
                        assert proc.stdin is not None
                        proc.stdin.close()
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                returncode = proc.wait(left)
            except subprocess.TimeoutExpired:
                raise subprocess.TimeoutExpired(list(argv), timeout or 0.0) from None
    except BaseException:
        _kill(proc)
        raise
    finally:
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    out, err = kept.values()
    return subprocess.CompletedProcess(list(argv), returncode, bytes(out), bytes(err))


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the command's session (a client wrapper's children too), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    proc.wait()


def idempotent(argv: Sequence[str], input: str | None = None) -> bool:
    """A command that changes nothing, so that running it again is safe: the queries, and `scontrol` showing (or
    writing out a batch script to stdout), also as a session of such lines on its stdin."""
    name = os.path.basename(argv[0])
    if name in QUERIES:
        return True
    if name != "scontrol":
        return False
    words = [w for w in argv[1:] if w == "-" or not w.startswith("-")]
    if not words and input is not None:
        return all(_scontrol_reads(line.split()) for line in input.splitlines() if line.strip())
    return _scontrol_reads(words)


def _scontrol_reads(words: Sequence[str]) -> bool:
    if not words:
        return False
    return words[0] in SCONTROL_READS or (words[0] == "write" and words[1:2] == ["batch_script"] and words[-1] == "-")


def busy(result: subprocess.CompletedProcess[str]) -> bool:
    """Slurm said its daemon did not answer or was too busy to (not: the request was wrong)."""
    text = f"{result.stderr}\n{result.stdout}".lower()
    return result.returncode != 0 and any(words in text for words in BUSY)


def slurm(
    argv: Sequence[str],
    *,
    run: Runner = run_bounded,
    check: bool = True,
    input: str | None = None,
    timeout: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> subprocess.CompletedProcess[str]:
    """Run one Slurm command (with `input` on its stdin) and return its result, within `timeout` seconds in all
    (default: command_timeout_s()). A query Slurm answered "busy" or "unreachable" is asked again (after 1, 2, 4,
    8 s) while the deadline allows. Raises UserError when the client is missing, when it printed too much, or with
    check=True when the command fails (its stderr is part of the message); SlurmUnavailable when it got no answer
    within the deadline, or Slurm stayed out of reach."""
    argv = [str(a) for a in argv]
    budget = command_timeout_s() if timeout is None else timeout
    deadline = clock() + budget
    retry = idempotent(argv, input)
    pause = RETRY_FIRST_S
    attempts = 0
    while True:
        attempts += 1
        try:
            result = run_text(run, argv, input=input, check=False, timeout=max(0.0, deadline - clock()))
        except FileNotFoundError:
            raise UserError(_NO_CLIENT.format(cmd=argv[0])) from None
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(unanswered(argv, budget, attempts)) from None
        except OutputTooLarge:
            raise UserError(
                f"`{_line(argv)}` printed more than {format_bytes(MAX_OUTPUT_BYTES)}, more than hpctrain reads: "
                "narrow the query (drop --all-users), or run it by hand to see what it prints"
            ) from None
        if not busy(result):
            break
        if not retry or clock() + pause >= deadline:
            raise SlurmUnavailable(unreachable(argv, result, budget, attempts, retry))
        sleep(pause)
        pause = min(pause * 2, RETRY_MAX_S)
    if check and result.returncode != 0:
        raise UserError(command_error(argv, result))
    return result


def poll_until(
    probe: Callable[[], T],
    done: Callable[[T], bool],
    *,
    timeout_s: float | None,
    poll_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[T, bool]:
    """Call probe() every poll_s seconds until done(its value) holds or timeout_s passes (None: no limit); return
    the last value and whether done. The one retry policy: a probe that found Slurm out of reach (SlurmUnavailable)
    is asked again at the next poll, for at most one command deadline (command_timeout_s()) since the last answer
    and never past the loop's own deadline, then its error is raised; any other error ends the loop at once."""
    patience = command_timeout_s()
    deadline = None if timeout_s is None else clock() + max(0.0, timeout_s)
    outage_since: float | None = None
    while True:
        try:
            value = probe()
        except SlurmUnavailable:
            now = clock()
            outage_since = now if outage_since is None else outage_since
            if now - outage_since >= patience or (deadline is not None and now + poll_s >= deadline):
                raise
        else:
            outage_since = None
            if done(value):
                return value, True
            if deadline is not None and clock() >= deadline:
                return value, False
        sleep(poll_s)


_NO_CLIENT = (
    "`{cmd}` was not found: hpctrain needs the Slurm client commands on PATH. Run it on a login node of your "
    "cluster (after `module load slurm` where the cluster uses modules)"
)
_NO_CONTROLLER = (
    "`{line}` could not reach the Slurm controller ({err}). Check `scontrol ping`; if it fails too, the "
    "controller is down or unreachable from this host: ask the cluster's administrators"
)


def _line(argv: Sequence[str]) -> str:
    return " ".join(argv[:3])


def _daemon(argv: Sequence[str]) -> tuple[str, str]:
    """What the command waits for, and what to check."""
    name = os.path.basename(argv[0])
    if name == "sacct":
        return "Slurm's accounting daemon (slurmdbd)", "check `sacctmgr show cluster` and `scontrol ping`"
    if name == "srun":
        return "the job's step (srun)", "check `scontrol ping` and the job's state (`hpctrain status JOB`)"
    return "the Slurm controller", (
        "check `scontrol ping`; if it fails too, the controller is down or unreachable from this host: ask the "
        "cluster's administrators"
    )


def _maybe_done(argv: Sequence[str]) -> str:
    """What a command that changes something may have done although it got no answer."""
    name = os.path.basename(argv[0])
    if name == "sbatch":
        return "; the job may have been queued anyway: see `hpctrain status` before submitting again"
    if name == "scancel":
        return "; the request may have reached Slurm anyway: see the job's state in `hpctrain status`"
    return ""


def unanswered(argv: Sequence[str], budget: float, attempts: int) -> str:
    what, check = _daemon(argv)
    tries = f" ({attempts} tries)" if attempts > 1 else ""
    return (
        f"`{_line(argv)}` got no answer from {what} within {budget:g} s{tries}: {check}{_maybe_done(argv)}; "
        f"where the cluster is slow but working, wait longer with {TIMEOUT_ENV}=SECONDS"
    )


def unreachable(
    argv: Sequence[str], result: subprocess.CompletedProcess[str], budget: float, attempts: int, retried: bool
) -> str:
    what, check = _daemon(argv)
    err = " ".join((result.stderr or result.stdout or "").split())[:300]
    tries = f"; asked {attempts} times within {budget:g} s" if retried else ""
    return f"`{_line(argv)}` could not reach {what} ({err}{tries}): {check}{_maybe_done(argv)}"


def command_error(argv: Sequence[str], result: subprocess.CompletedProcess[str]) -> str:
    err = " ".join((result.stderr or result.stdout or "").split()) or f"exit status {result.returncode}"
    line = _line(argv)
    lowered = err.lower()
    if "unable to contact slurm controller" in lowered or "connection refused" in lowered:
        return _NO_CONTROLLER.format(line=line, err=err)
    return f"`{line}` failed: {err}"
