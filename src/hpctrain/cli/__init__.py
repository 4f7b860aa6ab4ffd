"""Command-line entry point. Each subcommand lives in its own module, imported only when used."""

from __future__ import annotations

import argparse
import importlib
import sys

from hpctrain import __version__
from hpctrain.errors import UserError

# name -> (module, one-line help). A module defines add_arguments(parser) and run(args) -> int.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("hpctrain.cli.train", "train a built-in recipe (mnist) here: CPU, GPUs, or many processes"),
    "download": ("hpctrain.cli.download", "fetch and verify a dataset before the job (compute nodes are often offline)"),
    "submit": ("hpctrain.cli.submit", "render, check and submit a Slurm job (a built-in recipe, or any command after --)"),
    "check": ("hpctrain.cli.check", "validate a job against the live cluster without submitting it"),
    "status": ("hpctrain.cli.status", "show jobs: state, pending reason, nodes, elapsed time, restarts"),
    "logs": ("hpctrain.cli.logs", "print (or follow) a job's output file(s)"),
    "cancel": ("hpctrain.cli.cancel", "cancel a job; training checkpoints before it stops"),
    "cluster": ("hpctrain.cli.cluster", "per-node table of state, CPUs, memory, GPUs and shards in use"),
    "debug": ("hpctrain.cli.debug", "rehearse trouble: `debug preempt JOB` sends the time-limit warning now"),
    "dev": ("hpctrain.cli.dev", "interactive JupyterLab or sshd on a compute node or pod: dev start|list|stop NAME"),
    "tensorboard": ("hpctrain.cli.tensorboard", "TensorBoard on runs' tb/ folders, here or as a small job on the cluster"),
    "image": ("hpctrain.cli.image", "pull a docker:// image once into an apptainer .sif or enroot .sqsh; list images"),
    "top": ("hpctrain.cli.top", "GPU use, CPU load and images/s of a running job, per node"),
    "env": ("hpctrain.cli.env", "print versions, GPUs and the detected distributed environment for bug reports"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpctrain", description=__doc__)
    parser.add_argument("--version", action="version", version=f"hpctrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if only is None or only == name:
            importlib.import_module(module_name).add_arguments(sub_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Import only the chosen subcommand's module: `hpctrain cluster` must not pay for importing torch.
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=chosen if chosen in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    try:
        return int(module.run(args) or 0)
    except UserError as err:
        print(f"hpctrain {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"hpctrain {args.command}: interrupted", file=sys.stderr)
        return 130
