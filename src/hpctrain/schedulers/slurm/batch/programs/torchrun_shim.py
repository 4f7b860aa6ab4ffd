# torchrun, run as a few lines of Python in the job's own environment (its torch decides, not the submitting
# host's): argv is SIGNALS SHUTDOWN_TIMEOUT TORCHRUN_ARGS... (SIGNALS empty: no time-limit warning is expected).
# hpctrain.schedulers.slurm.batch.torchrun_shim renders it into the batch script: its full-line comments and blank lines
# left out, the three settings below filled in. The batch script holds it in single quotes: double quotes only.
#  * Feature detection: torchrun learned --signals-to-handle and --shutdown-timeout in torch 2.9. An older one is
#    given an agent handler for the extra signals (USR1) that does what the flag does, and node 0 says once in the
#    job log what is lost: the workers get torchrun's fixed 30 s to stop instead of SHUTDOWN_TIMEOUT.
#  * A planned stop (the agent told to stop by USR1 or TERM) ends with one line and the planned status (75 after
#    the time-limit warning, 128+N after signal N: 143 for TERM) instead of torchrun's SignalException traceback;
#    so does an attempt a worker ended on purpose (142: its hang watchdog; 144: the preflight found a sick node),
#    instead of torchrun's ChildFailedError traceback.
#  * The first node of the step (SLURM_NODEID 0, the script's $head_node) hosts the rendezvous store, said with
#    is_host rather than left to torch's guess from host names (a Slurm node name need not be one of them). The
#    rest of the rendezvous settings are torchrun's own PET_RDZV_CONF, kept (join_timeout=S: how long an elastic
#    job's survivors wait for MIN nodes; torch's default 600 s), which the is_host flag would otherwise replace.
#  * A rendezvous that timed out (fewer than MIN nodes came, as after an elastic job lost a node at MIN) ends with
#    one line instead of a traceback; the batch script then requeues the job (requeue.lost_node_lines).
#  * Once the attempt is over (its workers ended), the agent ignores the signals it handled: srun ends a step's
#    other tasks (--kill-on-bad-exit) as soon as one exits with a planned non-zero status, and a TERM that reached
#    an agent on its way out, in its interpreter's shutdown, raised torchrun's SignalException there (a traceback
#    in the job log after a clean stop).
#  * torch's exit barrier lets the agent that hosts the rendezvous store leave, and end the store, while another
#    agent still talks to it: before torch 2.4 it kept group rank 0 to the last, taking it for the host (group ranks
#    follow sorted host names and process ids, so the host need not be rank 0); from 2.4 on nobody waits for
#    anybody once the last agent has arrived (pytorch/pytorch#69520, open). Either way a good job could end with a
#    DistNetworkError traceback ("Failed to recv", "Connection reset by peer") and failed rendezvous heartbeats in
#    its log. exit_barrier replaces it on every torch, and once torchrun is done the store's host waits (at most
#    RELEASE_WAIT_S) for every agent that passed the barrier to say it is done with the store too (release_store).
import inspect
import os
import signal
import sys

import torch
from torch.distributed import run
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import RendezvousTimeoutError
from torch.distributed.elastic.utils import store as store_util

# The settings hpctrain fills in (torchrun_shim.SETTINGS): these lines are replaced, one for one.
FIXED_S = 0  # torchrun's fixed shutdown time before --shutdown-timeout existed
PREEMPTED_STATUS = 0  # the exit status of a stop after the time-limit warning
PLANNED_STATUSES = ()  # the exit statuses a worker ends an attempt with on purpose (hung, sick node)


# -- exit barrier (torchrun_shim.EXIT_BARRIER: a test runs it) --
BARRIER = inspect.signature(store_util.barrier)  # torch own barrier, whose parameters differ between versions
RELEASE_WAIT_S = 30.0
passed = []  # (store, key prefix, agents) once this agent has passed the exit barrier


def exit_barrier(*args, **kwargs):
    import datetime

    given = BARRIER.bind(*args, **kwargs)
    given.apply_defaults()
    store, agents, prefix = given.arguments["store"], given.arguments["world_size"], given.arguments["key_prefix"]
    store.set_timeout(datetime.timedelta(seconds=given.arguments["barrier_timeout"]))
    if store.add(prefix + "/arrived", 1) == agents:
        store.set(prefix + "/all", "1")
    store.wait([prefix + "/all"])
    passed.append((store, prefix, agents))


def release_store(hosts_store):
    import time

    if not passed:
        return
    store, prefix, agents = passed[0]
    try:
        if not hosts_store:
            store.add(prefix + "/done", 1)
            return
        deadline = time.monotonic() + RELEASE_WAIT_S
        while store.add(prefix + "/done", 0) < agents - 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    except Exception:
        pass  # the store is gone: nothing is left to keep it for


# -- end of exit barrier --


signals, timeout, args = sys.argv[1], sys.argv[2], sys.argv[3:]
node = os.environ.get("SLURMD_NODENAME", "?")
hosts_store = os.environ.get("SLURM_NODEID", "0") == "0"
if any(arg.startswith("--rdzv-endpoint") for arg in args):
    conf = os.environ.get("PET_RDZV_CONF", "")
    args = ["--rdzv-conf=is_host=" + str(int(hosts_store)) + ("," + conf if conf else "")] + args
store_util.barrier = exit_barrier
if signals:
    usage = run.get_args_parser().format_help()
    if "--signals-to-handle" in usage and "--shutdown-timeout" in usage:
        args = ["--signals-to-handle=" + signals, "--shutdown-timeout=" + timeout] + args
    else:

        def stop(signum, frame):
            raise SignalException("Process %d got signal: %d" % (os.getpid(), signum), sigval=signal.Signals(signum))

        for name in signals.split(","):
            signal.signal(getattr(signal, name), stop)
        if os.environ.get("SLURM_NODEID", "0") == "0":
            print(
                "hpctrain: torchrun of torch %s has no --signals-to-handle (torch >= 2.9): hpctrain handles %s in"
                " its agents instead; what is lost: stopping workers get torchrun fixed %d s before SIGKILL, not"
                " the %s s asked for" % (torch.__version__, signals, FIXED_S, timeout),
                flush=True,
            )


def settled():
    for name in "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1".split(","):
        signal.signal(getattr(signal, name), signal.SIG_IGN)


try:
    run.main(args)
    release_store(hosts_store)
except SignalException as err:
    settled()
    status = PREEMPTED_STATUS if err.sigval == signal.SIGUSR1 else 128 + int(err.sigval)
    print(
        "hpctrain: torchrun on %s stopped its workers on %s as planned (exit status %d)"
        % (node, err.sigval.name, status),
        flush=True,
    )
    sys.exit(status)
except RendezvousTimeoutError:
    settled()
    print(
        "hpctrain: torchrun on %s: no group of at least its minimum of nodes formed within the rendezvous join"
        " timeout (join_timeout: 600 s unless PET_RDZV_CONF sets it)" % node,
        flush=True,
    )
    sys.exit(1)
except ChildFailedError as err:
    settled()
    planned = sorted({f.exitcode for f in err.failures.values()} & set(PLANNED_STATUSES))
    if not planned:
        raise
    print(
        "hpctrain: torchrun on %s: a worker ended the attempt on purpose (exit status %d: 142 hung, 144 sick"
        " node; the run directory says more)" % (node, planned[0]),
        flush=True,
    )
    sys.exit(planned[0])
settled()
