r"""`hpctrain image pull|build|list`: container images converted once, on the login node, before any job.

    hpctrain image pull docker://nvcr.io/nvidia/pytorch:24.04-py3 --to ~/images          # .sif or .sqsh
    hpctrain image pull docker://pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime --to ~/images \
        --registry-mirror mirror.example.org
    hpctrain image build train.def --output ~/images/train.sif
    hpctrain image list ~/images
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    pull = sub.add_parser("pull", help="docker://REF -> DIR/NAME_TAG.sif (apptainer) or .sqsh (enroot)")
    pull.add_argument("ref", metavar="docker://REF")
    pull.add_argument("--to", type=Path, default=Path("."), metavar="DIR", help="folder for the image (default: here)")
    pull.add_argument("--output", type=Path, metavar="FILE", help="exact file name instead of DIR/NAME_TAG.FORMAT")
    pull.add_argument(
        "--format", choices=("sif", "sqsh"), help="sif (apptainer) or sqsh (enroot); default: what is installed"
    )
    pull.add_argument(
        "--registry-mirror", metavar="HOST", help="pull Docker Hub images through this mirror (HOST[:PORT])"
    )
    pull.add_argument("--force", action="store_true", help="run even inside a Slurm job allocation")
    build = sub.add_parser("build", help="apptainer build FILE.sif from a definition file (or a docker:// reference)")
    build.add_argument("definition", metavar="DEF")
    build.add_argument("--output", type=Path, required=True, metavar="FILE.sif")
    build.add_argument("--fakeroot", action="store_true", help="pass --fakeroot to apptainer build (no root needed)")
    build.add_argument("--force", action="store_true", help="run even inside a Slurm job allocation")
    listing = sub.add_parser("list", help="images in a folder: format, size, valid or not")
    listing.add_argument("directory", type=Path, metavar="DIR", nargs="?", default=Path("."))


def run(args: argparse.Namespace) -> int:
    from hpctrain import images
    from hpctrain.errors import UserError
    from hpctrain.fsutil import format_bytes
    from hpctrain.safetext import for_terminal

    if args.action == "list":
        found = images.list_images(args.directory)
        if not found:
            print(f"no .sif or .sqsh images in {args.directory}")
            return 0
        for img in found:
            state = img.fmt or "NOT A VALID IMAGE (remove it and pull again)"
            when = f"{img.modified:%Y-%m-%d %H:%M}" if img.modified else "(no valid date)"
            print(f"{for_terminal(img.path.name):40s}  {format_bytes(img.size):>10s}  {when:16s}  {state}")
        return 0
    images.refuse_in_allocation(args.force)
    if args.action == "build":
        if args.definition.startswith("docker://"):
            images.parse_ref(args.definition)
        elif not Path(args.definition).is_file():
            raise UserError(
                f"definition file {args.definition} not found: give an apptainer .def file or a docker:// reference"
            )
        result = images.build(args.definition, args.output, args.fakeroot)
        print(f"built {result.path} ({format_bytes(result.size)}); use it with --image {result.path}")
        return 0
    ref = images.parse_ref(args.ref)
    if args.registry_mirror:
        ref = images.with_mirror(ref, args.registry_mirror)
        print(f"through the mirror: {ref.docker_uri()}")
    fmt = images.choose_format(args.format)
    if args.output is not None and args.output.suffix != f".{fmt}":
        raise UserError(f"--output {args.output}: a {fmt} image needs a name ending in .{fmt}")
    result = images.pull(ref, args.to, fmt, output=args.output)
    if result.skipped:
        print(f"{result.path} is already there and valid ({format_bytes(result.size)}); nothing to pull")
    else:
        print(f"pulled {result.path} ({format_bytes(result.size)})")
    print(f"use it with: hpctrain submit --image {shlex.quote(str(result.path))} ...")
    return 0
