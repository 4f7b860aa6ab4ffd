"""`detect()`: this process's rank, world and rendezvous, from the launcher probes and `--dist-init-method`.

"auto" asks the probes (hpctrain.distributed.probes) in their order; "env" reads RANK/WORLD_SIZE/MASTER_ADDR/
MASTER_PORT; "slurm" insists on an srun task; "tcp://HOST:PORT" and "file:///PATH" take rank and world size from
the launcher but meet at the given URL. The result is then checked: a world of more than one process needs a
rendezvous that can work (never a guessed localhost). Pure: a function of the mapping it is given.
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
from collections.abc import Mapping

from hpctrain.distributed.environment import DistEnv, Vars
from hpctrain.distributed.probes import PROBES, Probe, SlurmProbe, per_node, torchrun_style
from hpctrain.errors import UserError

__all__ = ["INIT_METHOD_FORMS", "detect", "parse_tcp_url"]

INIT_METHOD_FORMS = "env, slurm, tcp://HOST:PORT or file:///shared/path"


def detect(environ: Mapping[str, str] | None = None, init_method: str | None = None) -> DistEnv:
    """Work out this process's rank, world and rendezvous; raise UserError (naming the fix) on inconsistencies.

    `init_method` is `--dist-init-method`: None or "auto" probes the launchers in order; "env" reads
    RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT; "slurm" insists on an srun task; "tcp://HOST:PORT" and
    "file:///PATH" take rank and world size from the launcher but meet at the given URL.
    """
    environ = os.environ if environ is None else environ
    choice = (init_method or "auto").strip()
    if choice == "auto":
        env = _first_match(environ, PROBES)
    elif choice in ("env", "env://"):
        env = _explicit_env(Vars(environ))
    elif choice == "slurm":
        env = _first_match(environ, (SlurmProbe(required=True),))  # raises unless this is an srun task
    elif choice.startswith(("tcp://", "file://")):
        env = _with_url(environ, choice)
    else:
        raise UserError(f"--dist-init-method {choice!r} is not understood; use {INIT_METHOD_FORMS}")
    return _checked(env)


def _first_match(environ: Mapping[str, str], probes: tuple[Probe, ...]) -> DistEnv:
    for probe in probes:
        env = probe.detect(environ)
        if env is not None:
            return env
    raise AssertionError("the last probe always matches")


def _explicit_env(v: Vars) -> DistEnv:
    if not v.has("RANK", "WORLD_SIZE"):
        raise UserError(
            "--dist-init-method env needs RANK and WORLD_SIZE (and MASTER_ADDR, MASTER_PORT) in the environment; "
            "set them, or use --dist-init-method auto to let hpctrain find the launcher"
        )
    env = torchrun_style(v, "explicit") if v.has("LOCAL_RANK") else per_node(v, "explicit")
    return env


def _with_url(environ: Mapping[str, str], url: str) -> DistEnv:
    """Rank and world size from the launcher; the rendezvous from the URL."""
    topology = _first_match(environ, PROBES[:-1] + (_NoLauncher(url),))
    if url.startswith("tcp://"):
        host, port = parse_tcp_url(url)
        return dataclasses.replace(topology, master_addr=host, master_port=port, init_method=url)
    parts = urllib.parse.urlsplit(url)
    path = parts.path
    if parts.netloc not in ("", "localhost") or not path.startswith("/"):
        raise UserError(f"{url!r} needs an absolute path: file:///shared/dir/rendezvous (three slashes)")
    return dataclasses.replace(topology, master_addr=None, master_port=None, init_method=url)


class _NoLauncher:
    name = "none"

    def __init__(self, url: str) -> None:
        self.url = url

    def detect(self, environ: Mapping[str, str]) -> DistEnv:
        raise UserError(
            f"--dist-init-method {self.url} says where the processes meet, but no launcher told this process its "
            "rank and world size: start it with torchrun or srun, or set RANK, WORLD_SIZE (and LOCAL_RANK, "
            "LOCAL_WORLD_SIZE) yourself"
        )


def parse_tcp_url(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # port not a number or out of range
        host, port = None, None
    if not host or port is None or port < 1 or parts.path not in ("", "/"):
        raise UserError(f"{url!r} is not tcp://HOST:PORT with a port in 1-65535 (e.g. tcp://node1:29500)")
    return host, port


def _checked(env: DistEnv) -> DistEnv:
    """A world of one needs no rendezvous; a bigger one must have a rendezvous that can work."""
    if not env.is_distributed:
        return dataclasses.replace(env, init_method=None)
    if env.init_method == "env://":
        missing = [
            name
            for name, value in (("MASTER_ADDR", env.master_addr), ("MASTER_PORT", env.master_port))
            if value is None
        ]
        if missing:
            raise UserError(
                f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set but this is rank "
                f"{env.rank} of {env.world_size} ({env.launcher}): set MASTER_ADDR to rank 0's host and MASTER_PORT "
                "to a free port on it, or pass --dist-init-method tcp://HOST:PORT (never guessed as localhost: "
                "each node would form its own world)"
            )
    return env
