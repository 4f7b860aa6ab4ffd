"""The batch script's torchrun shim (torchrun_shim.TORCHRUN_SHIM) with a real torchrun and real workers, without Slurm.

It must decide about torchrun's signal flags with the torch it runs under (they exist from torch 2.9; an older
torchrun stops with "unrecognized arguments"), pass a time-limit warning (USR1) or a cancel (TERM) to the workers,
let them finish their checkpoint, and end with the planned status and one line: no SignalException traceback.
The test sends the signal to the agent only; on Slurm, slurmstepd signals the workers too (the shim must not depend
on that). The old-torchrun path runs twice: with this torch made to look old (its parser's help without the flags),
and, when HPCTRAIN_FLOOR_PYTHON names the floor environment's interpreter (scripts/test.sh sets it), with the
floor torch itself.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.schedulers.slurm.batch.torchrun_shim import EXIT_BARRIER, TORCHRUN_SHIM, TORCHRUN_SIGNALS

# Not marked floor: the main run already runs the shim under the floor torch (the floor-torch variant); in the
# floor run itself every variant would repeat one of those.
pytestmark = [pytest.mark.slow]

WORKER = """\
import os, signal, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
out, rank = sys.argv[1], os.environ["RANK"]
open(os.path.join(out, "ready-" + rank), "w").close()
deadline = time.time() + 120  # only for a broken test
while not got and time.time() < deadline:
    time.sleep(0.05)
time.sleep(1.5)  # the checkpoint
with open(os.path.join(out, "stopped-" + rank), "w") as f:
    f.write(signal.Signals(got[0]).name if got else "none")
sys.exit(75 if got and got[0] == signal.SIGUSR1 else 143)
"""

# Makes this torch's torchrun look like one older than 2.9 to the shim's feature detection.
LOOK_OLD = """\
import torch.distributed.run as _run
_parser = _run.get_args_parser
def _old_parser():
    parser = _parser()
    parser.format_help = lambda: "usage: torchrun [-h] [--nnodes NNODES] ..."
    return parser
