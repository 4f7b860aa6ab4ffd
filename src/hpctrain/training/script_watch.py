"""The built-in recipes' health watch (hpctrain.training.watch.RankWatch) for a user's own training script.

    watch = health_watch(run_dir, env, device, model, steps_per_epoch)   # after setup(), once the model is built
    for ...:
        ...                                        # one optimizer step
        watch.step(epoch, global_step, step_in_epoch, batch_size, data_wait_s=0.0)
        with watch.long_phase("checkpoint"):       # evaluation or a checkpoint: the long allowance
            ...
    watch.close("finished")

It gives the script what the recipes get: a live record per rank (RUN/progress/, what `hpctrain top` shows);
answers to `hpctrain debug stacks`; on rank 0 the straggler check; and on a hang (no step within the limit), every
rank's stacks in RUN/hang/, the report naming the rank that never arrived (RUN/hang/report.txt), stop_reason `hung`
and exit status 142, on which a job of `hpctrain submit` starts again from its checkpoint (--max-hang-restarts).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from hpctrain.distributed import DistEnv
from hpctrain.training.watch import RankWatch


@dataclass(frozen=True)
class _Limits:
    hang_timeout: float | None
    dist_timeout: float


@dataclass(frozen=True)
class _ScriptRun:
    """What RankWatch reads of a run."""

    run_dir: Path
    env: DistEnv
    device: torch.device
    cfg: _Limits

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0


def health_watch(
    run_dir: str | Path,
    env: DistEnv,
    device: torch.device,
    model: torch.nn.Module,
    steps_per_epoch: int,
    hang_timeout: float | None = None,
    dist_timeout_s: float = 600.0,
) -> RankWatch:
    """Start the watch for this rank. `hang_timeout`: seconds without a step that count as a hang (None: derived
    from the step times, as `train --hang-timeout` leaves it; 0: off); `dist_timeout_s`: the process group's
    timeout (`setup(timeout_s=...)`), which with a margin bounds evaluation and checkpoint phases."""
    if hang_timeout is not None and hang_timeout < 0:
        raise ValueError("hang_timeout: give seconds above 0, 0 (off) or None (automatic)")
    run = _ScriptRun(Path(run_dir), env, device, _Limits(hang_timeout, dist_timeout_s))
    return RankWatch(run, model, steps_per_epoch)  # reads only _ScriptRun's fields
