"""The built-in workloads as the command line needs to know them, without importing them (or torch): each one's
module, datasets and recipes, with every recipe's defaults and one-line description.

The recipe classes (recipes/mnist.py, recipes/imagenet.py) take their defaults and descriptions from here, so
`hpctrain train WORKLOAD --help` shows the numbers that training uses, and `hpctrain submit` validates a recipe's
name without loading its model code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hpctrain.training.workload import Defaults


@dataclass(frozen=True)
class RecipeInfo:
    description: str
    defaults: Defaults
    lr_note: str = ""
    """How the recipe uses --lr, for its help (e.g. "the SGD peak after warmup")."""


@dataclass(frozen=True)
class WorkloadInfo:
    module: str
    """The module whose RECIPES maps each recipe name to its Recipe (imported only to train or check data)."""
    datasets: tuple[str, ...]
    """The --dataset choices; the first is the default."""
    recipes: Mapping[str, RecipeInfo]
    image_folder: bool = False
    """Reads the image folder named by the positional DATA; otherwise a dataset `hpctrain download` fetched into
    --data-dir, whose files are checked without importing the recipe (hpctrain.recipes.check_data)."""
    lr_note: str = ""
    """How every recipe of the workload reads --lr, for its help."""


CATALOG: dict[str, WorkloadInfo] = {
    "mnist": WorkloadInfo(
        module="hpctrain.recipes.mnist",
        datasets=("mnist", "fashion-mnist"),
        recipes={
            "classic": RecipeInfo(
                "pytorch/examples MNIST tutorial: its CNN, Adadelta, StepLR",
                Defaults(epochs=14, batch_size=64, lr=1.0, test_batch_size=1000),
                lr_note="Adadelta, times 0.7 each epoch",
            ),
            "fast": RecipeInfo(
                "small BN CNN, bf16 where fast, SGD-Nesterov warmup/decay: ~90% Fashion-MNIST in one epoch",
                Defaults(epochs=1, batch_size=112, lr=0.15, test_batch_size=2000),
                lr_note="the SGD peak after warmup",
            ),
        },
    ),
    "imagenet": WorkloadInfo(
        module="hpctrain.recipes.imagenet",
        datasets=("imagenet",),
        recipes={
            "classic": RecipeInfo(
                "pytorch/examples imagenet: SGD 0.1, step /10 every 30 epochs, batch 256, 90 epochs",
                Defaults(epochs=90, batch_size=256, lr=0.1, test_batch_size=256),
                lr_note="divided by 10 every 30 epochs",
            ),
            "fast": RecipeInfo(
                "FFCV-style: label smoothing, no wd on norms, warmup + linear decay, 160->192 resizing, 16 epochs",
                Defaults(epochs=16, batch_size=1024, lr=0.5, test_batch_size=256),
                lr_note="the peak after warmup",
            ),
        },
        image_folder=True,
        lr_note="per 256 images: the rate used is lr x global batch / 256",
    ),
}
