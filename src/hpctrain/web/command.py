"""`hpctrain web [--port N [--host ADDR] | --socket PATH] [--scheduler NAME]... [--all-users] [--context NAME]`: the
web console.

Registered among the CLI's subcommands by module name (hpctrain.cli.SUBCOMMANDS); imports nothing of the CLI.
Needs the `web` extra (Starlette, uvicorn, Jinja2): without it, the CLI says in one line how to install it.
Serves every scheduler found here (hpctrain.schedulers.available), or those named by --scheduler, until Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys

from hpctrain.errors import UserError
from hpctrain.engine import scheduling
from hpctrain.schedulers import SCHEDULERS, backend_info

GRACE_S = 3.0  # Ctrl-C: what open pages get to finish before the console stops


def add_arguments(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("where the console listens (default: a Unix socket only you can reach)")
    where.add_argument(
        "--socket",
        metavar="PATH",
        help="the Unix socket (default: $XDG_RUNTIME_DIR/hpctrain-web/console-PID.sock, else under "
        "~/.hpctrain/web/); its directory must be yours, mode 0700",
    )
    where.add_argument("--port", type=int, metavar="N", help="listen on 127.0.0.1:N instead of a Unix socket")
    where.add_argument(
        "--host", metavar="ADDR", help="with --port: another loopback address (::1); any other address is refused"
    )
    parser.add_argument(
        "--scheduler",
        action="append",
        choices=tuple(SCHEDULERS),
        help="show this scheduler's jobs (repeat for several; default: every scheduler found here)",
    )
    # Each scheduler's own flags of `hpctrain status` (where the jobs are, whose jobs: Slurm's --all-users).
    where_jobs = parser.add_argument_group("where the jobs are (each scheduler's own flags, as for `hpctrain status`)")
    for name in SCHEDULERS:
        scheduling.backend_info(name).add_arguments(parser, where_jobs, "status")
    parser.add_argument(
        "--interval",
        type=float,
        default=5.0,
        metavar="S",
        help="ask the schedulers for the jobs at most once every S seconds, for all open pages (default: 5)",
    )


def address(args: argparse.Namespace):
    from hpctrain.web import listen

    if args.port is not None:
        if args.socket is not None:
            raise UserError("--socket and --port both given: choose one")
        if not 1 <= args.port <= 65535:
            raise UserError(f"--port {args.port} is out of range: give a port from 1 to 65535 (above 1023 unless root)")
        return listen.Address(host=listen.check_loopback(args.host or "127.0.0.1"), port=args.port)
    if args.host is not None:
        raise UserError("--host needs --port (without it, the console listens on a Unix socket)")
    from pathlib import Path

    return listen.socket_address(None if args.socket is None else Path(args.socket))


def schedulers(names: list[str] | None, args: argparse.Namespace | None = None) -> dict:
    """name -> the backend, or the UserError that says why it cannot be used (shown in its section). Each is built
    with its own connection flags from `args` (a Kubernetes --context and --namespace), as the CLI builds it."""
    from hpctrain.extras import missing_extra
    from hpctrain.schedulers import available, detect, get_scheduler

    names = names or available() or [detect()]  # none found: detect's error, which says what was looked for
    found: dict = {}
    for name in dict.fromkeys(names):
        try:
            found[name] = get_scheduler(name, context=getattr(args, "context", None), **connection(args, name))
        except UserError as err:
            found[name] = err
        except ImportError as err:
            found[name] = missing_extra(err) or UserError(f"{name}: {err}")
    return found


def connection(args: argparse.Namespace | None, name: str) -> dict:
    """The backend's create() keywords for where its jobs are, from the flags it declares (BackendInfo)."""
    fields = backend_info(name).connection_fields
    return {key: getattr(args, dest) for dest, key in fields.items() if getattr(args, dest, None) is not None}


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise UserError(f"--interval {args.interval} must be a positive number of seconds")
    import uvicorn  # the `web` extra: without it the CLI names the install command

    from hpctrain.web import listen
    from hpctrain.web.app import create_app
    from hpctrain.web.guard import Secrets

    where = address(args)
    app = create_app(
        schedulers(args.scheduler, args),
        Secrets(listen.new_token()),
        args.interval,
        all_users=getattr(args, "all_users", False),
    )
    sock = listen.bind(where)
    try:
        for text in listen.how_to_reach(where, app.state.console.keys.token):
            print(text, flush=True)
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,  # a request's line would show the token
            server_header=False,
            proxy_headers=False,
            lifespan="off",
            timeout_graceful_shutdown=GRACE_S,  # a page following a log keeps its request open until the job ends
        )
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
        if where.socket_path is not None:
            where.socket_path.unlink(missing_ok=True)
    print("hpctrain web: stopped", file=sys.stderr)
    return 0
