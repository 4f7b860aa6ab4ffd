"""A child process that dies with the process that started it (Linux's PR_SET_PDEATHSIG): local DDP workers
(hpctrain.launch.local) and the TensorBoard server (hpctrain.servers.tensorboard). Torch-free."""

from __future__ import annotations

import ctypes
import os

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
