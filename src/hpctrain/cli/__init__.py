"""Command-line entry point. Each subcommand lives in its own module, imported only when used."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from hpctrain import __version__
from hpctrain.errors import UserError, redact
from hpctrain.safetext import for_terminal
from hpctrain.recipes.catalog import CATALOG
from hpctrain.recipes.train_options import late_positionals, unrecognized

# name -> (module, one-line help). A module defines add_arguments(parser) and run(args) -> int.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "hpctrain.cli.train",
        f"train a built-in workload ({', '.join(CATALOG)}) with one of its recipes here: CPU, GPUs, or many processes",
    ),
    "download": (
        "hpctrain.cli.download",
        "fetch and verify a dataset before the job (compute nodes are often offline)",
    ),
    "prepare": (
        "hpctrain.cli.prepare",
        "pack image folders into verified tar shards for shared file systems (NFS, Lustre)",
    ),
    "submit": (
        "hpctrain.cli.submit",
        "render, check and submit a Slurm or Kubernetes job (a built-in workload, or any command after --)",
    ),
    "check": ("hpctrain.cli.check", "validate a job against the live cluster without submitting it"),
    "status": ("hpctrain.cli.status", "show jobs: state, pending reason, nodes, elapsed time, restarts"),
    "logs": ("hpctrain.cli.logs", "print (or follow) a job's output file(s)"),
    "cancel": ("hpctrain.cli.cancel", "cancel a job; training checkpoints before it stops"),
    "cluster": ("hpctrain.cli.cluster", "per-node table of state, CPUs, memory, GPUs and shards in use"),
    "debug": ("hpctrain.cli.debug", "rehearse trouble: `debug preempt JOB` sends the time-limit warning now"),
    "dev": (
        "hpctrain.cli.dev",
        "interactive JupyterLab, sshd or VS Code tunnel on a compute node, or JupyterLab in "
        "a pod: dev start|list|stop NAME",
    ),
    "tensorboard": (
        "hpctrain.cli.tensorboard",
        "TensorBoard on runs' tb/ folders, here or as a small job on the cluster",
    ),
    "image": ("hpctrain.cli.image", "pull a docker:// image once into an apptainer .sif or enroot .sqsh; list images"),
    "top": ("hpctrain.cli.top", "GPU use, CPU load and images/s of a running job, per node"),
    "env": ("hpctrain.cli.env", "print versions, GPUs and the detected distributed environment for bug reports"),
    # The other face, beside the CLI (imports nothing of it); needs the `web` extra.
    "web": ("hpctrain.web.command", "the web console: jobs, logs and the cluster in a browser, safe on a login node"),
}


DESCRIPTION = (
    "Train PyTorch models on shared clusters: the same job on a laptop CPU, GPUs and several nodes, started here, "
    "by torchrun, by srun or by a Kubeflow PyTorchJob; Slurm jobs checked before they queue, stopped jobs resumed "
    "exactly. `hpctrain COMMAND --help` explains a command."
)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with the arguments of subcommand `only` (None: none of them, which is all `hpctrain --help`
    needs; importing every subcommand module would cost seconds)."""
    parser = argparse.ArgumentParser(prog="hpctrain", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"hpctrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        sub_parser.set_defaults(parser_=sub_parser)  # so an unknown option is reported by the command's parser
        if only == name:
            importlib.import_module(module_name).add_arguments(sub_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = None
    try:
        # Import only the chosen subcommand's module: `hpctrain cluster` must not pay for importing torch.
        chosen = next((a for a in argv if not a.startswith("-")), None)
        parser = build_parser(only=chosen if chosen in SUBCOMMANDS else None)
        args, extras = parser.parse_known_args(argv)
        command = args.command
        from hpctrain.cli.terminal import install  # after parsing: `--help` stays cheap

        install(command)  # what the engine below logs (hpctrain.channel) shows here, as lines
        extras = late_positionals(args.parser_, args, extras)
        if extras:
            args.parser_.error(unrecognized(args.parser_, extras))
        del args.parser_
        module = importlib.import_module(SUBCOMMANDS[args.command][0])
        return int(module.run(args) or 0)
    except UserError as err:
        # A URL's password never shows; a name from outside in the message shows its escapes, never runs them.
        print(f"hpctrain {command}: error: {for_terminal(redact(str(err)), newlines=True)}", file=sys.stderr)
        return err.exit_code
    except ImportError as err:  # an optional dependency (hpctrain[k8s], [jupyter], [dali]) that is not installed
        from hpctrain.extras import missing_extra

        error = missing_extra(err)
        if error is None:
            raise
        print(f"hpctrain{' ' + command if command else ''}: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt as err:  # Ctrl-C at any point, start-up (imports, parsing) included: one line
        print(f"hpctrain{' ' + command if command else ''}: interrupted", file=sys.stderr)
        return getattr(err, "exit_code", 130)  # cli.owned.Interrupted: SIGTERM, SIGHUP
    except BrokenPipeError:  # `hpctrain env | head`: the reader has gone, as with any Unix tool
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 141
