"""Does a gloo rank see its peer's death at once? Two plain gloo processes on this host all-reduce in a loop; once
they are going, rank 1 is SIGKILLed (its sockets close: the kernel sends FIN or RST), and rank 0 either keeps
running meanwhile (`running`) or is stopped with SIGSTOP before the kill and continued with SIGCONT after it
(`stopped`: a suspended job, or a test that pauses a survivor). The figure is what rank 0's next all-reduce does:
fail at once with gloo's "Connection closed by peer", or wait out the process group's timeout ("Timed out").

Why it matters: hpctrain's elastic jobs count on the survivors' collective failing when a node's processes die;
when it waits instead, the hang watchdog ends the wait after --hang-timeout (tests/test_elastic_slurm.py pauses its
survivor, and now and then its DOWN case takes that path; docs/benchmarks.md has the figures).

    python benchmarks/gloo_missed_close.py --trials 6 --timeout 10
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# One rank: all-reduce until an error, then print what happened as JSON (the loop count and how long the last
# all-reduce took). The file named by argv[4] appears once the ranks are going.
RANK = """
import datetime, json, sys, time
import torch, torch.distributed as dist
rank, port, timeout, ready = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + port, rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=timeout))
t, done = torch.ones(1000), 0
while True:
    started = time.monotonic()
    try:
        dist.all_reduce(t)
    except Exception as err:
        print(json.dumps({"ops": done, "last_s": time.monotonic() - started, "error": str(err)}), flush=True)
        break
    done += 1
    if done == 200:
        open(ready, "w").close()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trial(mode: str, timeout_s: float, folder: Path) -> dict[str, object]:
    """One trial: the two ranks, the kill (rank 0 stopped around it when `mode` is "stopped"), rank 0's verdict."""
    port, ready = str(free_port()), folder / f"ready-{time.monotonic_ns()}"
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(rank), port, str(timeout_s), str(ready)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            if time.monotonic() > deadline or any(r.poll() is not None for r in ranks):
                raise SystemExit("the two gloo ranks did not start")
            time.sleep(0.05)
        if mode == "stopped":
            os.kill(ranks[0].pid, signal.SIGSTOP)
            time.sleep(1.0)
        ranks[1].kill()
        ranks[1].wait()
        if mode == "stopped":
            time.sleep(1.0)
            os.kill(ranks[0].pid, signal.SIGCONT)
        out, _ = ranks[0].communicate(timeout=timeout_s + 60)
    finally:
        for r in ranks:
            if r.poll() is None:
                r.kill()
                r.wait()
    lines = out.strip().splitlines()
    if not lines:
        raise SystemExit(f"rank 0 ended (exit status {ranks[0].returncode}) without saying how its all-reduce ended")
    result = json.loads(lines[-1])
    error = str(result["error"])
    if "Timed out" in error:
        verdict = "timed out"
    elif "closed by peer" in error or "reset by peer" in error:
        verdict = "closed"
    else:
        verdict = "other"  # the error is in the JSON rows
    return {"mode": mode, "verdict": verdict, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=6, help="trials of each mode")
    parser.add_argument("--timeout", type=float, default=10.0, help="the process group's timeout, seconds")
    args = parser.parse_args()
    import torch

    print(f"torch {torch.__version__}, {args.trials} trial(s) a mode, process group timeout {args.timeout:g} s")
    with tempfile.TemporaryDirectory() as folder:
        rows = [trial(mode, args.timeout, Path(folder)) for _ in range(args.trials) for mode in ("running", "stopped")]
    for mode in ("running", "stopped"):
        mine = [r for r in rows if r["mode"] == mode]
        closed = [r for r in mine if r["verdict"] == "closed"]
        waits = ", ".join(f"{r['last_s']:.1f}" for r in mine)
        print(f"{mode:8} {len(closed)} of {len(mine)} saw the close at once; rank 0's last all-reduce took {waits} s")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
