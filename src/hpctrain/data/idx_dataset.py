"""A downloaded IDX dataset on disk (MNIST's four files): finding its files and loading them as tensors.

The files may be the published .gz archives or uncompressed copies, in DATA_DIR/<name>/, DATA_DIR itself, or
torchvision's DATA_DIR/<folder>/raw/. torch is imported only when a dataset is loaded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.data.datasets import DatasetSpec, get_dataset_spec
from hpctrain.data.idx import read_idx
from hpctrain.errors import UserError

if TYPE_CHECKING:
    import torch


def _candidate_dirs(spec: DatasetSpec, data_dir: Path) -> list[Path]:
    dirs = [data_dir / spec.name, data_dir]
    if spec.torchvision_folder:
        dirs.append(data_dir / spec.torchvision_folder / "raw")
    return dirs


def find_dataset_files(spec: DatasetSpec, data_dir: os.PathLike | str) -> dict[str, Path]:
    """Locate the four files: the first candidate directory holding all of them (.gz or not) wins."""
    data_dir = Path(data_dir)
    partial: list[str] = []
    for directory in _candidate_dirs(spec, data_dir):
        found: dict[str, Path] = {}
        for role, fspec in spec.files.items():
            for path in (directory / fspec.archive_name, directory / fspec.name):
                if path.is_file():
                    found[role] = path
                    break
        if len(found) == len(spec.files):
            return found
        if found:
            missing = [spec.files[r].archive_name for r in spec.files if r not in found]
            partial.append(f"{directory}/ lacks {', '.join(missing)}")
    looked = ", ".join(f"{d}/" for d in _candidate_dirs(spec, data_dir))
    detail = f" ({'; '.join(partial)})" if partial else ""
    raise UserError(
        f"dataset {spec.name} not found in {looked}{detail}; "
        f"run `hpctrain download {spec.name} --data-dir {data_dir}` first "
        "(on a login node if compute nodes are offline)"
    )


def load_dataset(name: str | DatasetSpec, data_dir: os.PathLike | str) -> dict[str, torch.Tensor]:
    """Load train/test images (uint8, N x H x W) and labels (int64, N) as tensors, without copying per sample."""
    import torch

    spec = name if isinstance(name, DatasetSpec) else get_dataset_spec(name)
    files = find_dataset_files(spec, data_dir)
    tensors = {role: read_idx(path) for role, path in files.items()}
    for split in ("train", "test"):
        images, labels = tensors[f"{split}_images"], tensors[f"{split}_labels"]
        images_path, labels_path = files[f"{split}_images"], files[f"{split}_labels"]
        if images.dim() != 3 or labels.dim() != 1:
            raise UserError(
                f"{images_path} / {labels_path}: expected N x H x W images and N labels, got shapes "
                f"{tuple(images.shape)} and {tuple(labels.shape)}; re-run `hpctrain download {spec.name}`"
            )
        if images.shape[0] != labels.shape[0]:
            raise UserError(
                f"{images_path} has {images.shape[0]} images but {labels_path} has {labels.shape[0]} labels; "
                f"the files do not belong together: re-run `hpctrain download {spec.name}`"
            )
        tensors[f"{split}_labels"] = labels.to(torch.int64)
    return tensors
