"""One run as the loop sees it: `Run`, what the set-up resolved (read-only from then on), and `Position`, the loop's
own counters (what a resume restores besides model and optimizer state)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hpctrain import checkpoint
from hpctrain.config import TrainConfig
from hpctrain.distributed import DistEnv
from hpctrain.fsutil import DirectoryLock
from hpctrain.training.stopping import StopRequest
from hpctrain.training.workload import Recipe

log = logging.getLogger(__name__)


@dataclass
class Position:
    """The loop's own counters: everything besides model/optimizer state that a resume needs."""

    epoch: int = 0  # epochs completed; the epoch in progress is `epoch` (0-based)
    step: int = 0  # optimizer steps completed in the whole run
    step_in_epoch: int = 0  # optimizer steps completed in the epoch in progress
    epoch_train_seconds: float = 0.0  # training time spent in the epoch in progress before the last checkpoint
    loss_sum: float = 0.0  # this rank's sum of training losses in the epoch in progress (for the epoch's mean)
    best_accuracy: float = -1.0  # the best test accuracy at an epoch end so far (for checkpoint_best.pt)

    def next_epoch(self) -> None:
        self.epoch += 1
        self.step_in_epoch, self.epoch_train_seconds, self.loss_sum = 0, 0.0, 0.0


@dataclass
class Run:
    """Everything `setup.setup_run` resolved; the loop only reads it."""

    cfg: TrainConfig
    recipe: Recipe
    env: DistEnv
    device: torch.device
    strategy: str
    run_dir: Path
    resume_from: dict[str, Any] | None
    stop: StopRequest = field(default_factory=StopRequest)
    # Rank 0's checkpoint writer: saves in a background thread after copying the state off the device.
    writer: checkpoint.AsyncCheckpointer | None = None
    # Rank 0's exclusive lock on the run directory, released (and its file removed) when the run ends.
    lock: DirectoryLock | None = None
    # The checkpoint resumed from already has every epoch asked for: nothing to train.
    complete: bool = False

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    def say(self, message: str) -> None:
        """What the run tells its user (rank 0 only), through the channel at INFO (hpctrain.channel; a terminal shows
        it on stdout: `hpctrain: MESSAGE`)."""
        if self.is_main:
            log.info(message)

    def warn(self, message: str) -> None:
        """A warning (rank 0 only), at WARNING (on a terminal's stderr: `hpctrain: warning: MESSAGE`)."""
        if self.is_main:
            log.warning(message)

    def error(self, message: str) -> None:
        """Why the run ended in error and what to do (rank 0 only), at ERROR (on a terminal's stderr: `hpctrain train:
        error: MESSAGE`)."""
        if self.is_main:
            log.error(message)
