"""A process that dies with the process that started it (Linux's PR_SET_PDEATHSIG) or with an ancestor (a pidfd):
local DDP workers (hpctrain.launch.processes) and the TensorBoard server (hpctrain.servers.tensorboard). Torch-free."""

from __future__ import annotations

import ctypes
import os
import select
import threading

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int, signum: int) -> None:
    """Have the kernel send this process `signum` when `parent` (the process that started it) dies, however it
    dies. For a forked child, before it does anything else (e.g. Popen's preexec_fn). Linux only; elsewhere nothing
    watches. Exits at once (128 + signum) if the parent is already gone, before prctl could take effect."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(128 + signum)


def die_with(pid: int, signum: int) -> None:
    """Have this process get `signum` when process `pid` (not its parent: an ancestor) exits: a daemon thread waits
    on a pidfd (Linux 5.3+), no polling. Exits at once (128 + signum) if `pid` is already gone; does nothing where
    pidfds do not exist."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(128 + signum)
    except (AttributeError, OSError):
        return

    def wait() -> None:
        select.select([fd], [], [])
        os.kill(os.getpid(), signum)

    threading.Thread(target=wait, name="hpctrain-launcher-watch", daemon=True).start()
