"""Where a run continues from: finding the checkpoint (--resume, a restarted attempt), refusing unusable ones and
accidental reuse of a run directory, and taking the run's recorded settings for the options left unset."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpctrain import checkpoint
from hpctrain.config import TrainConfig, default_run_dir, earlier_default_run_dir
from hpctrain.distributed import DistEnv
from hpctrain.distributed.probes import may_be_a_restart
from hpctrain.errors import UserError, brief
from hpctrain.training.loop_state import CHECKPOINT_FORMAT, TRAIN_STATE_KEYS, load_own_part
from hpctrain.training.recorded import check_state, check_types, refused, settings_with
from hpctrain.training.rundir import CHECKPOINT_DIR, checkpoint_dir
from hpctrain.training.state_fit import optimization_problem
from hpctrain.training.workload import Recipe

log = logging.getLogger(__name__)

# Fields that fix which data, model, crops and batch order a run has: a checkpoint cannot continue under other
# values (an image size changed mid-run would change every later crop: no exact resume; none has an override).
RESUME_MUST_MATCH = (
    "workload",
    "recipe",
    "dataset",
    "synthetic",
    "batch_size",
    "train_limit",
    "seed",
    "arch",
    "image_size",
    "val_size",
)
# What a --resume or --evaluate takes from its checkpoint's config when the command line leaves it unset: the
# run's own settings, so that resuming needs no flag repeated (a flag given that contradicts RESUME_MUST_MATCH is
# still refused; --epochs and --lr given are honoured: extending a run, lowering the rate after a divergence).
OVERRIDABLE = ("epochs", "lr", "test_batch_size", "test_limit", "momentum", "weight_decay")
RECORDED_DEFAULTS = (*RESUME_MUST_MATCH, *OVERRIDABLE)


@dataclass
class ResumePoint:
    """The checkpoint a run continues from, and what in the run's checkpoint directory must make way for it."""

    state: dict[str, Any] | None  # None: start from the beginning (only unfinished saves were found)
    source: Path | None

    def tidy(self, ckpt_dir: Path) -> None:
        """Move aside (never delete, never overwrite) every checkpoint file that is further on than the resume
        point: a damaged or unfinished one, or, after an explicit --resume of an older checkpoint, the abandoned
        line's valid ones, which would otherwise count as newer than the run's own new saves. Rank 0, locked."""
        here = (self.state["epoch"], self.state["step"]) if self.state is not None else (-1, -1)
        for path in checkpoint.candidates(ckpt_dir):
            position = checkpoint.position_of(path)
            if path == self.source or position is None or position[:2] <= here:
                continue
            try:
                checkpoint.verify(path)
                suffix, why = checkpoint.ABANDONED_SUFFIX, "further on than the checkpoint resumed from"
            except checkpoint.CheckpointError as err:
                suffix = checkpoint.INCOMPLETE_SUFFIX if err.unfinished else checkpoint.CORRUPT_SUFFIX
                why = err.reason
            target = checkpoint.set_aside(path, suffix)
            log.info(f"moved {path.name} aside to {target.name} ({why})")


def check_resume_point(cfg: TrainConfig, recipe: Recipe, env: DistEnv) -> dict[str, Any] | None:
    """The checkpoint state to continue from (None: a fresh run), refusing unusable ones and accidental reuse.
    Changes nothing on disk."""
    point = resume_point(cfg, recipe, env)
    return point.state if point is not None else None


def resume_point(cfg: TrainConfig, recipe: Recipe, env: DistEnv) -> ResumePoint | None:
    """Where the run starts (see `_resume_state`), checked: a checkpoint of this run's options and model."""
    point = _resume_state(cfg, Path(cfg.run_dir), env)
    if point is not None:
        _check_resumable(cfg, recipe, point.state, point.source)
        if point.state is not None and point.source is not None:
            load_own_part(point.state, point.source, env.rank)  # a job's checkpoint: this rank's part, read alone
    return point


