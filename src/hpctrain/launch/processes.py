"""Start N worker processes on this node, as mp.spawn does (from a fork server), with the environment torchrun would
give them.

Used for `hpctrain train --nproc N` (one process per GPU, or N gloo processes on CPU) and for platforms that start
one process per node and expect it to fan out (Kubeflow's PET_NPROC_PER_NODE without torchrun). Each worker sees
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT and HPCTRAIN_LAUNCHER=spawn,
so `hpctrain.distributed.detect()` finds it like any other launcher.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from typing import Any, Callable

from hpctrain.distributed import NodePlan
from hpctrain.distributed.lifetime import die_with, die_with_parent
from hpctrain.distributed.ports import free_port
from hpctrain.errors import UserError
from hpctrain import channel

log = logging.getLogger(__name__)

# Workers get this long to checkpoint and exit after a sibling failed before they are killed.
FAILURE_GRACE_S = 30.0
# Signals the launcher passes on to its workers (which checkpoint and stop): scancel, time-limit warning, Ctrl-C.
FORWARDED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


def _worker(target: Callable[..., int], args: tuple[Any, ...], env: dict[str, str], launcher: int) -> None:
    # SIGKILL when the launcher dies, so a worker whose launcher was killed never trains or writes on: nobody is
    # left to wait for a checkpoint, and the last one is whole either way (written to a temporary name, renamed).
    # A worker is forked by the fork server, a child of the launcher: it dies with the server (its parent), and with
    # the launcher itself, since the server exits after the launcher only once its workers are gone (each worker
    # holds the server's pipe).
    server = os.getppid()
    die_with_parent(server, signal.SIGKILL)
    if server != launcher:
        die_with(launcher, signal.SIGKILL)
    # Our own session, as torchrun's workers have: a terminal's Ctrl-C (SIGINT to its foreground process group)
    # reaches only the launcher, which forwards it once, so a single Ctrl-C never counts twice in a worker.
    os.setsid()
    # A worker inherits its maker's start method (forkserver here; spawn before, when every DataLoader worker, made
    # anew each epoch for training and for evaluation, was a fresh interpreter importing torch again: 14 CPU s more
    # for 2 ranks x 1 worker x 2 epochs on a CPU node than with 0 workers). torchrun's workers are plain processes,
    # whose data workers start the platform's default way (fork on Linux); ours do the same.
    multiprocessing.set_start_method(None, force=True)
    os.environ.update(env)
    try:
        code = target(*args)
    except UserError as err:
        log.error(f"hpctrain (rank {env['RANK']}): error: {err}", extra=channel.BARE)
        code = err.exit_code
    # Leave without the interpreter's teardown: everything the run writes is closed and durable by now, and under
    # load a worker's teardown was seen to abort (SIGABRT, "terminate called without an active exception") while
    # C++ threads of torch's process groups were being destroyed, turning a completed run into a failed one.
    channel.flush()
    os._exit(code)


def _context() -> Any:
    """The workers are forks of a fork server, a fresh interpreter that imported torch once for all of them (and
    torch._dynamo, which the first optimizer imports): with spawn each worker of `--nproc N` imported both itself,
    2.8 CPU s apiece on this machine. The server only imports, never runs an operator (no thread pool to fork, no
    CUDA context). Where there is no fork server (not POSIX), spawn."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "torch._dynamo"])  # a module that fails to import is skipped there
    return context


def local_plan(nproc: int) -> NodePlan:
    """One node, `nproc` workers meeting on a free loopback port."""
    return NodePlan(num_nodes=1, node_rank=0, nproc_per_node=nproc, master_addr="127.0.0.1", master_port=free_port())


def spawn(plan: NodePlan, target: Callable[..., int], args: tuple[Any, ...]) -> int:
    """Run target(*args) in plan.nproc_per_node fresh processes; return the first non-zero exit status, else 0.

    The workers run in their own session and die with this process (SIGKILL, on Linux). SIGTERM, SIGUSR1 and
    SIGINT sent to this process (a terminal's Ctrl-C included) are forwarded to them: they checkpoint and stop. If a
    worker fails, the others get SIGTERM, then SIGKILL after a grace period, so a crash never leaves the rest
    waiting in a collective forever. Once all workers have exited those signals are ignored until this process
    exits: the outcome is settled, and a late signal must not turn it into a death by signal.
    """
    context = _context()
    workers = [
        context.Process(
            target=_worker, args=(target, args, plan.worker_environ(i), os.getpid()), name=f"hpctrain-rank{i}"
        )
        for i in range(plan.nproc_per_node)
    ]

    def forward(signum: int, frame: Any) -> None:
        for worker in workers:
            if worker.is_alive() and worker.pid is not None:
                os.kill(worker.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        for worker in workers:
            worker.start()
        status = _wait(workers)
    except BaseException:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_IGN)
    lost = _fork_server_lost()
    settle = time.monotonic() + FORK_SERVER_SETTLE_S
    while lost is None and status == 255 and time.monotonic() < settle:
        # Every worker read as 255 once the server's socket closed, which comes a moment before a killed server is
        # waitable: ask again for that moment (a worker that exits 255 itself costs this wait once).
        time.sleep(0.05)
        lost = _fork_server_lost()
    if lost is not None:  # every worker then reads as exit 255, multiprocessing's word for "no status came back"
        pid, how, code = lost
        channel.note(
            log,
            f"the fork server that started the workers (pid {pid}) {how}, and the workers with it: the "
            "run stopped where its last checkpoint left it (--resume continues from there)",
        )
        return code
    return status


FORK_SERVER_SETTLE_S = 5.0
"""How long a launcher whose workers all ended without a status waits for a dead fork server to become waitable."""


def _fork_server_lost() -> tuple[int, str, int] | None:
    """(pid, how it ended, the status to exit with) when this process's fork server has ended; None while it runs
    (or where there is none). It stays a zombie for multiprocessing to reap (WNOWAIT)."""
    from multiprocessing import forkserver

    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    if not isinstance(pid, int) or not hasattr(os, "waitid"):
        return None
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    if info is None or info.si_pid == 0:
        return None
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return pid, f"was killed by {signal.Signals(info.si_status).name}", 128 + info.si_status
    return pid, f"exited with status {info.si_status}", info.si_status or 1


def _wait(workers: list[Any]) -> int:
    first_failure = 0
    deadline: float | None = None
    while any(worker.is_alive() for worker in workers):
        for worker in workers:
            worker.join(timeout=0.2)
            if worker.exitcode not in (None, 0) and not first_failure:
                first_failure = _status(worker.exitcode)
                deadline = time.monotonic() + FAILURE_GRACE_S
                for other in workers:
                    if other.is_alive() and other.pid is not None:
                        os.kill(other.pid, signal.SIGTERM)
        if deadline is not None and time.monotonic() > deadline:
            for worker in workers:
                if worker.is_alive():
                    worker.kill()
    statuses = [_status(worker.exitcode) for worker in workers]
    return first_failure or next((s for s in statuses if s), 0)


def _status(exitcode: int | None) -> int:
    # multiprocessing reports death by signal N as -N; shells say 128 + N.
    if exitcode is None:
        return 1
    return 128 - exitcode if exitcode < 0 else exitcode
