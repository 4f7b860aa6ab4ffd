"""Evaluation: test loss and top-1/top-5 accuracy over the whole test set, shared among the ranks; and --evaluate,
which scores a checkpoint without training."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.nn import functional as F

from hpctrain.config import TrainConfig
from hpctrain.distributed import all_reduce, destroy_process_group, detect, init_process_group, resolve_device
from hpctrain.distributed.failures import announce, collective, peer_failures
from hpctrain.errors import UserError
from hpctrain.training.parts import Parts
from hpctrain.training.resume import check_fits, explicit_resume
from hpctrain.training.run import Run
from hpctrain.training.setup import check_dist_backend, resolve_config, resolve_strategy
from hpctrain.training.workload import Recipe


@torch.inference_mode()
def evaluate(run: Run, parts: Parts) -> dict[str, float]:
    """Test loss, top-1 and top-5 accuracy over the whole test set. Each rank scores its own share (every sample on
    exactly one rank; ranks may have different batch counts), then one all-reduce sums losses, hits and counts.
    Samples labelled below 0 (images skipped as unreadable) count nowhere."""
    # DataParallel spreads evaluation over the GPUs too; DDP's wrapper would only add hooks.
    model = parts.wrapped if run.strategy == "dp" else parts.model
    recipe = run.recipe
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=run.device)  # loss, top-1 hits, top-5 hits, samples
    batches = parts.data.eval_batches(run.env.world_size, run.env.rank, run.cfg.test_batch_size)
    for images, target in batches:
        output = parts.eval_graph(images) if parts.eval_graph is not None and model is parts.model else None
        if output is None:  # no graph, or a batch of another shape than the captured one
            with recipe.autocast(run.device):
                output = recipe.predict(model, images)
        output = output.float()
        sums[0] += F.cross_entropy(output, target, reduction="sum").double()
        sums[1] += (output.argmax(dim=1) == target).sum()
        top = output.topk(min(5, output.shape[1]), dim=1).indices
        sums[2] += (top == target.unsqueeze(1)).any(dim=1).sum()
        sums[3] += (target >= 0).sum()
    if run.env.is_distributed:
        with collective("evaluation's all-reduce"):
            all_reduce(sums)
    n = max(float(sums[3]), 1.0)
    return {
        "test_loss": float(sums[0]) / n,
        "test_accuracy": float(sums[1]) / n,
        "test_top5": float(sums[2]) / n,
        "test_images": int(sums[3]),
        "bad_images": list(getattr(batches, "bad_images", [])),
    }


def evaluate_checkpoint(cfg: TrainConfig, recipe: Recipe) -> dict[str, float]:
    """--evaluate: score the checkpoint --resume names (a file, or the newest in a run/checkpoint directory) on the
    evaluation set, on every process of the job; writes nothing. `recipe`: shaped for `cfg`."""
    cfg = resolve_config(cfg, recipe)
    if cfg.resume is None:
        raise UserError("--evaluate scores a checkpoint: pass --resume PATH (a checkpoint file or a run directory)")
    env = detect(init_method=cfg.dist_init_method)
    device = resolve_device(cfg.device, env)
    check_dist_backend(cfg, device)
    strategy = resolve_strategy(cfg.strategy, env, device)
    source = Path(cfg.run_dir) if cfg.resume == "latest" else Path(cfg.resume)
    point = explicit_resume(source)
    check_fits(cfg, recipe, point.state["model"], point.source, point.state.get("config"))
    run = Run(cfg, recipe, env, device, strategy, Path(cfg.run_dir), None)
    with run.stop:
        init_process_group(env, device, cfg.dist_timeout)
        announce(env)
        try:
            model = recipe.build_model().to(device)
            model.load_state_dict(point.state["model"])
            data = recipe.data_source(cfg, device, env)
            with peer_failures(env, cfg.dist_timeout):
                scores = evaluate(run, Parts(data, None, model, model, None, None, None))
        finally:
            destroy_process_group()
    top5 = f", top-5 {100 * scores['test_top5']:.2f}%" if recipe.reports_top5 else ""
    run.say(
        f"evaluated {point.source} on {scores['test_images']} images: loss {scores['test_loss']:.4f}, "
        f"top-1 {100 * scores['test_accuracy']:.2f}%{top5}"
    )
    return scores