def _resume_state(cfg: TrainConfig, run_dir: Path, env: DistEnv) -> ResumePoint | None:
    """Decide where the run starts. An explicit --resume (latest, or a path) insists on a checkpoint; a restarted
    attempt (Slurm requeue, torchrun restart, a Kubernetes pod with HPCTRAIN_AUTO_RESUME=1) resumes by itself, and
    starts from the beginning only if no save has ever finished. Neither starts over when every checkpoint there is
    damaged."""
    ckpt_dir = checkpoint_dir(run_dir)
    restarted = may_be_a_restart()
    if cfg.resume not in (None, "latest"):
        return explicit_resume(Path(cfg.resume))
    if cfg.resume is None and not restarted:
        if checkpoint.candidates(ckpt_dir):
            raise UserError(
                f"{run_dir} already holds checkpoints of an earlier run; pass --resume to continue "
                "it, or choose another --run-dir for a new run"
            )
        return None
    if not run_dir.exists():
        if not restarted and not cfg.fresh_if_missing:
            raise UserError(
                f"--resume: the run directory {run_dir} does not exist; {_earlier_default(cfg, run_dir)}"
                "check --run-dir (a typo?), or drop --resume to start a new run there"
            )
        return None  # a restarted attempt whose first one never got as far as creating the run directory
    found = checkpoint.search(ckpt_dir)
    if found.info is not None:
        return ResumePoint(found.state, found.info.path)
    if any(not rejected.unfinished for rejected in found.rejected):
        why = "this restarted attempt" if restarted and cfg.resume is None else "--resume"
        raise UserError(
            f"{why} found no usable checkpoint in {ckpt_dir}: {_list_rejected(found.rejected)}. "
            "Nothing was changed. Restore a good copy there, pass --resume PATH to a checkpoint "
            "elsewhere, or start over in a new --run-dir"
        )
    if env.rank == 0:
        log.info(f"no {'finished ' if found.rejected else ''}checkpoint in {ckpt_dir}: starting from the beginning")
    return ResumePoint(None, None) if found.rejected else None


def with_recorded_settings(cfg: TrainConfig, unset: set[str]) -> TrainConfig:
    """For --resume and --evaluate: `cfg` with the settings its checkpoint recorded in place of those the user left
    unset (`unset`: config field names), and the run directory it was found in. Unchanged where no usable checkpoint
    is found: the run's own checks then say why."""
    if cfg.resume is None:
        return cfg
    run_dir = Path(cfg.run_dir or default_run_dir(cfg))
    quiet = checkpoint.log.disabled  # the run itself reports damaged checkpoints, once
    checkpoint.log.disabled = True
    try:
        if cfg.resume == "latest":
            found = checkpoint.search(checkpoint_dir(run_dir))
            state, source = found.state, found.info.path if found.info is not None else None
        else:
            point = explicit_resume(Path(cfg.resume))
            state, source = point.state, point.source
    except UserError:
        return cfg
    finally:
        checkpoint.log.disabled = quiet
    saved = state.get("config") if isinstance(state, dict) else None
    if not isinstance(saved, dict):
        return cfg
    if state.get("format") == CHECKPOINT_FORMAT and all(key in state for key in TRAIN_STATE_KEYS):
        check_state(state, source)  # before anything starts, not when the loop restores it
    changes = {name: saved[name] for name in RECORDED_DEFAULTS if name in unset and name in saved}
    cfg = settings_with(cfg, changes, source, overridable=OVERRIDABLE)
    if cfg.resume == "latest" and cfg.run_dir is None:
        cfg = cfg.replace(run_dir=str(run_dir))
    return cfg


def _earlier_default(cfg: TrainConfig, run_dir: Path) -> str:
    """A hint when an older hpctrain's default run directory for these options holds the run."""
    earlier = Path(earlier_default_run_dir(cfg))
    if run_dir == Path(default_run_dir(cfg)) and earlier != run_dir and (earlier / CHECKPOINT_DIR).is_dir():
        return f"earlier hpctrain versions used {earlier} for this run: pass --run-dir {earlier}; else "
    return ""


def explicit_resume(path: Path) -> ResumePoint:
    """--resume PATH: a checkpoint file; or a run directory, a checkpoint directory or its `latest` pointer, which
    mean the newest valid checkpoint in it."""
    if path.is_file() and path.name == checkpoint.LATEST_POINTER:
        path = path.parent
    if not path.is_dir():
        return ResumePoint(checkpoint.load(path), path)
    ckpt_dir = path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path
    found = checkpoint.search(ckpt_dir)
    if found.info is not None:
        return ResumePoint(found.state, found.info.path)
    if not found.rejected:
        raise UserError(
            f"--resume {path}: there is no checkpoint in {ckpt_dir}; pass a run directory that holds "
            "checkpoints/, a checkpoint directory, or a checkpoint_*.pt file"
        )
    raise UserError(
        f"--resume {path} found no usable checkpoint in {ckpt_dir}: {_list_rejected(found.rejected)}. "
        "Restore a good copy, or pass another checkpoint"
    )


