"""Who this process is in a distributed job: the `DistEnv` record and strict readers for launcher variables.

Pure standard library (no torch), so `hpctrain submit`, `hpctrain env` and the tests can use it cheaply.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hpctrain.errors import UserError

LAUNCHERS = ("torchrun", "slurm", "kubeflow", "spawn", "explicit", "none")


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the job. Built by `detect()`; `init_process_group()` consumes it."""

    launcher: str  # who started the process: one of LAUNCHERS
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str | None
    master_port: int | None
    init_method: str | None  # "env://", "tcp://HOST:PORT" or "file://PATH"; None when world_size == 1

    def __post_init__(self) -> None:
        # Invariants only; detect() has already explained launcher-specific problems in its own words.
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"unknown launcher {self.launcher!r}; expected one of {', '.join(LAUNCHERS)}")
        where = f"(launcher {self.launcher})"
        _ordered("rank", self.rank, "world size", self.world_size, where)
        _ordered("local rank", self.local_rank, "local world size", self.local_world_size, where)
        _ordered("node rank", self.node_rank, "number of nodes", self.num_nodes, where)
        if self.local_world_size > self.world_size:
            raise UserError(
                f"{self.local_world_size} processes on this node but only {self.world_size} in the whole job {where}: "
                "the launcher's per-node and total process counts disagree; fix the launch command"
            )
        if self.master_port is not None and not 0 < self.master_port < 65536:
            raise UserError(
                f"master port {self.master_port} is outside 1-65535 {where}: set MASTER_PORT to a free port"
            )

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def describe(self) -> str:
        """One line for logs: who am I and how will the group meet."""
        if not self.is_distributed:
            return f"single process (launcher {self.launcher})"
        return (
            f"rank {self.rank}/{self.world_size} (local {self.local_rank}/{self.local_world_size}, "
            f"node {self.node_rank}/{self.num_nodes}) via {self.launcher}, rendezvous {self.init_method}"
            + (f" at {self.master_addr}:{self.master_port}" if self.init_method == "env://" else "")
        )


@dataclass(frozen=True)
class NodePlan:
    """A node (pod) whose launcher starts one process but wants `nproc_per_node` workers: we must start them."""

    num_nodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.nproc_per_node

    def worker_environ(self, local_rank: int) -> dict[str, str]:
        """Variables for worker `local_rank`, as torchrun would set them (plus HPCTRAIN_LAUNCHER=spawn)."""
        if not 0 <= local_rank < self.nproc_per_node:
            raise ValueError(f"local rank {local_rank} outside 0..{self.nproc_per_node - 1}")
        return {
            "HPCTRAIN_LAUNCHER": "spawn",
            "RANK": str(self.node_rank * self.nproc_per_node + local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(self.nproc_per_node),
            "GROUP_RANK": str(self.node_rank),
            "GROUP_WORLD_SIZE": str(self.num_nodes),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


def _ordered(low_name: str, low: int, high_name: str, high: int, where: str) -> None:
    if high < 1:
        raise UserError(f"{high_name} is {high} {where}: it must be at least 1; fix the launch command")
    if not 0 <= low < high:
        raise UserError(
            f"{low_name} {low} is outside 0..{high - 1} for {high_name} {high} {where}: "
            "the launcher's variables disagree; check that every process got the same job size"
        )


class Vars:
    """Read launcher variables strictly: a malformed value is an error naming the variable, never a default."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ

    def has(self, *names: str) -> bool:
        return all(self.environ.get(name, "").strip() != "" for name in names)

    def text(self, name: str) -> str | None:
        value = self.environ.get(name, "").strip()
        return value or None

    def number(self, name: str, *, hint: str = "", minimum: int = 0) -> int | None:
        """The variable as an int >= minimum, or None when unset/empty."""
        value = self.text(name)
        if value is None:
            return None
        try:
            number = int(value, 10)
        except ValueError:
            number = None
        if number is None or number < minimum:
            raise UserError(
                f"{name}={value!r} is not a whole number >= {minimum}"
                + (f" ({hint})" if hint else "")
                + f"; fix or unset {name}"
            )
        return number

    def required_int(self, name: str, *, why: str, minimum: int = 0) -> int:
        number = self.number(name, hint=why, minimum=minimum)
        if number is None:
            raise UserError(f"{name} is not set but {why}; set {name} (or launch with torchrun or srun, which set it)")
        return number

    def port(self, name: str) -> int | None:
        port = self.number(name, hint="a TCP port", minimum=1)
        if port is not None and port > 65535:
            raise UserError(f"{name}={port} is not a TCP port (1-65535); set {name} to a free port")
        return port
