"""Test harness only: `python -m hpctrain ...` in a job step of the local Slurm cluster, started warm.

This folder is first on PYTHONPATH for the whole test run (tests/conftest.py), so every Python the tests start, and
every one their Slurm jobs start (sbatch passes the submitting environment on), imports this file at start-up. It
does nothing unless the process runs in a Slurm job (SLURM_JOB_ID), was started as `python [-u] -m hpctrain ...` (an
srun rank, or a torchrun worker through `--no-python PYTHON -m hpctrain`) or `python -c CODE ...` (the batch script's
torchrun agent, `python3 -c "$hpctrain_torchrun" ...`), and the test that submitted the job named
a warm process in HPCTRAIN_TEST_WARM_STEPS (tests/slurm_fixtures.py). Then the process becomes tests/warm_worker.py
(exec: the same pid, which Slurm tracks and signals), which runs the command as a fork of that warm process, which
imported torch once, instead of importing it again here (about 4 CPU s a process on the CI machine), or, where the
warm process's start-up environment differs from the job's, becomes this command again, fresh.

A test marked `fresh_steps` (slurm_fixtures.fresh_job_steps) names a file in HPCTRAIN_TEST_STEP_LOG instead: every
Python process its jobs start records there how it started (handed to a warm process, or fresh) and the processes
above it, so that the test can tell that its jobs' steps started as a user's do, fresh and under slurmstepd.
"""

import os
import sys


def _ancestors() -> list[str]:
    """The command names of the processes above this one, nearest first (slurmstepd above a job's processes)."""
    names, pid = [], os.getppid()
    while pid > 1 and len(names) < 32:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            break
        names.append(stat[stat.index("(") + 1 : stat.rindex(")")])
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
    return names


def _record(started: str) -> None:
    log = os.environ.get("HPCTRAIN_TEST_STEP_LOG")
    if not log:
        return
    import json  # here: this file runs in every Python the tests start

    line = json.dumps({"pid": os.getpid(), "argv": sys.orig_argv, "started": started, "ancestors": _ancestors()})
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())  # one write of a line, O_APPEND: lines of concurrent processes stay whole
    finally:
        os.close(fd)


def _hand_over() -> None:
    if not os.environ.get("SLURM_JOB_ID"):
        return
    socket_path = os.environ.get("HPCTRAIN_TEST_WARM_STEPS")
    argv = list(sys.orig_argv[1:])
    options = []
    while argv and argv[0] == "-u":
        options.append(argv.pop(0))
    if not socket_path or (argv[:2] != ["-m", "hpctrain"] and argv[:1] != ["-c"]):
        _record("fresh")
        return
    _record("warm")
    # The warm fork keeps HPCTRAIN_TEST_WARM_STEPS, for the processes it starts (a torchrun agent's workers);
    # warm_worker.py drops it where it starts this command afresh instead.
    env = {**os.environ, "HPCTRAIN_TEST_WARM_WORKERS": socket_path}
    worker = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "warm_worker.py")
    os.execve(sys.executable, [sys.executable, *options, worker, *argv], env)


_hand_over()
