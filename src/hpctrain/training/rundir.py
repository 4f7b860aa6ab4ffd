"""What a run directory holds (config.yaml, checkpoints/, tb/, metrics, provenance, the lock), who may write it (the
lock), and writing its start-up files."""

from __future__ import annotations

import os
import socket
import stat
import sys
import time
from pathlib import Path

import yaml

from hpctrain.distributed import DistEnv, all_gather_object
from hpctrain.distributed.failures import collective
from hpctrain.errors import UserError
from hpctrain.fsutil import DirectoryLock, LocksUnsupported, file_kind, write_atomic
from hpctrain.health.preflight import BAD_NODES_FILE, PREFLIGHT_FILE
from hpctrain.health.progress import PROGRESS_DIR, read_progress
from hpctrain.health.stacks import HANG_DIR, STACKS_DIR
from hpctrain.training.metrics import METRICS_FILE, TENSORBOARD_DIR
from hpctrain.training.provenance import PROVENANCE_FILE, record_attempt
from hpctrain.training.run import Run
from hpctrain.training.stopping import SIGNALS_FILE, STOP_REASON_FILE

CONFIG_FILE = "config.yaml"
ELASTIC_RESTART_VAR = "TORCHELASTIC_RESTART_COUNT"  # set by torchrun on every worker; > 0 in a restarted group
CHECKPOINT_DIR = "checkpoints"
# Held (flock) by rank 0 for the whole run: one run at a time in a run directory.
LOCK_FILE = ".hpctrain.lock"
# Files of the run directory that hpctrain writes itself: never through a symbolic link.
RUN_FILES = (
    CONFIG_FILE,
    METRICS_FILE,
    PROVENANCE_FILE,
    STOP_REASON_FILE,
    SIGNALS_FILE,
    LOCK_FILE,
    PREFLIGHT_FILE,
    BAD_NODES_FILE,
)
# Its directories too: a linked checkpoints/ or tb/ would put checkpoints, manifests and events elsewhere (and a
# linked progress/, hang/ or stacks/ the ranks' records and stacks).
RUN_DIRECTORIES = (CHECKPOINT_DIR, TENSORBOARD_DIR, PROGRESS_DIR, HANG_DIR, STACKS_DIR)


def checkpoint_dir(run_dir: Path) -> Path:
    """Where a run's checkpoint files go: RUN_DIR/checkpoints. A run directory itself named `checkpoints` (the seed
    scripts' `--checkpoints-path ./checkpoints`) holds them directly, not in checkpoints/checkpoints."""
    return run_dir if run_dir.name == CHECKPOINT_DIR else run_dir / CHECKPOINT_DIR


def check_run_paths(run_dir: Path) -> None:
    """UserError naming the first path the run will write that exists as the wrong kind of file (a `checkpoints`
    that is a file, a `metrics.jsonl` or `stop_reason` that is a folder, a `provenance.json` that is a FIFO, ...):
    found before the first step, not after an epoch's work, and never waited on. Looks only (lstat)."""
    folders = [run_dir / name for name in RUN_DIRECTORIES if name != CHECKPOINT_DIR] + [checkpoint_dir(run_dir)]
    wanted_kinds = [*((run_dir / name, stat.S_ISREG) for name in RUN_FILES), *((p, stat.S_ISDIR) for p in folders)]
    for path, wanted in wanted_kinds:
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        except NotADirectoryError:
            return  # the run directory itself is a file: config.check_run_dir says so
        if stat.S_ISLNK(mode):
            continue  # refuse_symlinks names those, with their target
        if not wanted(mode):
            needed = "a folder" if wanted is stat.S_ISDIR else "a regular file"
            kind = file_kind(mode) if not stat.S_ISREG(mode) else "a file"
            raise UserError(
                f"{path} is {kind}, but the run writes {needed} there; remove it or move it away (or "
                "choose another --run-dir), then start again"
            )


def check_run_dir_free(run_dir: Path) -> None:
    """UserError if another run holds `run_dir`'s lock (for a launcher to check before it starts workers)."""
    if run_dir.is_dir():
        lock_run_dir(run_dir).release()


def lock_run_dir(run_dir: Path) -> DirectoryLock | None:
    """This process's exclusive lock on `run_dir` (UserError naming the holder if another run has it); None, with a
    warning, where the file system has no locks."""
    holder = f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S %Z')}"
    try:
        return DirectoryLock.acquire(run_dir, LOCK_FILE, holder)
    except LocksUnsupported as err:
        print(f"hpctrain: warning: {err}", file=sys.stderr, flush=True)
        return None


def write_run_files(run: Run, hosts: list[str], resumed_step: int | None = None) -> None:
    """config.yaml (the options and what was resolved from them) and this attempt's provenance record. Rank 0.

    A worker group that torchrun restarted (TORCHELASTIC_RESTART_COUNT > 0: a worker died, or an elastic job's
    membership changed) is recorded as one: the restart count, the step it resumed at and the seconds since the
    previous group's ranks last recorded progress; a different world size is a membership change, said in the log
    and in the attempt's `membership_change`. The previous group's stop reason (the agent stops its workers with
    SIGTERM, which they record as a cancel) is removed: it speaks of a group that no longer exists, and no cancel
    happened."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    config = {
        **run.cfg.to_dict(),
        "resolved": {
            "strategy": run.strategy,
            "device": str(run.device),
            "world_size": run.env.world_size,
            "launcher": run.env.launcher,
        },
    }
    write_atomic(run.run_dir / CONFIG_FILE, yaml.safe_dump(config, sort_keys=False).encode())
    extra: dict[str, object] = {
        "launcher": run.env.launcher,
        "world_size": run.env.world_size,
        "nodes": run.env.num_nodes,
    }
    restart = int(os.environ.get(ELASTIC_RESTART_VAR) or 0)  # checked at start-up (probes.restart_count)
    if restart:
        extra.update(worker_group_restart=restart, resumed_step=resumed_step)
        # The previous group's ranks last wrote their progress when its last step ended (a group of another size:
        # this one's rank 0 may have written its own already).
        before = [r.updated for r in read_progress(run.run_dir) if r.world_size != run.env.world_size]
        if before:
            extra["since_last_step_s"] = round(max(0.0, time.time() - max(before)))
        (run.run_dir / STOP_REASON_FILE).unlink(missing_ok=True)
    attempt = record_attempt(run.run_dir, hosts, extra)
    if "membership_change" in attempt:
        run.say(f"membership change: {attempt['membership_change']} (torchrun restart {restart})")


def all_hostnames(env: DistEnv) -> list[str]:
    """The job's host names, sorted, once each: a collective when distributed (every rank calls it)."""
    host = socket.gethostname()
    if not env.is_distributed:
        return [host]
    with collective("the start-up exchange of host names"):
        hosts = all_gather_object(host)
    return sorted(set(hosts))
