"""What the commands around the job (dev, tensorboard, top, debug stacks) share: the chosen scheduler's services
(hpctrain.schedulers.service_api.Services), the flags that say where a service job or pod runs and with which
software (hpctrain.schedulers.service_api.Placement), and how what a service's start returns is printed: each Step as
it happens (show_step) and how to reach it (access_lines). The backends return these and never print; the text
here passes hpctrain.safetext.for_terminal (a node's name and a job's state are what the cluster said)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from hpctrain.safetext import for_terminal

if TYPE_CHECKING:
    from hpctrain.schedulers.service_api import ServiceAccess, Step


def add_placement_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, wait_help: str) -> None:
    """The image a service job or pod (`dev start`, `tensorboard --on-cluster`) runs in and how long `start` waits
    for its server (`wait_help`); where it runs and with which other software are each backend's flags (role `dev`,
    `tensorboard`: BackendInfo.add_arguments)."""
    parser.add_argument(
        "--image", help="Slurm: an apptainer .sif or enroot .sqsh file; Kubernetes: the container image"
    )
    parser.add_argument("--wait", type=float, default=600.0, metavar="S", help=wait_help)


def placement_from_args(args: argparse.Namespace, role: str) -> Any:
    """The placement flags of a command's `role` (dev, tensorboard) as a Placement: the image, and every flag the
    backends declared for that role that was given, by dest (the chosen backend reads its own, refuses another's)."""
    from hpctrain.engine.scheduling import backend_flag_values
    from hpctrain.schedulers.service_api import Placement

    return Placement(image=args.image, options=backend_flag_values(args, role))


def services_of(args: argparse.Namespace, scheduler: str | None = None) -> Any:
    """The services of `scheduler` (default: the one --scheduler, $HPCTRAIN_SCHEDULER or this host picks), on the
    connection --namespace and --context name."""
    from hpctrain.engine.scheduling import choose_scheduler, get_backend

    return get_backend(args, scheduler or choose_scheduler(args)).services()


def show_step(step: Step) -> None:
    """A step of `dev start` or `tensorboard --on-cluster` as it happens, on stdout: what was submitted, then the
    job's states and what the server asks of the user, indented under it."""
    if step.kind == "state":
        text = f"  job {step.job}: {step.text}"
    elif step.kind == "prompt":
        text = f"  {step.text}"
    else:
        text = step.text
    print(for_terminal(text), flush=True)


def access_lines(access: ServiceAccess) -> list[str]:
    """How to reach a started service and stop it, as `tensorboard --on-cluster` prints it."""
    if access.endpoint is not None:
        where = f"is up on {access.endpoint.node}:{access.endpoint.port} (job {access.job})"
        head = f"\n{access.service} {where}. On your machine, open the tunnel:"
    else:
        head = f"{access.service} pod {access.job} created in namespace {access.namespace}. On your machine:"
    lines = [head, f"  {access.forward}", f"then open:\n  {access.url}", f"Stop it with: {access.stop}"]
    return [for_terminal(line, newlines=True) for line in lines]
