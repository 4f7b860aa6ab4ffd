"""Built-in workloads, registered by name and imported only when used (an ImageNet recipe must not cost MNIST users).

Importing this package does not import torch: what the command line needs (names, defaults, descriptions) is in
`catalog`; `get_recipe` imports a workload's module, and `Recipe` (hpctrain.recipes.base) is loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hpctrain.errors import UserError
from hpctrain.recipes.catalog import CATALOG, Defaults, RecipeInfo, WorkloadInfo

if TYPE_CHECKING:
    from hpctrain.config import TrainConfig
    from hpctrain.recipes.base import Recipe

# workload -> module; the module's RECIPES maps variant name -> Recipe instance.
WORKLOADS: dict[str, str] = {name: info.module for name, info in CATALOG.items()}


def workload_info(workload: str) -> WorkloadInfo:
    if workload not in CATALOG:
        raise UserError(f"unknown workload {workload!r}; built-in workloads: {', '.join(CATALOG)}")
    return CATALOG[workload]


def recipe_info(workload: str, variant: str) -> RecipeInfo:
    """A recipe's defaults and description, without importing it; UserError naming the choices for an unknown one."""
    variants = workload_info(workload).recipes
    if variant not in variants:
        raise UserError(f"unknown --recipe {variant!r} for {workload}; choose one of: {', '.join(variants)}")
    return variants[variant]


SYNTHETIC_TRAIN_IMAGES = 1_281_167  # an epoch of --synthetic: recipes.imagenet.IMAGENET_TRAIN_IMAGES (imports torch)
# Training GFLOP per image at 224 px: torchvision's forward GFLOPS for the model, times 3 (forward and backward).
TRAIN_GFLOP_224 = {"resnet18": 5.5, "resnet34": 11.0, "resnet50": 12.3, "resnet101": 23.4, "resnet152": 34.7}
CPU_GFLOPS_PER_CORE = 50.0  # a generous rate for one core's share of a convolution's training step


def synthetic_cpu_warning(cfg: TrainConfig, cores: int, side: int | None = None) -> str | None:
    """For --synthetic on the CPU: how long one epoch takes (an estimate, from the model's arithmetic), when that is
    long; None otherwise."""
    if not getattr(cfg, "synthetic", False) or cfg.evaluate:
        return None
    images = cfg.train_limit or SYNTHETIC_TRAIN_IMAGES
    arch = cfg.arch or "resnet50"
    side = side or cfg.image_size or 224
    per_image = TRAIN_GFLOP_224.get(arch, TRAIN_GFLOP_224["resnet50"]) * (side / 224) ** 2
    seconds = images * per_image / (max(1, cores) * CPU_GFLOPS_PER_CORE)
    if seconds < 15 * 60:
        return None
    five_minutes = max(1, int(300 * max(1, cores) * CPU_GFLOPS_PER_CORE / per_image))
    return (
        f"--synthetic on the CPU: an epoch is {images:,} images of {arch} at {side} px, about {seconds / 3600:.1f} h "
        f"on {cores} core(s) (estimated at {CPU_GFLOPS_PER_CORE:g} GFLOP/s a core); cap it with --train-limit N "
        f"(about 5 minutes: --train-limit {five_minutes}), or train on GPUs"
    )


def get_recipe(workload: str, variant: str) -> Recipe:
    recipe_info(workload, variant)
    return importlib.import_module(WORKLOADS[workload]).RECIPES[variant]


def check_data(cfg: TrainConfig) -> None:
    """UserError unless the data `cfg` will read is there: for `hpctrain submit` and `check`, before the job
    queues (Recipe.check_data). A dataset `hpctrain download` fetched is checked without importing the recipe (and
    torch); an image folder by its recipe."""
    if not workload_info(cfg.workload).image_folder:
        from hpctrain.data import find_dataset_files, get_dataset_spec

        find_dataset_files(get_dataset_spec(cfg.dataset), cfg.data_dir)
        return
    get_recipe(cfg.workload, cfg.recipe).check_data(cfg)


def __getattr__(name: str) -> Any:
    """`from hpctrain.recipes import Recipe` loads hpctrain.recipes.base (and torch) only then."""
    if name == "Recipe":
        from hpctrain.recipes.base import Recipe

        return Recipe
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CATALOG",
    "Defaults",
    "Recipe",
    "RecipeInfo",
    "WORKLOADS",
    "WorkloadInfo",
    "check_data",
    "get_recipe",
    "recipe_info",
    "workload_info",
]
