"""Built-in workloads, registered by name and imported only when used (an ImageNet recipe must not cost MNIST users)."""

from __future__ import annotations

import importlib

from hpctrain.errors import UserError
from hpctrain.recipes.base import Recipe

# workload -> module; the module's RECIPES maps variant name -> Recipe instance.
WORKLOADS = {"mnist": "hpctrain.recipes.mnist", "imagenet": "hpctrain.recipes.imagenet"}


def get_recipe(workload: str, variant: str) -> Recipe:
    if workload not in WORKLOADS:
        raise UserError(f"unknown workload {workload!r}; built-in workloads: {', '.join(WORKLOADS)}")
    variants = importlib.import_module(WORKLOADS[workload]).RECIPES
    if variant not in variants:
        raise UserError(f"unknown --recipe {variant!r} for {workload}; choose one of: {', '.join(variants)}")
    return variants[variant]


__all__ = ["Recipe", "WORKLOADS", "get_recipe"]
