"""The training loop shared by every recipe: set up, resume, then step, evaluate and checkpoint, top to bottom.

The same function runs as one CPU process, on one GPU, as one of many DDP processes (torchrun, srun, local spawn)
or with DataParallel; what differs is decided once, in `setup.setup_run`, from the config, the recipe and the
detected environment. The pieces, each in its own module of this package:

    setup.py        the config completed, environment, device, strategy, threads; the run directory locked
    resume.py       which checkpoint a run continues from, and what may differ from it
    rundir.py       the run directory's layout, lock and start-up files
    parts.py        what one attempt trains: data, the wrapped model, optimization, the stop vote's group
    epoch.py        one epoch's steps, its evaluation and metrics record; the divergence vote
    evaluation.py   test loss and accuracy; --evaluate
    loop_state.py   saving, restoring and keeping the best of the loop's checkpoints
    watch.py        this rank's live progress record, hang watchdog and stack requests; rank 0's straggler check
    preflight.py    --preflight: every rank's GEMM rate and the job's all-reduce, judged before the first step
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpctrain import checkpoint
from hpctrain.config import TrainConfig, data_label
from hpctrain.data.sampler import EpochPlan, mix_seed
from hpctrain.distributed import destroy_process_group, init_process_group
from hpctrain.distributed.failures import CollectiveFailure, announce, peer_failures
from hpctrain.distributed.hostlist import is_node_name
from hpctrain.health.preflight import BAD_NODES_FILE, MAX_BAD_NODES_BYTES, PREFLIGHT_FILE
from hpctrain.readback import BadRunFile, read_text
from hpctrain.training import preflight_measure
from hpctrain.training.loop_state import restore, save
from hpctrain.training.epoch import diverged, finish_epoch, train_epoch
from hpctrain.training.graphed import build_graphs
from hpctrain.training.metrics import MetricsLog, Progress, ProgressView, train_hint
from hpctrain.training.precision import grad_scaler
from hpctrain.training.parts import Parts, control_group, wrap
from hpctrain.training.run import Position, Run
from hpctrain.training.rundir import all_hostnames, checkpoint_dir, note_peer_lost, write_run_files
from hpctrain.training.setup import setup_run
from hpctrain.training.stopping import StopReason, write_stop_reason
from hpctrain.training.watch import RankWatch, enable_flight_recorder
from hpctrain.training.workload import Recipe


@dataclass
class RunResult:
    run_dir: Path
    epochs_completed: int
    step: int
    stop_reason: StopReason
    last_metrics: dict[str, Any] | None = None


def train(cfg: TrainConfig, recipe: Recipe, view: ProgressView | None = None) -> RunResult:
    """Train `recipe` (shaped for this run: `recipe.for_config(cfg)`) as `cfg` says, in this process, as one rank of
    the job the environment describes; returns how the run ended. `view` shows the steps' progress (None: lines
    through the logging channel, hpctrain.training.metrics.ProgressLines)."""
    run = setup_run(cfg, recipe)
    if run.complete:
        run.release()
        return RunResult(run.run_dir, run.resume_from["epoch"], run.resume_from["step"], StopReason.NONE)
    with run.stop:
        enable_flight_recorder(run)
        init_process_group(run.env, run.device, run.cfg.dist_timeout)
        announce(run.env)
        if run.is_main and run.cfg.async_checkpoints:
            run.writer = checkpoint.AsyncCheckpointer()
        try:
            try:
                with peer_failures(run.env, run.cfg.dist_timeout):
                    result = _train(run, view)
            except CollectiveFailure as lost:
                note_peer_lost(run, lost.seen_at)  # torchrun's next group records when and where the loss was seen
                raise
            if run.writer is not None:
                run.writer.wait()  # the last checkpoint is durable before the process reports success
        finally:
            if run.writer is not None:
                run.writer.close()
            destroy_process_group()
            run.release()
        _report_end(run, result)
        run.stop.finish()  # from here on, a late signal cannot turn this outcome into a death by signal
        return result


def _train(run: Run, view: ProgressView | None) -> RunResult:
    if run.cfg.preflight_only:  # before any data is read or model built: only the devices and the network
        reason = StopReason.SICK_NODE if preflight_measure.run_preflight(run).bad else StopReason.NONE
        if run.is_main:
            write_stop_reason(run.run_dir, reason)
        return RunResult(run.run_dir, 0, 0, reason)
    parts, position = _build(run)
    metrics, progress = _start_reporting(run, parts, position, view)
    watch = RankWatch(run, parts.model, parts.plan.steps_per_epoch)
    reason, record = StopReason.CANCELLED, None  # what the progress record says if an exception ends the loop
    try:
        if _preflight_fails(run, watch):
            reason = StopReason.SICK_NODE
        else:
            reason, record = _epochs(run, parts, position, metrics, progress, watch)
    finally:
        watch.close("finished" if reason is StopReason.NONE else "stopped")
    if run.is_main:
        write_stop_reason(run.run_dir, reason)
    if metrics:
        metrics.close()
    return RunResult(run.run_dir, position.epoch, position.step, reason, record)


def _preflight_fails(run: Run, watch: RankWatch) -> bool:
    """--preflight (hpctrain.training.preflight_measure), when wanted: whether it found a sick node."""
    if not preflight_measure.wanted(run):
        return False
    with watch.long_phase("preflight"):
        return bool(preflight_measure.run_preflight(run).bad)


def _epochs(
    run: Run, parts: Parts, position: Position, metrics: MetricsLog | None, progress: Progress | None, watch: RankWatch
) -> tuple[StopReason, dict[str, Any] | None]:
    """Epoch after epoch until the configured count or a stop; returns why it ended and the last epoch's record."""
    cfg = run.cfg
    reason, record = StopReason.NONE, None
    while position.epoch < cfg.epochs:
        if progress:
            progress.start_epoch(position.epoch + 1, position.step_in_epoch)
        reason, stats = train_epoch(run, parts, position, progress, watch)
        if progress:
            progress.end_epoch()
        if reason is not StopReason.NONE:
            break
        finished = finish_epoch(run, parts, position, stats, watch)
        if diverged(run, parts, finished["train_loss"], finished["test_loss"]):
            reason = StopReason.DIVERGED  # nothing of this epoch is kept: no checkpoint, no metrics record
            break
        record = finished
        improved = record["test_accuracy"] > position.best_accuracy
        position.best_accuracy = max(position.best_accuracy, record["test_accuracy"])
        position.next_epoch()
        with watch.long_phase("checkpointing"):
            save(run, parts, position, end_of_epoch=True, best=improved and run.recipe.keeps_best)
        if metrics:
            metrics.epoch(record)
            run.say(
                f"epoch {record['epoch']}/{cfg.epochs}: train loss {record['train_loss']:.4f}, test loss "
                f"{record['test_loss']:.4f}, test accuracy {100 * record['test_accuracy']:.2f}%, "
                f"{record['images_per_s']:,.0f} images/s, {record['epoch_seconds']:.1f} s"
            )
    return reason, record


