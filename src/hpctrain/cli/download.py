"""`hpctrain download`: fetch and verify a dataset ahead of the job, since compute nodes are often offline."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from hpctrain.data.datasets import DATASETS, get_dataset_spec
from hpctrain.data.download import download
from hpctrain.errors import UserError

DATA_DIR_ENV = "HPCTRAIN_DATA_DIR"


def default_data_dir() -> Path:
    return Path(os.environ.get(DATA_DIR_ENV) or "data")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", choices=list(DATASETS), help="dataset to fetch")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"directory that receives DATASET/ (default: ${DATA_DIR_ENV}, else ./data)",
    )
    parser.add_argument(
        "--mirror",
        action="append",
        metavar="URL",
        help="base URL (http://, https:// or file://) or local directory holding the .gz files; "
        "repeat to try several in order; replaces the built-in mirrors",
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, metavar="S", help="network timeout per connection/read in seconds (default: 30)"
    )


def run(args: argparse.Namespace) -> int:
    if not args.timeout > 0:  # also rejects nan
        raise UserError(f"--timeout {args.timeout:g}: must be a positive number of seconds, e.g. --timeout 60")
    spec = get_dataset_spec(args.dataset)
    data_dir = args.data_dir if args.data_dir is not None else default_data_dir()
    paths = download(spec, data_dir, args.mirror, timeout=args.timeout)
    print(f"{spec.name}: {len(paths)} files verified in {paths[0].parent}")
    for path in paths:
        print(f"  {path.name}  ({path.stat().st_size:,} bytes)")
    return 0
