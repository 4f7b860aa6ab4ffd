"""Ports for hpctrain's servers: a free one on this host (a local rendezvous for `hpctrain train --nproc`, a local
TensorBoard), and the range from which a job on a shared node derives one (a Slurm job's torchrun rendezvous,
srun's MASTER_PORT, a dev session's server).

The range sits below Linux's ephemeral range, net.ipv4.ip_local_port_range (32768 to 60999 by default): the
kernel gives local ports from that range to outgoing connections and to `bind(port 0)`, so a server port chosen
inside it may already be held by some client's connection on the node, and more so on a busy node. Below it, from
20000 up, are registered ports that few cluster nodes serve. A script that finds its first port in use walks up
at most PORT_TRIES ports; PORT_SPAN leaves room for that walk below 32768.

One rule derives a job's port from its id (job_port; its bash form starts job_port_lines), and one walk moves up
past ports in use (job_port_lines): srun's MASTER_PORT, the batch script's torchrun rendezvous and a service job's
server (a dev session, a cluster TensorBoard) all get their port this way.
"""

from __future__ import annotations

import socket

EPHEMERAL_START = 32768  # Linux's default ip_local_port_range starts here (and ends at 60999)
PORT_BASE = 20000
PORT_TRIES = 200
PORT_SPAN = 12000  # ports PORT_BASE .. 31999; a walk of PORT_TRIES more ends by 32199, below EPHEMERAL_START


def job_port(job_id: int, step_id: int = 0) -> int:
    """The port of step `step_id` of job `job_id` on a shared node. Consecutive job ids land 7 ports apart (7 is
    coprime with the span, so ids only collide PORT_SPAN apart) and the first few steps of a job get their own
    ports."""
    return PORT_BASE + (7 * job_id + step_id) % PORT_SPAN


def job_port_lines(var: str, failure: str) -> list[str]:
    """Bash lines that set `$var` to job_port of the job in $SLURM_JOB_ID (step 0), then walk up past ports that
    something on this node listens on, at most PORT_TRIES of them; past that the script prints `failure` (hpctrain's
    own text: it is written between double quotes) and exits 1."""
    return [
        "# The job's port (hpctrain.distributed.ports.job_port), then up past ports in use (another job here).",
        f"{var}=$(({PORT_BASE} + (7 * SLURM_JOB_ID) % {PORT_SPAN}))",
        "tries=0",
        f'while (exec 3<>"/dev/tcp/127.0.0.1/${{{var}}}") 2>/dev/null; do',
        f"    {var}=$(({var} + 1)); tries=$((tries + 1))",
        f'    if [ "$tries" -ge {PORT_TRIES} ]; then',
        f'        echo "{failure}" >&2; exit 1',
        "    fi",
        "done",
    ]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on at `host` now (the kernel's choice; another program may still take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