def _build(run: Run) -> tuple[Parts, Position]:
    cfg, recipe, device = run.cfg, run.recipe, run.device
    data = recipe.data_source(cfg, device, run.env)
    plan = EpochPlan(data.num_train, cfg.batch_size, run.env.world_size, cfg.seed)
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank and in every strategy
    model = recipe.build_model().to(device)
    optimization = recipe.build_optimization(model, cfg.lr, cfg.epochs, plan.steps_per_epoch)
    optimization.scaler = grad_scaler(recipe.precision(device), device)  # before restore: a checkpoint holds its state
    if run.resume_from is not None:
        position = restore(run, model, optimization, run.resume_from)
    else:
        position = Position()
        torch.manual_seed(mix_seed(cfg.seed, run.env.rank))  # dropout differs between ranks, as it should
    parts = Parts(data, plan, model, wrap(model, run), optimization, control_group(run), torch.Generator(device))
    parts.step_graph, parts.eval_graph = build_graphs(
        recipe, model, optimization, device, run.strategy, cfg.batch_size, run.say
    )
    return parts, position


def _start_reporting(
    run: Run, parts: Parts, position: Position, view: ProgressView | None
) -> tuple[MetricsLog | None, Progress | None]:
    hosts, nodes = all_hostnames(run.env)  # a collective: every rank takes part, not only the main one
    if not run.is_main:
        return None, None
    cfg, plan = run.cfg, parts.plan
    write_run_files(run, hosts, position.step if run.resume_from is not None else None, nodes)
    metrics = MetricsLog(run.run_dir, position.step if run.resume_from is not None else None)
    progress = Progress(
        cfg.epochs,
        plan.steps_per_epoch,
        cfg.log_interval,
        view,
        on_report=metrics.train_loss,
        every_steps=cfg.print_freq,
    )
    where = (
        f"{run.env.world_size} process(es), {run.strategy}, {run.device.type} ({run.recipe.precision(run.device).why})"
    )
    run.say(
        f"training {cfg.workload}/{cfg.recipe} on {data_label(cfg)} ({plan.num_samples} images) with {where}; "
        f"run dir {run.run_dir}"
    )
    scaling = run.recipe.describe_scaling(cfg, run.env.world_size)
    if scaling:
        run.say(scaling)
    for warning in run.recipe.warnings(cfg, plan.num_samples, plan.steps_per_epoch):
        run.warn(warning)
    run.say(train_hint(run.run_dir))
    if run.resume_from is not None:
        run.say(
            f"resumed at epoch {position.epoch + 1}, step {position.step_in_epoch} of "
            f"{plan.steps_per_epoch} (global step {position.step})"
        )
    return metrics, progress


