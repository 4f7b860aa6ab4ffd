"""Live per-rank progress: every rank replaces its own small file, RUN/progress/rank-N.json, every few seconds.

No collective and no coordination: a rank that stops making progress simply stops updating its file, and that is
what the hang report and `hpctrain top` read. A record holds the rank's position and, over the steps since its
previous record, its mean step time split into what the rank spends on its own before it can wait for anyone:
waiting for input (`data_s`) and computing the forward pass (`compute_s`). In data-parallel training every rank's
step takes as long as the slowest rank's, so the step time names no straggler; a rank's own time does.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.fsutil import remove_temporaries, write_atomic
from hpctrain.readback import BadRunFile, bounds, parse_json, parse_record, read_text

PROGRESS_DIR = "progress"
PROGRESS_INTERVAL_S = 5.0
"""How often a rank replaces its record while it trains."""
MAX_RECORD_BYTES = 64 * 1024
"""A record is a few hundred bytes; a larger file is not one (read back at most this much)."""
MAX_WORLD_SIZE = 1 << 20


@dataclass
class RankProgress:
    """One rank's record. Read back through `parse_record` (hpctrain.readback): each field's type and bounds are
    checked, so a record of the wrong shape is skipped whole rather than met later as a wrong type."""

    rank: int = field(metadata=bounds(0, MAX_WORLD_SIZE - 1))
    world_size: int = field(metadata=bounds(1, MAX_WORLD_SIZE))
    host: str = field(metadata=bounds(1, 255))
    pid: int = field(metadata=bounds(0, None))
    phase: str = field(metadata=bounds(1, 32))  # starting, preflight, training, evaluating, checkpointing, hung, ...
    epoch: int = field(default=0, metadata=bounds(0, None))  # the epoch in progress, from 1
    step: int = field(default=0, metadata=bounds(0, None))  # optimizer steps completed in the run
    step_in_epoch: int = field(default=0, metadata=bounds(0, None))
    steps_per_epoch: int = field(default=0, metadata=bounds(0, None))
    # how many steps the means below cover (0: none since the previous record)
    steps: int = field(default=0, metadata=bounds(0, None))
    step_s: float | None = field(default=None, metadata=bounds(0, None))  # mean seconds per step (above 0)
    data_s: float | None = field(default=None, metadata=bounds(0, None))  # ... spent waiting for input
    compute_s: float | None = field(default=None, metadata=bounds(0, None))  # ... in the model's forward pass
    images_per_s: float | None = field(default=None, metadata=bounds(0, None))  # this rank's own images per second
    waiting_in: str | None = None  # the collective this rank was in when it wrote this (set when it hung)
    collectives: int | None = field(default=None, metadata=bounds(0, None))  # collectives entered by then
    updated: float = field(default=0.0, metadata=bounds(0, None))  # time.time() of the write

    def check(self) -> str | None:
        """For `parse_record`: what relates fields."""
        if self.rank >= self.world_size:
            return f"rank {self.rank} is not below its world size {self.world_size}"
        if self.step_s == 0:
            return "'step_s' is 0: a step takes some time"
        return None

    @property
    def own_s(self) -> float | None:
        """Seconds per step this rank spends before it can wait for another: input plus forward pass."""
        if self.data_s is None or self.compute_s is None:
            return None
        return self.data_s + self.compute_s

    def age_s(self, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - self.updated)

    def where(self) -> str:
        return f"rank {self.rank} on {self.host}"


def progress_path(run_dir: Path, rank: int) -> Path:
    return run_dir / PROGRESS_DIR / f"rank-{rank}.json"


def read_progress(run_dir: str | Path, on_bad: Callable[[BadRunFile], None] | None = None) -> list[RankProgress]:
    """Every rank's newest record, by rank. Records of an earlier attempt with more ranks than the newest are left
    out (a rank number beyond the newest record's world size). A file that is not a valid record (special, a link,
    too large, not JSON, a field of the wrong type or out of bounds) is skipped, and given to `on_bad` if set."""
    folder = Path(run_dir) / PROGRESS_DIR
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    texts = []
    for name in names:
        if name.startswith("rank-") and name.endswith(".json"):
            try:
                texts.append((read_text(folder / name, MAX_RECORD_BYTES, within=run_dir), folder / name))
            except BadRunFile as err:
                if on_bad is not None:
                    on_bad(err)
            except OSError:
                continue  # removed meanwhile
    return parse_progress(texts, on_bad)


def parse_progress(
    texts: Iterable[str | tuple[str, str | os.PathLike]], on_bad: Callable[[BadRunFile], None] | None = None
) -> list[RankProgress]:
    """The records in `texts` (each one rank's JSON file, read here or through a pod's exec; or (text, where it came
    from)), as `read_progress` gives them: by rank, each rank's newest, without ranks an earlier, larger attempt
    left; invalid ones skipped (and given to `on_bad`)."""
    newest_by_rank: dict[int, RankProgress] = {}
    for item in texts:
        text, source = item if isinstance(item, tuple) else (item, "a progress record")
        try:
            record = parse_record(RankProgress, parse_json(text, source), source)
        except BadRunFile as err:
            if on_bad is not None:
                on_bad(err)
            continue
        if record.rank not in newest_by_rank or record.updated > newest_by_rank[record.rank].updated:
            newest_by_rank[record.rank] = record
    records = list(newest_by_rank.values())
    if not records:
        return []
    newest = max(records, key=lambda r: r.updated)
    return sorted((r for r in records if r.rank < newest.world_size), key=lambda r: r.rank)


class ProgressRecorder:
    """One rank's writer. `step()` is called once per step and costs a few additions; the file is replaced at
    most every `interval_s` (and at once on a change of phase)."""

    def __init__(
        self,
        run_dir: Path,
        rank: int,
        world_size: int,
        host: str,
        steps_per_epoch: int,
        interval_s: float = PROGRESS_INTERVAL_S,
    ) -> None:
        self.path = progress_path(run_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        remove_temporaries(self.path.parent, self.path.name)  # an earlier process of this rank's, killed mid-write
        self.record = RankProgress(rank, world_size, host, os.getpid(), "starting", steps_per_epoch=steps_per_epoch)
        self.interval_s = interval_s
        self._sums = [0, 0.0, 0.0, 0.0, 0]  # steps, step, data, compute seconds, images
        self._last_write = 0.0

    def step(
        self, epoch: int, step: int, step_in_epoch: int, images: int, step_s: float, data_s: float, compute_s: float
    ) -> None:
        sums = self._sums
        sums[0] += 1
        sums[1] += step_s
        sums[2] += data_s
        sums[3] += compute_s
        sums[4] += images
        r = self.record
        r.epoch, r.step, r.step_in_epoch = epoch, step, step_in_epoch
        if r.phase != "training" or time.monotonic() - self._last_write >= self.interval_s:
            self.write("training")  # at once after another phase, then every interval_s

    def phase(self, phase: str, waiting_in: str | None = None, collectives: int | None = None) -> None:
        """Enter `phase` ("evaluating", "checkpointing", ...) and write the record now."""
        self.write(phase, waiting_in, collectives)

    def write(self, phase: str, waiting_in: str | None = None, collectives: int | None = None) -> None:
        steps, step_s, data_s, compute_s, images = self._sums
        r = self.record
        r.phase, r.waiting_in, r.collectives, r.steps = phase, waiting_in, collectives, steps
        if steps:
            r.step_s, r.data_s, r.compute_s = step_s / steps, data_s / steps, compute_s / steps
            r.images_per_s = images / step_s if step_s > 0 else None
        r.updated = time.time()
        self._sums = [0, 0.0, 0.0, 0.0, 0]
        self._last_write = time.monotonic()
        try:
            write_atomic(self.path, json.dumps(asdict(r)).encode(), durable=False)
        except OSError:
            pass  # progress is advisory: a full disk or a vanished directory must not stop training

    def as_dict(self) -> dict[str, Any]:
        return asdict(self.record)
