"""torchrun's worker, started warm: `torchrun ... tests/warm_worker.py -m hpctrain ARGS` (or `... warm_worker.py
SCRIPT ARGS`, or `-c CODE ARGS`) runs `python -m hpctrain ARGS` (or `python SCRIPT ARGS`, `python -c CODE ARGS`)
as a fork of the warm process named by HPCTRAIN_TEST_WARM_WORKERS (tests/warm_start.py, which imported torch once),
not as a fresh interpreter importing it again. A Slurm job's steps come here too (tests/slurm_steps). Test-harness
only.

This process stands for the worker towards the agent for as long as the worker lives: the signals the agent sends
it (to its process group, as torchrun does) go on to the worker's process group, the worker's exit status becomes
its own (death by a signal included), and its own end, even by SIGKILL, ends the worker (the warm process watches
the connection). The worker has a session of its own, as torchrun gives each worker, and its real pid is the one it
writes in its progress records. Where there is no warm process, or its imports saw another start-up environment
(OMP_NUM_THREADS and the like), this process becomes the fresh worker torchrun would have started (`exec`).
"""

from __future__ import annotations

import os
import signal
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from warm_start import send_request, stand_in_record  # the stdlib only: this process stays light

INTERPRETER_OPTIONS = sys.orig_argv[1 : len(sys.orig_argv) - len(sys.argv)]  # torchrun's: -u
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def main(argv: list[str]) -> None:
    # One warm process, or several (os.pathsep between their sockets: a Slurm job's steps, tests/slurm_fixtures.py),
    # each made in another start-up environment: the first whose environment is this worker's runs it.
    for path in os.environ.get("HPCTRAIN_TEST_WARM_WORKERS", "").split(os.pathsep):
        if path and argv:
            _warm(path, argv)  # returns only where that warm process said to start afresh, or is gone
    os.environ.pop("HPCTRAIN_TEST_WARM_STEPS", None)  # fresh: not handed over again (tests/slurm_steps)
    os.execv(sys.executable, [sys.executable, *INTERPRETER_OPTIONS, *argv])


def _warm(path: str, argv: list[str]) -> None:
    target = {"-m": ("module", argv[1]), "-c": ("code", argv[1])}.get(argv[0], ("path", argv[0]))
    args = argv[2:] if argv[0] in ("-m", "-c") else argv[1:]
    env = dict(os.environ)
    if "-u" in INTERPRETER_OPTIONS:  # torchrun starts its workers with -u
        env["PYTHONUNBUFFERED"] = "1"
    request = {"target": target, "args": args, "cwd": os.getcwd(), "env": env, "pgid": None}
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
    except OSError:
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # one that comes before the handlers waits for them
    pid = send_request(connection, {**request, "tied": True, "same_view": True}, [0, 1, 2])
    if pid is None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        return
    record = stand_in_record(path, os.getpid())  # for a test that signals "the worker" found by its parent
    with open(record, "w") as f:
        f.write(f"{pid}\n")

    def forward(signum: int, frame: object) -> None:
        try:
            os.killpg(pid, signum)
        except OSError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = connection.recv(64)
        if not chunk:
            os._exit(1)  # the warm process died: so did the worker
        answer += chunk
    code = int(answer)
    os.unlink(record)
    if code < 0:  # died by a signal: so does this process, for the agent to see
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main(sys.argv[1:])
