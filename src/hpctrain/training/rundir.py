"""What a run directory holds (config.yaml, checkpoints/, tb/, metrics, provenance, the lock), who may write it (the
lock), and writing its start-up files."""

from __future__ import annotations

import logging
import json
import os
import socket
import stat
import time
from pathlib import Path
from typing import Any

import yaml

from hpctrain.distributed import DistEnv, all_gather_object
from hpctrain.distributed.failures import collective
from hpctrain.distributed.probes import ELASTIC_MAX_NODES_VAR, ELASTIC_MIN_NODES_VAR
from hpctrain.errors import UserError
from hpctrain.fsutil import DirectoryLock, LocksUnsupported, file_kind, remove_temporaries, write_atomic
from hpctrain.health.preflight import BAD_NODES_FILE, PREFLIGHT_FILE, node_name
from hpctrain.health.progress import MAX_RECORD_BYTES, PROGRESS_DIR, parse_progress, progress_path
from hpctrain.health.stacks import HANG_DIR, STACKS_DIR
from hpctrain.health.view import read_attempts
from hpctrain.training.metrics import METRICS_FILE, TENSORBOARD_DIR
from hpctrain.readback import BadRunFile, read_json, read_text
from hpctrain.training.provenance import PROVENANCE_FILE, record_attempt
from hpctrain.training.run import Run
from hpctrain.training.stopping import SIGNALS_FILE, STOP_REASON_FILE
from hpctrain.stops import PEER_LOST_FILE

log = logging.getLogger(__name__)

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
    PEER_LOST_FILE,
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
        log.warning(str(err))
        return None


def write_run_files(
    run: Run, hosts: list[str], resumed_step: int | None = None, nodes: list[str] | None = None
) -> None:
    """config.yaml (the options and what was resolved from them) and this attempt's provenance record. Rank 0.

    A worker group that torchrun restarted (TORCHELASTIC_RESTART_COUNT > 0: a worker died, or an elastic job's
    membership changed) is recorded as one: the restart count, the step it resumed at, and, from RUN/peer_lost.json
    (note_peer_lost), the step at which a survivor first saw the loss and the seconds since; an elastic job's
    attempts also record the range asked for (`requested_nodes`) and their node names, so a group of another size
    names the nodes it lost. A different world size is a membership change, said in the log and in the attempt's
    `membership_change`. The previous group's stop reason (the agent stops its workers with SIGTERM, which they
    record as a cancel) is removed: it speaks of a group that no longer exists, and no cancel happened."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    # What a process of an earlier attempt left, killed between write and rename: the temporaries of the run's own
    # files (note_peer_lost's link source is itself written through one), never of those `hpctrain submit` may be
    # writing there at this moment (job.yaml, the script, the holder).
    for pattern in (*RUN_FILES, f".{PEER_LOST_FILE}.tmp-*"):
        remove_temporaries(run.run_dir, pattern)
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
    low, high = os.environ.get(ELASTIC_MIN_NODES_VAR), os.environ.get(ELASTIC_MAX_NODES_VAR)
    if low is None and high is None:  # a PyTorchJob's elasticPolicy: torchrun's PET_NNODES MIN:MAX (elastic.go)
        low, _, high = os.environ.get("PET_NNODES", "").partition(":")
    elastic = bool(low and high and low.isdigit() and high.isdigit())
    if elastic:  # `status JOB` shows "1 of 1:2"; the node names tell the next group which nodes it lost
        extra.update(requested_nodes=f"{int(low or 0)}:{int(high or 0)}", node_names=nodes or [])
    restart = int(os.environ.get(ELASTIC_RESTART_VAR) or 0)  # checked at start-up (probes.restart_count)
    lost = _take_peer_lost(run.run_dir)
    if restart:
        extra.update(worker_group_restart=restart, resumed_step=resumed_step)
        if elastic:
            extra["lost_nodes"] = _lost_nodes(run.run_dir, nodes or [])
        if lost is not None:  # "after T s" counts from the loss as a survivor first saw it, not from a step
            extra.update(lost_at_step=lost["step"], since_loss_s=round(max(0.0, time.time() - lost["seen_at"])))
        (run.run_dir / STOP_REASON_FILE).unlink(missing_ok=True)
    attempt = record_attempt(run.run_dir, hosts, extra)
    if "membership_change" in attempt:
        run.say(f"membership change: {attempt['membership_change']} (torchrun restart {restart})")


def note_peer_lost(run: Run, seen_at: float) -> None:
    """Under torchrun, the first rank of the group to see a peer lost leaves RUN/peer_lost.json: when it saw it
    (`seen_at`, time.time(); 0: now) and the step it had reached. A rank sees it in one of two ways: a collective fails
    (the lost peer's connections closed: `CollectiveFailure.seen_at`), or, when they never close (a node that lost
    power or its network), the hang watchdog finds a rank silent (the moment its wait began: the --hang-timeout
    spent waiting is part of what the loss cost). Later ranks find it there (created by link: exclusive and whole).
    O(1) files a rank. The next group's rank 0 takes it into its attempt record; one that no group took (the
    survivors could not re-form: below MIN, or the restart budget spent) tells the batch script to requeue the
    job. Best effort: a run that cannot write it still restarts, its change recorded without the moment of the
    loss."""
    if ELASTIC_RESTART_VAR not in os.environ:
        return
    final = run.run_dir / PEER_LOST_FILE
    if final.exists():
        return
    own = _own_record(run)
    note = {"seen_at": seen_at or time.time(), "step": own.step if own is not None else None}
    tmp = final.with_name(f".{PEER_LOST_FILE}.tmp-{os.getpid()}")  # a kill leaves it to remove_temporaries
    try:
        write_atomic(tmp, json.dumps(note).encode(), durable=False)
        os.link(tmp, final)
    except OSError:
        pass  # another rank was first (FileExistsError), or the file system refused: the restart goes on
    finally:
        tmp.unlink(missing_ok=True)


def _own_record(run: Run) -> Any:
    """This rank's progress record as it wrote it last (the step it had reached), or None."""
    try:
        text = read_text(progress_path(run.run_dir, run.env.rank), MAX_RECORD_BYTES, within=run.run_dir)
    except (OSError, BadRunFile):
        return None
    records = parse_progress([text])
    return records[0] if records and records[0].pid == os.getpid() else None


