"""Datasets: specs with published checksums, verified downloads, and fast IDX loading.

Importing this package does not import torch; only read_idx/load_dataset do, when called.
"""

from hpctrain.data.datasets import DATASETS, ROLES, DatasetSpec, FileSpec, get_dataset_spec
from hpctrain.data.download import check_file, download, normalize_mirror
from hpctrain.data.idx import read_idx
from hpctrain.data.idx_dataset import find_dataset_files, load_dataset

__all__ = [
    "DATASETS",
    "ROLES",
    "DatasetSpec",
    "FileSpec",
    "check_file",
    "download",
    "find_dataset_files",
    "get_dataset_spec",
    "load_dataset",
    "normalize_mirror",
    "read_idx",
]
