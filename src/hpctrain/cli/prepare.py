"""`hpctrain prepare imagenet SRC OUT`: pack image folders into large tar shards for shared file systems.

Training then reads OUT directly (`hpctrain train imagenet OUT`). The format, resuming and verification are
described in `hpctrain.data.shards`. `--max-side` (default 320) stores every image with its shorter side at most
that many pixels: the evaluation geometry of both recipes (resize to 256, centre 224) and FFCV's test resolution
(256, from a 292 resize) then never upsample, RandomResizedCrop's 224 crops lose no detail worth having, and the
large photos that dominate decode time and bytes shrink. Images already small enough are stored byte for byte.
`--keep-size` stores every file as it is (training then sees exactly the folders' pixels). `--format raw` stores
decoded RGB pixels instead (binary PPM members, FFCV's approach): no decoding at training time, at several times
the disk space (3 bytes a pixel: about 400 KiB per 4:3 image at the default --max-side 320, 196 KiB at 224,
100 KiB at 160); the output says the size per image.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from hpctrain.errors import UserError
from hpctrain.fsutil import format_bytes

EXIT_TERMINATED = 143  # 128 + SIGTERM
# hpctrain.data.shards' DEFAULT_MAX_SIDE and DEFAULT_JPEG_QUALITY, repeated so that `prepare --help` does not import
# the shard writer (and, through its decoder, torch); tests/test_cli_torch_free.py checks that they agree.
DEFAULT_MAX_SIDE, DEFAULT_JPEG_QUALITY = 320, 95
STORED_FORMATS = ("jpeg", "raw")  # hpctrain.data.shards.writer's, repeated for the same reason


class _Terminated(BaseException):
    """Raised by the SIGTERM handler, so the unfinished shard is removed on the way out (a BaseException: no
    `except Exception` stops it)."""


def _on_sigterm(signum, frame) -> None:
    raise _Terminated


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dataset",
        choices=["imagenet"],
        help="what SRC holds: imagenet (any image folders in the layouts `hpctrain train imagenet` reads)",
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="SRC OUT",
        help="SRC: the image folder (SRC/train/<class>/*, "
        "SRC/val/<class>/* or --val-path); OUT: the new directory of shards (with --verify: OUT only)",
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--max-side",
        type=int,
        default=DEFAULT_MAX_SIDE,
        metavar="N",
        help=f"limit the SHORTER side (default {DEFAULT_MAX_SIDE}): an image whose shorter side exceeds "
        "N pixels is scaled down to a shorter side of N, keeping its aspect ratio (its longer side may "
        "stay above N). JPEGs and PNGs within N are stored byte for byte; every other image is "
        "re-encoded (JPEG at --jpeg-quality, other formats as PNG)",
    )
    size.add_argument("--keep-size", action="store_true", help="store every image file as it is")
    parser.add_argument(
        "--format",
        choices=STORED_FORMATS,
        default="jpeg",
        help="how images are stored: jpeg (default; JPEGs and PNGs as they are or re-encoded, decoded at every "
        "read) or raw (decoded RGB pixels, shorter side at most --max-side: nothing to decode when training, "
        "3 bytes a pixel on disk, e.g. about 196 KiB per 4:3 image at --max-side 224)",
    )
    parser.add_argument(
        "--jpeg-quality",
        type=int,
        default=DEFAULT_JPEG_QUALITY,
        metavar="Q",
        help=f"quality of re-encoded (shrunk) JPEGs (default {DEFAULT_JPEG_QUALITY})",
    )
    parser.add_argument(
        "--shard-size", default="1GB", metavar="SIZE", help="largest shard file, e.g. 1GB (default), 500MB, 256MiB"
    )
    parser.add_argument("--val-path", metavar="DIR", help="validation images, if not SRC/val")
    parser.add_argument(
        "--val-labels",
        metavar="FILE",
        help="labels of a flat validation folder: LOC_val_solution.csv or `file label` lines",
    )
    parser.add_argument(
        "--skip-bad-images",
        action="store_true",
        help="leave out (and count) images that cannot be decoded instead of stopping at the first one",
    )
    parser.add_argument(
        "--workers", "-j", type=int, metavar="N", help="encoding processes (default: the cores this process may use)"
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="only check an existing OUT against its index "
        "(checksums, offsets): `hpctrain prepare imagenet --verify OUT`",
    )


def run(args: argparse.Namespace) -> int:
    from hpctrain.data import shards

    if args.verify:
        if len(args.paths) != 1:
            raise UserError("--verify takes only OUT: hpctrain prepare imagenet --verify OUT")
        with _Progress() as progress:
            checked = shards.verify(Path(args.paths[0]), progress)
        print(f"{args.paths[0]}: {checked} samples verified (sizes, sha256 checksums, offsets)")
        return 0
    if len(args.paths) != 2:
        raise UserError("give SRC and OUT: hpctrain prepare imagenet SRC OUT (or --verify OUT)")
    src, out = (Path(p) for p in args.paths)
    if args.workers is not None:
        from hpctrain.distributed.cores import check_worker_count

        check_worker_count("--workers", args.workers)
    cfg = shards.PrepareConfig(
        src=src,
        out=out,
        max_side=None if args.keep_size else args.max_side,
        jpeg_quality=args.jpeg_quality,
        shard_size=shards.parse_size(args.shard_size),
        val_path=Path(args.val_path) if args.val_path else None,
        val_labels=Path(args.val_labels) if args.val_labels else None,
        skip_bad_images=args.skip_bad_images,
        workers=args.workers if args.workers is not None else _cores(),
        format=args.format,
    )
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        with _Progress() as progress:
            index = shards.prepare(cfg, progress)
    except _Terminated:
        print(
            "hpctrain prepare: terminated by SIGTERM; the complete shards are kept, rerun the same command to continue",
            file=sys.stderr,
        )
        return EXIT_TERMINATED
    finally:
        signal.signal(signal.SIGTERM, previous)
    for split, entry in index["splits"].items():
        total = sum(shard["bytes"] for shard in entry["shards"])
        count = len(entry["samples"]["label"])
        print(
            f"{split}: {count} images in {len(entry['shards'])} shard(s), {format_bytes(total)}, "
            f"{format_bytes(total // max(count, 1))} per image, verified"
        )
        if entry["skipped"]:
            shown = ", ".join(_printable(name) for name in entry["skipped"][:5])
            print(
                f"  skipped {len(entry['skipped'])} unreadable image(s): {shown}"
                f"{' ...' if len(entry['skipped']) > 5 else ''}"
            )
    print(f"train from it with: hpctrain train imagenet {out}")
    return 0


def _printable(name: str) -> str:
    """A file name for the terminal: bytes that are not UTF-8 (kept by Python as surrogates) shown as \\xNN."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _cores() -> int:
    from hpctrain.distributed.cores import available_cores

    return available_cores()


class _Progress:
    """A rich progress bar per split on a terminal (stderr); a line per split otherwise."""

    def __enter__(self) -> _Progress:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        console = Console(stderr=True)
        self.interactive = console.is_terminal
        self.bar = Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=not self.interactive,
        )
        self.task = None
        self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()

    def start(self, split: str, total: int, done: int) -> None:
        self.task = self.bar.add_task(split, total=total, completed=done)
        if not self.interactive:
            kept = f" ({done} already in complete shards)" if done else ""
            print(f"{split}: {total} images{kept}", file=sys.stderr)

    def advance(self, n: int) -> None:
        if self.task is not None:
            self.bar.update(self.task, advance=n)

    def note(self, message: str) -> None:
        from rich.text import Text

        if self.interactive:
            self.bar.console.print(Text(message))
        else:
            print(message, file=sys.stderr)