def _take_peer_lost(run_dir: Path) -> dict[str, Any] | None:
    """RUN/peer_lost.json as {seen_at, step}, checked, and removed (a later group's loss is its own); None when there
    is none or it is not of that shape."""
    path = run_dir / PEER_LOST_FILE
    try:
        note = read_json(path, 4096, within=run_dir)
    except (OSError, BadRunFile):
        return None
    finally:
        path.unlink(missing_ok=True)
    if not isinstance(note, dict):
        return None
    seen_at, step = note.get("seen_at"), note.get("step")
    if isinstance(seen_at, bool) or not isinstance(seen_at, int | float) or not 0 < seen_at < float("inf"):
        return None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        step = None
    return {"seen_at": float(seen_at), "step": step}


def _lost_nodes(run_dir: Path, nodes: list[str]) -> list[str]:
    """The nodes of the previous attempt that this one lacks (an elastic job's attempts record their node names)."""
    attempts = read_attempts(run_dir)
    before = attempts[-1].get("node_names") if attempts and isinstance(attempts[-1], dict) else None
    if not isinstance(before, list):
        return []
    return sorted({n for n in before if isinstance(n, str)} - set(nodes))


def all_hostnames(env: DistEnv) -> tuple[list[str], list[str]]:
    """The job's host names and node names (as its scheduler names them: health.preflight.node_name), each sorted,
    once each: one collective when distributed (every rank calls it)."""
    names = (socket.gethostname(), node_name())
    if not env.is_distributed:
        return [names[0]], [names[1]]
    with collective("the start-up exchange of host names"):
        gathered = all_gather_object(names)
    return sorted({h for h, _ in gathered}), sorted({n for _, n in gathered})
