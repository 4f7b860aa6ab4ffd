"""The hang report: from the ranks' progress records, which rank never arrived where the others wait.

When a rank's watchdog fires it writes its record with phase "hung" and, when it was inside a collective, that
collective's name (`waiting_in`). Given a few seconds for the other ranks' watchdogs to do the same, the records say:

- ranks whose watchdog fired outside any collective (stuck reading input, on a file system, in compute): culprits;
- ranks that wrote nothing since the hang began (a frozen or stopped process, a node gone): culprits;
- ranks with no record at all: culprits;
- ranks waiting in a collective: victims. A victim may wait one collective behind the others: a rank that
  vanished in the middle of a collective can have given some ranks all they needed from it and others not.
- Only when no rank is silent or missing: a rank that entered fewer collectives than the others (every rank
  enters the same ones, in the same order) is behind them, stuck in the compute around a collective the others
  have passed (a forward pass that never returns), and is the culprit.

One rank writes the report: the first of the ranks that noticed to claim it (`claim_report`, an exclusive create of
one file), after `REPORT_GRACE_S`. It alone reads every rank's record, and leaves the verdict in one line
(`SUMMARY_FILE`) that the other ranks read (`await_summary`) for their own last words: the file-system load of a
hang is O(N) opens in all, not every rank reading every rank's record (N², 64 million opens at 8,000 ranks).
The job's rank 0 removes an earlier attempt's claim and verdict when it starts (`forget_report_claim`).

When every rank waits in a collective and none is missing, no rank is to blame: the transport or the collective
backend itself hangs, and the report says so. A run of one process has no peer and no network to wait for: the
process itself is stuck, and the report says where (the collective context it was in, and its main thread's
innermost frame, `here`).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import UserError
from hpctrain.health.progress import RankProgress
from hpctrain.health.stacks import HANG_DIR, open_folder, write_in
from hpctrain.readback import BadRunFile, read_text

REPORT_FILE = "report.txt"
MAX_REPORT_BYTES = 4 << 20
"""A report is a line per rank: this is room for far more ranks than any job has (read back at most this much)."""
REPORT_GRACE_S = 6.0
"""How long the first rank to notice waits for the other ranks' watchdogs before it writes the report."""
CLAIM_FILE = "report.claim"
SUMMARY_FILE = "summary.txt"
MAX_SUMMARY_BYTES = 64 * 1024
SUMMARY_POLL_S = 0.5


@dataclass(frozen=True)
class HangReport:
    step: int  # the last step any rank completed
    culprits: list[str]  # "rank R on HOST", the rank(s) that never arrived
    lines: list[str]  # the report, one line a rank, then the verdict
    alone: str | None = None  # a single process's verdict: where it is stuck
    silent: bool = False  # a rank wrote nothing since the hang began, or nothing at all: it may be gone with its node

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"

    def summary(self) -> str:
        """One line for `hpctrain status` and the job log."""
        if self.alone:
            return f"hung at step {self.step}: {self.alone}"
        if not self.culprits:
            return f"hung at step {self.step}: every rank waits in a collective; none is missing"
        return f"hung at step {self.step}: {', '.join(self.culprits)} never arrived"


