"""`hpctrain dev start|list|stop NAME`: an interactive JupyterLab (or sshd, or a VS Code tunnel) on a compute node,
or JupyterLab in a pod.

    hpctrain dev start explore --gpus-per-node 1 --cpus 8 --mem 32G --time 4:00:00 --venv ~/venvs/torch
    hpctrain dev list --idle-warn 1:00:00
    hpctrain dev stop explore
    hpctrain dev save explore ~/images/explore.sqsh

The chosen scheduler's services (Scheduler.services(): schedulers/<backend>/services.py) start, show and stop
sessions; what a session is, whatever the scheduler, is in hpctrain.servers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hpctrain.cli.service_lines import add_placement_arguments, placement_from_args, services_of, show_step
from hpctrain.engine.scheduling import add_connection_arguments, chosen_scheduler_help
from hpctrain.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    start = sub.add_parser("start", help="start a session and print how to reach it")
    start.add_argument("name", metavar="NAME", help="session name (lower-case letters, digits, -)")
    start.add_argument(
        "--service",
        choices=("jupyter", "ssh", "code"),
        default="jupyter",
        help="jupyter: JupyterLab with a random token (default); ssh: an sshd of your own, for ssh and "
        "VS Code Remote-SSH (Slurm only); code: a VS Code tunnel (`code tunnel`, which must be "
        "installed on the compute nodes; Slurm only)",
    )
    start.add_argument(
        "--ssh-key",
        type=Path,
        metavar="FILE.pub",
        help="--service ssh: the public key you will log in with, from the machine you connect from "
        "(default: the first of ~/.ssh/id_ed25519.pub, id_ecdsa.pub, id_rsa.pub here)",
    )
    start.add_argument("--port", type=int, help="the server's port (default: a free one on Slurm, 8888 in a pod)")
    start.add_argument("--cpus", type=int, default=2, help="CPUs (default: 2)")
    start.add_argument("--gpus-per-node", type=int, default=0, metavar="N", help="whole GPUs")
    start.add_argument("--mem", help="memory, e.g. 16G")
    start.add_argument("--time", default="04:00:00", help="time limit (default: 04:00:00); the session ends then")
    add_placement_arguments(
        start, wait_help="seconds to wait for the server to answer (default: 600; 0 on Kubernetes: do not wait)"
    )
    start.add_argument(
        "--local-port", type=int, help="port on your machine for the tunnel (default: the same as remote)"
    )
    start.add_argument("--dry-run", action="store_true", help="print the batch script or pod manifest; submit nothing")
    add_connection_arguments(start, role="dev", scheduler_help=chosen_scheduler_help("where the session runs"))

    listing = sub.add_parser("list", help="sessions, how long they have run, and which sit idle")
    listing.add_argument(
        "--idle-warn",
        default="1:00:00",
        metavar="TIME",
        help="warn about sessions idle longer than this, a time as --time takes it (30 minutes, 2:00:00, 1-0; "
        "default: 1:00:00)",
    )
    add_connection_arguments(
        listing,
        role="dev-sessions",
        scheduler_help="only the sessions started on this scheduler (default: every session, each "
        "asked through the scheduler it was started on)",
    )

    stop = sub.add_parser("stop", help="stop a session and free its node or pod")
    stop.add_argument("name", metavar="NAME")
    add_connection_arguments(
        stop,
        role="dev-sessions",
        scheduler_help="the scheduler the session was started on (default: the one recorded then; another is refused)",
    )

    saving = sub.add_parser("save", help="save a running session's environment as a new image, where the cluster can")
    saving.add_argument("name", metavar="NAME")
    saving.add_argument(
        "image",
        metavar="IMAGE",
        help="the new image: on Slurm a file (.sqsh for an enroot session, .sif for an apptainer sandbox); on "
        "Kubernetes REGISTRY/NAME:TAG, built and pushed by a build job",
    )
    saving.add_argument("--dry-run", action="store_true", help="print what would run or be submitted; save nothing")
    add_connection_arguments(
        saving,
        role="services",
        scheduler_help="the scheduler the session was started on (default: the one recorded then; another is refused)",
    )


def parse_duration_s(text: str, flag: str) -> int:
    from hpctrain.servers.sessions import parse_time_s

    return parse_time_s(text, flag)


def format_age(seconds: int | None) -> str:
    from hpctrain.jobs.values import format_duration

    return "-" if seconds is None else format_duration(seconds)


def config_from_args(args: argparse.Namespace) -> Any:
    """The session's neutral part; where it runs and with which software (a GPU type or shards among them) is the
    backend's, from the Placement."""
    from hpctrain.jobs.spec import Resources
    from hpctrain.jobs.values import parse_mem_bytes
    from hpctrain.servers.sessions import DevConfig

    resources = Resources(
        cpus_per_task=args.cpus,
        gpus_per_node=args.gpus_per_node,
        mem_bytes=None if args.mem is None else parse_mem_bytes(args.mem),
    )
    return DevConfig(
        name=args.name,
        service=args.service,
        resources=resources,
        time=args.time,
        port=args.port,
        ssh_key=args.ssh_key,
    )


