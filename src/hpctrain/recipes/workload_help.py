"""The help of `hpctrain train` options that depend on the workload (its datasets, recipes and their defaults,
from hpctrain.recipes.catalog): every workload's in `train --help`, one workload's in `train WORKLOAD --help`."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from hpctrain.config import DEFAULT_RECIPE
from hpctrain.recipes import CATALOG, RecipeInfo


class WorkloadAction(argparse.Action):
    """The WORKLOAD positional, which also tailors the help of the options that depend on it: `train imagenet
    --help` shows imagenet's datasets and recipe defaults (`train --help`, every workload's)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        texts = workload_help([str(values)])
        for action in parser._actions:
            if action.dest in texts:
                action.help = texts[action.dest]


def workload_help(workloads: list[str]) -> dict[str, str]:
    """The help of the options whose meaning or defaults depend on the workload (argparse dest -> text), for one
    workload or, with several, for each of them."""
    one = workloads[0] if len(workloads) == 1 else None

    def defaults(value: Callable[[RecipeInfo], str]) -> str:
        """`fast: 1, classic: 14` for one workload; `mnist fast: 1, classic: 14; imagenet ...` for several."""
        listed = [(w, ", ".join(f"{name}: {value(info)}" for name, info in _recipes(w))) for w in workloads]
        return listed[0][1] if one else "; ".join(f"{w} {text}" for w, text in listed)

    def lr(info: RecipeInfo) -> str:
        return f"{info.defaults.lr}" + (f" ({info.lr_note})" if one and info.lr_note else "")

    lr_note = f"; {CATALOG[one].lr_note}" if one and CATALOG[one].lr_note else ""
    texts = {
        "data": _data_help(one),
        "dataset": "; ".join(f"{'' if one else w + ': '}{_dataset_help(w)}" for w in workloads),
        "data_dir": _data_dir_help(one),
        "recipe": _recipe_help(workloads),
        "epochs": f"passes over the training set ({defaults(lambda i: str(i.defaults.epochs))})",
        "batch_size": "the GLOBAL batch, split over all processes (not per process, unlike some scripts' -b); "
        + defaults(lambda i: str(i.defaults.batch_size)),
        "test_batch_size": "images per evaluation batch; changes speed and memory, not results "
        f"({defaults(lambda i: str(i.defaults.test_batch_size))})",
        "lr": f"learning rate, above 0 and at most 1000 ({defaults(lr)}){lr_note}",
        "resume": _resume_help(one),
    }
    return {dest: text.replace("%", "%%") for dest, text in texts.items()}  # argparse expands %(...)s in help


def _recipe_help(workloads: list[str]) -> str:
    if len(workloads) == 1:
        return " or ".join(
            f"{name} ({'the default: ' if name == DEFAULT_RECIPE else ''}{info.description})"
            for name, info in _recipes(workloads[0])
        )
    listed = "; ".join(f"{w}: {', '.join(name for name, _ in _recipes(w))}" for w in workloads)
    return (
        f"{DEFAULT_RECIPE} (the default) or another of the workload's recipes ({listed}); `hpctrain train "
        "WORKLOAD --help` describes them"
    )


def _resume_help(workload: str | None) -> str:
    text = (
        "continue from the newest valid checkpoint in the run dir, or from PATH: a checkpoint file, a checkpoints "
        "folder or a run directory"
    )
    readers = [w for w, info in CATALOG.items() if info.image_folder and workload in (None, w)]
    if not readers:
        return text
    return (
        f"{text}. For {', '.join(readers)}, while DATA is missing (no --data-dir, "
        "no --synthetic), a PATH that names no checkpoint (no file, no *.pt or `latest`, no folder holding "
        "checkpoints) is DATA: `--resume DATA` resumes the newest checkpoint"
    )


def _recipes(workload: str) -> list[tuple[str, RecipeInfo]]:
    """The workload's recipes, the default first."""
    return sorted(CATALOG[workload].recipes.items(), key=lambda item: item[0] != DEFAULT_RECIPE)


def _dataset_help(workload: str) -> str:
    datasets = CATALOG[workload].datasets
    if len(datasets) == 1:
        return f"{datasets[0]}, the only one" + (" (its images are DATA)" if CATALOG[workload].image_folder else "")
    return f"{' or '.join(datasets)} (default: {datasets[0]})"


def _data_help(workload: str | None) -> str:
    folder = "the image folder (DATA/train/<class>/*, DATA/val/<class>/*), or a directory `hpctrain prepare` wrote"
    if workload is None:
        readers = [w for w, info in CATALOG.items() if info.image_folder]
        others = [w for w, info in CATALOG.items() if not info.image_folder]
        return f"{', '.join(readers)}: {folder}; {', '.join(others)}: none (--data-dir instead)"
    return folder if CATALOG[workload].image_folder else f"none: {workload} reads --data-dir"


def _data_dir_help(workload: str | None) -> str:
    downloaded = (
        "directory holding DATASET/ as `hpctrain download` leaves it (default: $HPCTRAIN_DATA_DIR, else ./data)"
    )
    if workload is None:
        return downloaded + "; for a workload that reads DATA, the same as DATA"
    return "the same as DATA (give one of the two)" if CATALOG[workload].image_folder else downloaded