def hang_report(
    records: list[RankProgress],
    world_size: int,
    quiet_s: float,
    limit_s: float,
    run_dir: Path,
    now: float,
    here: str | None = None,
) -> HangReport:
    """The report, from every rank's newest record (read `REPORT_GRACE_S` after the first rank noticed); `here`:
    where the reporting process's main thread is (`function (file:line)`), for a run of one process."""
    if world_size == 1:
        return _alone(records, quiet_s, limit_s, run_dir, here)
    by_rank = {r.rank: r for r in records}
    waiting = [r for r in records if r.phase == "hung" and r.waiting_in]
    step = max((r.step for r in records), default=0)
    furthest = max((r.collectives for r in waiting if r.collectives is not None), default=None)
    behind = {
        r.rank for r in waiting if r.collectives is not None and furthest is not None and r.collectives < furthest
    }
    ahead = [r for r in waiting if r.rank not in behind]
    silent = any(by_rank.get(rank) is None or by_rank[rank].phase != "hung" for rank in range(world_size))
    where = Counter(r.waiting_in for r in ahead).most_common(1)[0][0] if ahead else None
    lines = [f"hang: no training step completed for {quiet_s:.0f} s (limit {limit_s:.0f} s; --hang-timeout)"]
    culprits = []
    for rank in range(world_size):
        r = by_rank.get(rank)
        stacks = run_dir / HANG_DIR / f"rank-{rank}.txt"
        if r is None:
            culprits.append(f"rank {rank}")
            lines.append(
                f"  rank {rank}: never wrote a progress record (it did not start, or its node cannot "
                "write the run directory)"
            )
        elif r.rank in behind and silent:
            lines.append(
                f"  {r.where()}: waits in {r.waiting_in}, one collective behind the others (the missing "
                f"rank left it half done); stacks in {stacks}"
            )
        elif r.rank in behind:
            culprits.append(r.where())
            lines.append(f"  {r.where()}: behind the others, still in {r.waiting_in}; stacks in {stacks}")
        elif r.phase == "hung" and r.waiting_in:
            lines.append(f"  {r.where()}: waits in {r.waiting_in}; stacks in {stacks}")
        elif r.phase == "hung":
            culprits.append(r.where())
            lines.append(
                f"  {r.where()}: stuck at step {r.step} outside any collective (its input, a file "
                f"system, or compute); stacks in {stacks}"
            )
        else:
            culprits.append(r.where())
            lines.append(
                f"  {r.where()}: last seen {r.age_s(now):.0f} s ago at step {r.step}, {r.phase}: the "
                "process is frozen, stopped or gone (its watchdog did not answer; no stacks)"
            )
    if culprits:
        lines.append(
            f"culprit: {', '.join(culprits)} never arrived"
            + (f" in {where}, where the other ranks wait" if where else "")
        )
    else:
        lines.append(
            "culprit: none found: every rank waits in a collective, so the network or the collective "
            "backend itself hangs (see the stacks)"
        )
    return HangReport(step, culprits, lines, silent=silent)


def _alone(records: list[RankProgress], quiet_s: float, limit_s: float, run_dir: Path, here: str | None) -> HangReport:
    """A single process's report: nobody else to wait for, so the process itself is stuck, and where."""
    record = next((r for r in records if r.rank == 0), None)
    who = record.where() if record else "rank 0"
    step = record.step if record else 0
    inside = (
        f"in {record.waiting_in}"
        if record and record.waiting_in
        else "outside any collective (its input, a file system, or compute)"
    )
    at = f", at {here}" if here else ""
    stacks = run_dir / HANG_DIR / "rank-0.txt"
    stuck = f"the process itself ({who}, the only one) is stuck {inside}{at}"
    lines = [
        f"hang: no training step completed for {quiet_s:.0f} s (limit {limit_s:.0f} s; --hang-timeout)",
        f"  {who}: stuck at step {step} {inside}{at}; stacks in {stacks}",
        f"culprit: {stuck}; one process waits for no network or other rank: its stack in {stacks} shows "
        "what it waits for",
    ]
    return HangReport(step, [who], lines, alone=stuck)


def report_path(run_dir: Path) -> Path:
    return run_dir / HANG_DIR / REPORT_FILE


def claim_report(run_dir: Path) -> bool:
    """Whether this rank writes the hang's report: True for the first caller of the attempt (which creates
    RUN/hang/report.claim exclusively), False for every later one, and for any that cannot create it."""
    try:
        folder = open_folder(run_dir, HANG_DIR)
    except (OSError, UserError):  # UserError: a link or a file there, which the stacks' writer names
        return False
    try:
        fd = os.open(
            CLAIM_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder
        )
    except OSError:
        return False
    finally:
        os.close(folder)
    os.close(fd)
    return True


def publish_summary(run_dir: Path, summary: str) -> None:
    """The reporter's verdict, one line, for the other ranks' `await_summary`."""
    folder = open_folder(run_dir, HANG_DIR)
    try:
        write_in(folder, SUMMARY_FILE, (summary + "\n").encode())
    finally:
        os.close(folder)


def await_summary(run_dir: Path, wait_s: float, poll_s: float = SUMMARY_POLL_S) -> str | None:
    """The reporter's verdict, once it is there (one look every `poll_s`, at most `wait_s`); None if it never came."""
    path = run_dir / HANG_DIR / SUMMARY_FILE
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return read_text(path, MAX_SUMMARY_BYTES, within=run_dir).strip() or None
        except FileNotFoundError:
            pass
        except (BadRunFile, OSError):
            return None
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)


def forget_report_claim(run_dir: Path) -> None:
    """At an attempt's start (rank 0, every rank present): an earlier attempt's claim and verdict are not this one's."""
    for name in (CLAIM_FILE, SUMMARY_FILE):
        try:
            os.unlink(run_dir / HANG_DIR / name)
        except OSError:
            pass
