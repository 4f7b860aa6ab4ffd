"""What the loop works with, built once per attempt: the data, the model wrapped for the strategy (DDP,
DataParallel or none), the optimization, and the process group of the per-step stop vote."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hpctrain.data.sampler import EpochPlan
from hpctrain.data.source import DataSource
from hpctrain.distributed.failures import collective
from hpctrain.training.graphed import EvalGraph, StepGraph
from hpctrain.training.run import Run
from hpctrain.training.stderr import drop_first_forward_stderr
from hpctrain.training.stopping import vote_group
from hpctrain.training.workload import Optimization

# What torch's DDP prints on every rank when find_unused_parameters finds none (see `wrap`: we set it on purpose).
UNUSED_PARAMETERS_WARNING = "find_unused_parameters=True was specified in DDP constructor"


@dataclass
class Parts:
    """What the loop works with, built once per attempt by `loop._build`."""

    data: DataSource
    plan: EpochPlan
    model: nn.Module  # the plain module: what checkpoints hold
    wrapped: nn.Module  # what trains: DDP/DataParallel around `model`, or `model` itself
    optimization: Optimization
    control: Any  # process group for the per-step stop vote (None: single process)
    generator: torch.Generator  # augmentation randomness, re-seeded every step
    step_graph: StepGraph | None = None  # the training step as a CUDA graph (hpctrain.training.graphed), if used
    eval_graph: EvalGraph | None = None  # the evaluation forward as a CUDA graph, if used


def wrap(model: nn.Module, run: Run) -> nn.Module:
    """What trains: `model` in DDP (several processes), in DataParallel (--strategy dp), or itself."""
    if run.strategy == "ddp" and run.env.is_distributed:
        with collective("DDP's start-up broadcast of the model", only_known=True):
            return _ddp(model, run)
    if run.strategy == "dp":
        return nn.DataParallel(model)
    return model


def _ddp(model: nn.Module, run: Run) -> nn.Module:
    if run.device.type == "cuda":
        return nn.parallel.DistributedDataParallel(model, device_ids=[run.device.index])
    # On CPU the resume contract is bitwise. DDP regroups its gradient buckets after the first step of every
    # process, and gloo's sum order depends on the grouping, so a resumed run's first step would reduce in a
    # different order than the uninterrupted run's. find_unused_parameters keeps the initial grouping for
    # good (at the cost of one autograd-graph walk per step, small next to a CPU step).
    wrapped = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    drop_first_forward_stderr(wrapped, UNUSED_PARAMETERS_WARNING)
    return wrapped


def control_group(run: Run) -> Any:
    """The per-step stop vote's group (a gloo one, so it never waits on the GPU stream), made here at setup, a
    point every rank passes, rather than at the first vote."""
    if not run.env.is_distributed:
        return None
    with collective("creating the stop vote's gloo group"):
        return vote_group()
