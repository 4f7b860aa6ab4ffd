"""`hpctrain download`: fetch and verify a dataset ahead of the job, since compute nodes are often offline."""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from pathlib import Path

from hpctrain.cli.download_progress import reporter_for
from hpctrain.data.datasets import DATASETS, get_dataset_spec
from hpctrain.data.download import DEFAULT_MIN_RATE, download
from hpctrain.errors import UserError

EXIT_TERMINATED = 143  # 128 + SIGTERM, what a shell reports for a process ended by SIGTERM


class _Terminated(BaseException):
    """Raised in the main thread by the SIGTERM handler; a BaseException so no `except Exception` stops it
    before the download's `finally` blocks have removed their partial files."""


def _on_sigterm(signum, frame) -> None:
    raise _Terminated


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
        "--timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="network timeout per connection/read in seconds (default: 30)",
    )
    parser.add_argument(
        "--min-rate",
        type=float,
        default=DEFAULT_MIN_RATE,
        metavar="BYTES_PER_S",
        help="give up on a mirror that averages fewer bytes/s than this over --timeout seconds "
        f"(default: {DEFAULT_MIN_RATE:g}; 0: no minimum)",
    )


def run(args: argparse.Namespace) -> int:
    if not args.timeout > 0:  # also rejects nan
        raise UserError(f"--timeout {args.timeout:g}: must be a positive number of seconds, e.g. --timeout 60")
    if not (math.isfinite(args.min_rate) and args.min_rate >= 0):
        raise UserError(
            f"--min-rate {args.min_rate:g}: must be a number of bytes per second >= 0, e.g. --min-rate 1000"
        )
    spec = get_dataset_spec(args.dataset)
    data_dir = args.data_dir if args.data_dir is not None else default_data_dir()
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        reporter = reporter_for(spec.name, None)
        paths = download(spec, data_dir, args.mirror, reporter=reporter, timeout=args.timeout, min_rate=args.min_rate)
    except _Terminated:
        print("hpctrain download: terminated by SIGTERM; partial files removed", file=sys.stderr)
        return EXIT_TERMINATED
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"{spec.name}: {len(paths)} files verified in {paths[0].parent}")
    for path in paths:
        print(f"  {path.name}  ({path.stat().st_size:,} bytes)")
    return 0
