"""A free TCP port on this host: for a local rendezvous (`hpctrain train --nproc`) or a local server (TensorBoard)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on at `host` now (the kernel's choice; another program may still take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