def run(args: argparse.Namespace) -> int:
    return {"start": _start, "list": _list, "stop": _stop, "save": _save}[args.action](args)


def _start(args: argparse.Namespace) -> int:
    services = services_of(args)
    placement = placement_from_args(args, "dev")
    cfg = config_from_args(args)
    rendered = services.dev_render(cfg, placement)  # pure: what the backend refuses fails here, before anything is made
    if args.dry_run:
        print(rendered, end="")
        return 0
    from hpctrain.safetext import for_terminal
    from hpctrain.servers.sessions import starting

    with starting(cfg.name):  # one `dev start NAME` at a time: a second one is refused before it submits anything
        said = "\n".join(services.dev_start(cfg, placement, args.wait, args.local_port, show_step))
        print(for_terminal(said, newlines=True))  # the node's name and endpoint are what the job wrote
    return 0


def _list(args: argparse.Namespace) -> int:
    from hpctrain.cli.tables import plain_table
    from hpctrain.safetext import for_terminal
    from hpctrain.servers.sessions import idle_too_long, recorded

    idle_warn = parse_duration_s(args.idle_warn, "--idle-warn")
    backends: dict[str, Any] = {}
    sessions = []
    for state_dir, conn in recorded():
        scheduler = str(conn.get("scheduler"))
        if args.scheduler not in (None, scheduler):
            continue
        if scheduler not in backends:
            backends[scheduler] = services_of(args, scheduler)
        sessions.append(backends[scheduler].dev_view(state_dir, conn, probe=True))
    if not sessions:
        where = f" on {args.scheduler}" if args.scheduler else ""
        print(f"no dev sessions{where} (start one with `hpctrain dev start NAME`)")
        return 0
    rows = [("NAME", "SCHEDULER", "JOB/POD", "STATE", "AGE", "ENDPOINT", "IDLE")]
    warnings = []
    for s in sessions:
        rows.append(
            (s.name, s.scheduler, s.where, s.state, format_age(s.age_s), s.endpoint or "-", format_age(s.idle_s))
        )
        if idle_too_long(s, idle_warn):
            warnings.append(
                f"warning: {s.name} has been idle for {format_age(s.idle_s)} (no kernel or terminal activity) "
                f"while holding its resources: `{_stop_command(s)}`"
            )
        if s.ended:
            warnings.append(f"note: {s.name} has ended ({s.state}); `{_stop_command(s)}` forgets it")
    plain_table(rows)
    for w in warnings:
        print(for_terminal(w), file=sys.stderr if w.startswith("warning") else sys.stdout)
    return 0


def _stop_command(session: Any) -> str:
    """The `dev stop` the session recorded when it started (with the flags that found its cluster), if any."""
    return str(session.connection.get("stop") or f"hpctrain dev stop {session.name}")


def _recorded(args: argparse.Namespace) -> tuple[Path, dict[str, Any], Any]:
    """The session NAME's state folder, its connection record, and the services of the scheduler it runs on."""
    from hpctrain.servers.sessions import connection

    state_dir, conn = connection(args.name)
    if args.scheduler not in (None, str(conn.get("scheduler"))):
        raise UserError(
            f"dev session {args.name} runs on {conn.get('scheduler')}, not {args.scheduler}: drop "
            f"--scheduler ({args.action} finds the session's own)"
        )
    return state_dir, conn, services_of(args, str(conn.get("scheduler")))


def _stop(args: argparse.Namespace) -> int:
    state_dir, conn, services = _recorded(args)
    print(f"dev session {args.name}: {services.dev_stop(state_dir, conn)}")
    return 0


def _save(args: argparse.Namespace) -> int:
    from hpctrain.safetext import for_terminal

    state_dir, conn, services = _recorded(args)
    outcome = services.dev_save(state_dir, conn, args.image, args.dry_run)
    if outcome.kind == "steps":
        print(f"dev session {args.name} is not saved as an image; what to do instead:")
    for text in outcome.lines:
        print(for_terminal(text, newlines=True))
    return 0
