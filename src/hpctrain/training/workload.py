"""What the training loop asks of a workload: the `Recipe` protocol, its `Defaults` and its `Optimization`.

The loop never looks a recipe up: its caller (the CLI) picks one from `hpctrain.recipes`, shapes it for the run's
options (`Recipe.for_config`) and hands it over. `hpctrain.recipes.base.Recipe` implements this protocol, with
defaults for most of it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only: the recipe catalog (names and defaults) imports Defaults without torch
    import torch
    from torch import nn

    from hpctrain.config import TrainConfig
    from hpctrain.data.source import DataSource
    from hpctrain.training.precision import Precision


@dataclass(frozen=True)
class Defaults:
    """What a run takes from its recipe when the command line leaves it unset."""

    epochs: int
    batch_size: int
    """The global batch (split over all processes)."""
    lr: float
    test_batch_size: int


@dataclass
class Optimization:
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scheduler_interval: str  # "epoch" or "step": when the loop calls scheduler.step()
    scaler: Any = None  # a torch GradScaler where the recipe computes in float16 (set by the loop), else None


class Recipe(Protocol):
    """Data + model + optimization + defaults; the loop, checkpoints and distribution are the loop's."""

    @property
    def datasets(self) -> tuple[str, ...]:
        """The --dataset values this recipe trains on."""

    @property
    def defaults(self) -> Defaults: ...

    @property
    def reports_top5(self) -> bool:
        """Evaluation records top-5 accuracy too (many-class workloads)."""

    @property
    def keeps_best(self) -> bool:
        """Keep checkpoint_best.pt (the best test accuracy) beside the newest checkpoints."""

    @property
    def cudnn_benchmark(self) -> bool:
        """Let cuDNN time its algorithms on CUDA (see `hpctrain.training.setup.cudnn_benchmark`)."""

    @property
    def graphs_step(self) -> bool:
        """Capture the training step and evaluation forward as CUDA graphs on CUDA (`hpctrain.training.graphed`)."""

    def for_config(self, cfg: TrainConfig) -> Recipe:
        """The recipe as this run's options shape it (model architecture, image sizes)."""

    def resolved_options(self) -> dict[str, Any]:
        """Config fields the recipe fills in when the user left them unset (written to config.yaml)."""

    def data_source(self, cfg: TrainConfig, device: torch.device, env: Any) -> DataSource:
        """What the loop trains and evaluates on."""

    def build_model(self) -> nn.Module: ...

    def build_optimization(self, model: nn.Module, lr: float, epochs: int, steps_per_epoch: int) -> Optimization: ...

    def augment(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Per-batch training augmentation; randomness only from `generator` (seeded per step by the loop)."""

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        """Around forward and loss in training and evaluation (mixed precision)."""

    def precision(self, device: torch.device) -> Precision:
        """The floating-point type training computes in on `device` (float16 gets a gradient scaler)."""

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor: ...

    def predict(self, model: nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Logits for evaluation."""

    def describe_scaling(self, cfg: TrainConfig, world_size: int) -> str | None:
        """An extra start-up line (batch split, scaled learning rate), or None."""

    def warnings(self, cfg: TrainConfig, num_train: int, steps_per_epoch: int) -> list[str]:
        """Start-up warnings about settings that train badly on this much data."""
