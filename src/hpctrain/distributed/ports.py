"""Ports for hpctrain's servers: a free one on this host (a local rendezvous for `hpctrain train --nproc`, a local
TensorBoard), and the range from which a job on a shared node derives one (a Slurm job's torchrun rendezvous,
srun's MASTER_PORT, a dev session's server).

The range sits below Linux's ephemeral range, net.ipv4.ip_local_port_range (32768 to 60999 by default): the
kernel gives local ports from that range to outgoing connections and to `bind(port 0)`, so a server port chosen
inside it may already be held by some client's connection on the node, and more so on a busy node. Below it, from
20000 up, are registered ports that few cluster nodes serve. A script that finds its first port in use walks up
at most PORT_TRIES ports; PORT_SPAN leaves room for that walk below 32768.
"""

from __future__ import annotations

import socket

EPHEMERAL_START = 32768  # Linux's default ip_local_port_range starts here (and ends at 60999)
PORT_BASE = 20000
PORT_TRIES = 200
PORT_SPAN = 12000  # ports PORT_BASE .. 31999; a walk of PORT_TRIES more ends by 32199, below EPHEMERAL_START


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on at `host` now (the kernel's choice; another program may still take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