def _list_rejected(rejected: list[checkpoint.Rejected]) -> str:
    return "; ".join(f"{r.path.name} {r.reason}" for r in rejected)


def _check_resumable(cfg: TrainConfig, recipe: Recipe, state: dict[str, Any], source: Path | None) -> None:
    if state is None:
        return
    if state.get("format") != CHECKPOINT_FORMAT:
        raise UserError(
            f"{source} was not written by `hpctrain train` (no training position in it); "
            "load its weights in your own script with hpctrain.checkpoint.load"
        )
    missing = [key for key in TRAIN_STATE_KEYS if key not in state]
    if missing:
        raise UserError(
            f"{source} lacks {', '.join(map(repr, missing))}: it is not a complete `hpctrain train` "
            "checkpoint; resume from another checkpoint, or start a new --run-dir"
        )
    saved = state["config"]
    if not isinstance(saved, dict):
        raise UserError(
            f"{source}: its recorded settings are {brief(saved, 40)}, not settings; resume from another "
            "checkpoint, or start a new --run-dir"
        )
    check_state(state, source)
    check_types({k: saved[k] for k in RESUME_MUST_MATCH if k in saved}, source)
    changed = [k for k in RESUME_MUST_MATCH if saved.get(k) != getattr(cfg, k)]
    if changed:
        differences = "; ".join(
            f"{_flag(k)}: checkpoint {_shown(saved.get(k))}, now {_shown(getattr(cfg, k))}" for k in changed
        )
        original = " ".join(_as_option(k, saved.get(k)) for k in changed)
        raise UserError(
            f"cannot resume {source} with a different {differences}. Resume with the values it was made "
            f"with ({original}), or start a new --run-dir"
        )
    check_fits(cfg, recipe, state["model"], source, optimization=state)


def _flag(name: str) -> str:
    return "workload" if name == "workload" else "--" + name.replace("_", "-")


def _shown(value: Any) -> str:
    return "unset (the recipe's default)" if value is None else str(value)


def _as_option(name: str, value: Any) -> str:
    """How to ask for `value` again on the command line."""
    if name == "workload":
        return f"`train {value}`"
    if isinstance(value, bool):
        return _flag(name) if value else f"no {_flag(name)}"
    return f"no {_flag(name)}" if value is None else f"{_flag(name)} {value}"


def check_fits(
    cfg: TrainConfig,
    recipe: Recipe,
    weights: Any,
    source: Path | None,
    saved: dict[str, Any] | None = None,
    optimization: dict[str, Any] | None = None,
) -> None:
    """The checkpoint's weights must have the parameter names and shapes of the model `recipe` builds for `cfg`
    (checked on the meta device: nothing is allocated or initialized). `saved`: the checkpoint's config, to name the
    options it was made with. `optimization`: the checkpoint's whole state, whose optimizer and scheduler state must
    fit the optimization the recipe builds for that model (`state_fit`), before anything steps with them."""
    if not isinstance(weights, dict) or not all(isinstance(key, str) for key in weights):
        raise refused(source, "model", f"is {brief(weights, 40)}, not a model's weights (names and tensors)")
    shaped = recipe.for_config(cfg)
    with torch.device("meta"):
        model = shaped.build_model()
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in weights.items() if isinstance(v, torch.Tensor)}
    problems = [
        f"{k}: checkpoint {found[k]}, model {shape}"
        for k, shape in expected.items()
        if k in found and found[k] != shape
    ]
    problems += [f"{k} missing" for k in expected if k not in found]
    problems += [f"{k} unexpected" for k in found if k not in expected]
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        made_with = " ".join(
            _as_option(k, saved.get(k))
            for k in ("recipe", "arch")
            if saved and saved.get(k) is not None and saved.get(k) != getattr(cfg, k)
        )
        fix = f"use the options it was made with ({made_with})" if made_with else "use the --recipe it was made with"
        raise UserError(
            f"{source} holds a different model than {cfg.workload}/{cfg.recipe} builds ({shown}); "
            f"{fix}, or start a new --run-dir"
        )
    if optimization is not None:
        with torch.device("meta"):
            built = shaped.build_optimization(model, cfg.lr, cfg.epochs, 1)
        if found_problem := optimization_problem(optimization, built):
            raise refused(source, *found_problem)