_run.get_args_parser = _old_parser
"""

FLOOR_PYTHON = os.environ.get("HPCTRAIN_FLOOR_PYTHON")
VARIANTS = ["this-torch", "looks-old", "floor-torch"]


def run_shim(tmp_path: Path, variant: str, sig: signal.Signals, before: str = "") -> tuple[int, str, Path]:
    python, code = sys.executable, before + TORCHRUN_SHIM
    if variant == "looks-old":
        code = before + LOOK_OLD + TORCHRUN_SHIM
    elif variant == "floor-torch":
        if not FLOOR_PYTHON:
            pytest.skip("HPCTRAIN_FLOOR_PYTHON is not set (scripts/test.sh sets it to the floor environment's python)")
        python = FLOOR_PYTHON
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "worker.py").write_text(WORKER)
    env = {**os.environ, "SLURM_NODEID": "0", "SLURMD_NODENAME": "node1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            python,
            "-c",
            code,
            TORCHRUN_SIGNALS,
            "20",
            "--standalone",
            "--nnodes=1",
            "--nproc-per-node=2",
            "--no-python",
            python,
            str(tmp_path / "worker.py"),
            str(out),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 180
    while len(list(out.glob("ready-*"))) < 2:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the workers did not start:\n{proc.communicate()[0]}")
        time.sleep(0.1)
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=120)
    return proc.returncode, output, out


def _has_signal_flags() -> bool:
    from torch.distributed import run

    return "--signals-to-handle" in run.get_args_parser().format_help()


@pytest.mark.parametrize("variant", VARIANTS)
def test_time_limit_warning_stops_workers_cleanly_with_status_75(tmp_path: Path, variant: str) -> None:
    code, output, out = run_shim(tmp_path, variant, signal.SIGUSR1)
    assert code == 75, output
    assert "Traceback" not in output and "SignalException" not in output, output
    assert "hpctrain: torchrun on node1 stopped its workers on SIGUSR1 as planned (exit status 75)" in output, output
    # every worker got the warning and finished its checkpoint before the agent ended
    assert sorted(p.read_text() for p in out.glob("stopped-*")) == ["SIGUSR1", "SIGUSR1"], output
    lost = "has no --signals-to-handle (torch >= 2.9)"
    if variant == "this-torch" and _has_signal_flags():  # under the floor environment's pytest, this torch is old
        assert lost not in output
    else:  # said once, with what is lost
        assert output.count(lost) == 1 and "fixed 30 s before SIGKILL, not the 20 s asked for" in output, output


# srun ends a step's other tasks (--kill-on-bad-exit) once one exits with a planned non-zero status: an agent on its
# way out may get that TERM in its interpreter's shutdown. Here the agent sends it itself, from its last exit hook.
LATE_TERM = "import atexit, os, signal\natexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))\n"


def test_a_term_in_the_agents_shutdown_after_a_planned_stop_changes_nothing(tmp_path: Path) -> None:
    code, output, out = run_shim(tmp_path, "this-torch", signal.SIGUSR1, before=LATE_TERM)
    assert code == 75, output
    assert "Traceback" not in output and "SignalException" not in output, output
    assert sorted(p.read_text() for p in out.glob("stopped-*")) == ["SIGUSR1", "SIGUSR1"], output


@pytest.mark.parametrize("variant", VARIANTS)
def test_cancel_stops_workers_cleanly_with_status_143(tmp_path: Path, variant: str) -> None:
    code, output, out = run_shim(tmp_path, variant, signal.SIGTERM)
    assert code == 143, output
    assert "Traceback" not in output and "SignalException" not in output, output
    assert "stopped its workers on SIGTERM as planned (exit status 143)" in output, output
    assert sorted(p.read_text() for p in out.glob("stopped-*")) == ["SIGTERM", "SIGTERM"], output


def test_floor_torchrun_rejects_the_signal_flags() -> None:
    """Why the shim exists: the floor torch's torchrun stops at the flags newer ones take."""
    if not FLOOR_PYTHON:
        pytest.skip("HPCTRAIN_FLOOR_PYTHON is not set (scripts/test.sh sets it to the floor environment's python)")
    proc = subprocess.run(
        [FLOOR_PYTHON, "-m", "torch.distributed.run", f"--signals-to-handle={TORCHRUN_SIGNALS}", "--no-python", "true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "unrecognized arguments" in proc.stderr, proc.stderr


ENDS_ON_PURPOSE = """\
import os, sys, time
if os.environ["RANK"] == "0":
    sys.exit(int(sys.argv[1]))  # a hang watchdog's 142 or a failed preflight's 144
time.sleep(60)  # the other worker: torchrun stops it
"""


@pytest.mark.parametrize("status", [142, 144, 1])
def test_a_worker_ending_the_attempt_on_purpose_reads_as_one_line(tmp_path: Path, status: int) -> None:
    (tmp_path / "worker.py").write_text(ENDS_ON_PURPOSE)
    env = {**os.environ, "SLURM_NODEID": "0", "SLURMD_NODENAME": "node1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            TORCHRUN_SHIM,
            "",
            "20",
            "--standalone",
            "--nnodes=1",
            "--nproc-per-node=2",
            "--no-python",
            sys.executable,
            str(tmp_path / "worker.py"),
            str(status),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    output = result.stdout + result.stderr
    if status == 1:  # a real failure keeps torchrun's own report
        assert result.returncode == 1 and "ChildFailedError" in output, output
        return
    assert result.returncode == status, output
    assert "Traceback" not in output and "ChildFailedError" not in output, output
    assert f"hpctrain: torchrun on node1: a worker ended the attempt on purpose (exit status {status}" in output


# Two agents at torchrun's exit barrier over a real TCPStore, the one not hosting the store slower to talk to it (1.5
# s before each store call after its own arrival, as on a loaded node); after the barrier it writes to the store
# once more, as its rendezvous' shutdown does. The host is group rank 1: torch assigns group ranks by sorting the
# agents' host names and process ids, so the store's host need not be rank 0, which torch's own barrier before 2.4
# takes it for. Each barrier is called as that torch's agent calls it (positional rank before 2.4, keywords after).
# argv: WHICH (torch: torch's own barrier; ours: torchrun_shim.EXIT_BARRIER, then its store release), ROLE (host or
# other), the port file.
BARRIER_RACE = (
    "import inspect\nfrom torch.distributed.elastic.utils import store as store_util\n"
    + EXIT_BARRIER
    + """
import datetime, os, sys, time
from pathlib import Path
from torch.distributed import TCPStore
which, role, port_file = sys.argv[1], sys.argv[2], Path(sys.argv[3])
host = role == "host"
if host:
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=30))
    port_file.write_text(str(store.port))
else:
    store = TCPStore("127.0.0.1", int(port_file.read_text()), is_master=False, timeout=datetime.timedelta(seconds=30))

class SlowReader:
    def __init__(self, store):
        self.store, self.arrived = store, False
    def __getattr__(self, name):
        def call(*args, **kwargs):
            if self.arrived:
                time.sleep(1.5)
            result = getattr(self.store, name)(*args, **kwargs)
            self.arrived = self.arrived or name in ("set", "add")
            return result
        return call

agent = store if host else SlowReader(store)
barrier = store_util.barrier if which == "torch" else exit_barrier
if list(BARRIER.parameters)[1] == "rank":
    barrier(agent, 1 if host else 0, 2, key_prefix="exit", barrier_timeout=30)
else:
    barrier(store=agent, world_size=2, key_prefix="exit", barrier_timeout=30)
if not host:
    agent.set("rendezvous-closed", "1")
if which == "ours":
    release_store(host)
print(role, "left the barrier", flush=True)
os._exit(0)  # as an agent leaving: its store goes at once, not after a slow interpreter shutdown
"""
)


def _barrier_race(tmp_path: Path, python: str, which: str) -> tuple[subprocess.CompletedProcess, str]:
    (tmp_path / "race.py").write_text(BARRIER_RACE)
    port_file = tmp_path / "port"
    host = subprocess.Popen(
        [python, str(tmp_path / "race.py"), which, "host", str(port_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text():
        assert host.poll() is None and time.monotonic() < deadline, host.communicate()[0]
        time.sleep(0.05)
    other = subprocess.run(
        [python, str(tmp_path / "race.py"), which, "other", str(port_file)], capture_output=True, text=True, timeout=120
    )
    return other, host.communicate(timeout=60)[0]


def _python(which: str) -> str:
    if which == "floor-torch" and not FLOOR_PYTHON:
        pytest.skip("HPCTRAIN_FLOOR_PYTHON is not set (scripts/test.sh sets it to the floor environment's python)")
    return FLOOR_PYTHON if which == "floor-torch" else sys.executable


@pytest.mark.parametrize("python", ["this-torch", "floor-torch"])
def test_the_store_host_waits_until_every_agent_is_done_with_the_store(tmp_path: Path, python: str) -> None:
    other, host_output = _barrier_race(tmp_path, _python(python), "ours")
    assert other.returncode == 0 and "other left the barrier" in other.stdout, other.stdout + other.stderr
    assert "host left the barrier" in host_output, host_output


@pytest.mark.parametrize("python", ["this-torch", "floor-torch"])
def test_torchs_own_exit_barrier_ends_the_store_under_a_slow_agent(tmp_path: Path, python: str) -> None:
    """Why the shim replaces the barrier on every torch: the store's host leaves while the other agent still talks
    to the store, which ends that agent's good job with a DistNetworkError traceback (pytorch/pytorch#69520)."""
    other, host_output = _barrier_race(tmp_path, _python(python), "torch")
    assert "host left the barrier" in host_output, host_output
    assert other.returncode != 0 and "other left the barrier" not in other.stdout, other.stdout + other.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_group_below_its_minimum_ends_after_the_join_timeout_in_one_line(tmp_path: Path) -> None:
    """An elastic job's survivor alone, below MIN (--nnodes=2:3, one agent): torch's rendezvous gives up after the
    join timeout the job's PET_RDZV_CONF sets (kept beside the shim's is_host: without it, 600 s), and the shim
    says so in one line (the batch script then requeues the job). A real c10d rendezvous on this host."""
    (tmp_path / "worker.py").write_text("raise SystemExit('never started: the group never formed')\n")
    port = free_port()
    env = {**os.environ, "SLURM_NODEID": "0", "SLURMD_NODENAME": "node1", "PET_RDZV_CONF": "join_timeout=3"}
    result = subprocess.run(
        [
            *(sys.executable, "-c", TORCHRUN_SHIM, "", "20", "--nnodes=2:3", "--nproc-per-node=1"),
            *("--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=below-min"),
            *("--no-python", sys.executable, str(tmp_path / "worker.py")),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in output and "never started" not in output, output
    assert "hpctrain: torchrun on node1: no group of at least its minimum of nodes formed within the" in output