def _report_end(run: Run, result: RunResult) -> None:
    """The last lines: how the run ended, where its run directory and newest checkpoint are, what to do next."""
    if not run.is_main:
        return
    latest = checkpoint.find_latest(checkpoint_dir(run.run_dir))
    where = f"run dir {run.run_dir}, last checkpoint {latest.path if latest is not None else '(none)'}"
    reason = result.stop_reason
    if reason is StopReason.NONE and run.cfg.preflight_only:
        run.say(f"preflight only: every node passed, nothing trained; {run.run_dir / PREFLIGHT_FILE}")
    elif reason is StopReason.NONE:
        run.say(f"completed {result.epochs_completed} epoch(s), global step {result.step}; {where}")
    elif reason is StopReason.SICK_NODE:
        bad = [node for node in _bad_nodes(run) if is_node_name(node)]  # a file's words: only names are printed
        exclude = (
            shlex.join(["hpctrain", "submit", "--exclude-nodes", ",".join(bad)])
            if bad
            else "hpctrain submit --exclude-nodes NODE,..."
        )
        run.error(
            "the preflight found sick node(s) before the first step: "
            f"{', '.join(bad) or '(see the record)'} ({run.run_dir / PREFLIGHT_FILE}); {where}. A job from `hpctrain "
            "submit` on Slurm requeues itself without them (within --max-hang-restarts); elsewhere submit it again "
            f"away from them: `{exclude} ...` with `train ... --resume` if it has checkpoints"
        )
    elif reason is StopReason.DIVERGED:
        run.error(
            f"the training loss became non-finite (inf or nan) by global step {result.step}:"
            f" the run diverged and stopped without writing a checkpoint after that; {where}. Start again with a "
            f"lower --lr (this run: {run.cfg.lr:g}), or continue from that checkpoint with `--resume --lr LOWER`"
        )
    else:
        if run.stop.signal_name is not None:
            why = f"{run.stop.signal_name} received"
        else:  # only possible with several processes: the vote carries the reason, not the signal
            why = "a signal reached another process"
        run.say(
            f"stopped ({reason.label}: {why}) at global step {result.step} after writing a checkpoint; {where}. "
            f"{_how_to_continue(reason)}"
        )


def _bad_nodes(run: Run) -> list[str]:
    try:
        return read_text(run.run_dir / BAD_NODES_FILE, MAX_BAD_NODES_BYTES, within=run.run_dir).split()
    except (OSError, BadRunFile):  # the message then points to the preflight's record
        return []


def _how_to_continue(reason: StopReason) -> str:
    """After a stop: inside a Slurm job that hpctrain submitted, a time-limit warning makes the batch script requeue
    the job, and the next attempt resumes by itself; anywhere else, the user continues the run."""
    if reason is StopReason.PREEMPTED and os.environ.get("SLURM_JOB_ID") and os.environ.get("HPCTRAIN_RUN_DIR"):
        return (
            "The job's batch script requeues the job (within its --max-requeues) and the next attempt resumes "
            "from that checkpoint by itself; nothing to do"
        )
    return "Continue with `--resume` and the same --run-dir"
