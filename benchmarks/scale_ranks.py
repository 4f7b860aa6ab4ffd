"""What hpctrain's own collectives cost each rank, counted at 2 to N local gloo processes, and how it grows
(issue 32): the stop vote's side group, the roll call after a failed collective, and a checkpoint's save.

Each size runs real torch.distributed processes (gloo on the CPU) whose rendezvous store counts every request on its
way (a `torch.distributed.Store` around a FileStore) and which count their open sockets (/proc/self/fd) and the
bytes their collectives bring them. In each rank:

- vote: the stop vote's side group made as on a GPU job (the default group here is gloo registered for CUDA
  tensors only, as NCCL), then three votes: new sockets and store requests;
- roll call: `missing_ranks` with the last rank gone (it takes no part): store requests by kind;
- checkpoint: `training.loop_state.save` of a small model: bytes received through collectives, the size of
  the checkpoint file rank 0 writes, and the files a resumed rank opens for its own part.

Counts, not times: they do not depend on the machine's load. Each figure is the most one rank paid (one line: all
ranks together); the fit is the exponent of its growth between the smallest and the largest size (0: constant,
1: linear). A ring has 1 peer at 2 ranks and 2 from 3 on, so the vote's figures settle from N=4.

    python benchmarks/scale_ranks.py                        # 2, 4, 8 processes
    python benchmarks/scale_ranks.py --compare OLD/src      # the same beside another source tree
    python benchmarks/scale_ranks.py --sizes 2,4 --json     # each rank's counts, one JSON object (the tests' form)

OLD/src: e.g. `git archive COMMIT src | tar -x -C OLD`. Needs hpctrain importable (or PYTHONPATH=src).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = r"""
import collections, datetime, json, os, stat, sys, time
from pathlib import Path
from types import SimpleNamespace
import torch, torch.distributed as dist
from hpctrain import checkpoint
from hpctrain.distributed.failures import announce, missing_ranks
from hpctrain.training import StopReason, agree, vote_group
try:
    from hpctrain.training import loop_state
except ImportError:  # the code before issue 30's renames (--compare OLD_SRC): training/checkpoints.py
    from hpctrain.training import checkpoints as loop_state
from hpctrain.training.run import Position

class CountingStore(dist.Store):  # every request to the rendezvous store, counted by kind on its way
    def __init__(self, inner):
        super().__init__()
        self.inner, self.requests = inner, collections.Counter()
    def _count(self, method, *args):
        self.requests[method] += 1
        return getattr(self.inner, method)(*args)
    def set(self, key, value): return self._count("set", key, value)
    def get(self, key): return self._count("get", key)
    def add(self, key, value): return self._count("add", key, value)
    def check(self, keys): return self._count("check", keys)
    def compare_set(self, key, expected, desired): return self._count("compare_set", key, expected, desired)
    def delete_key(self, key): return self._count("delete_key", key)
    def wait(self, keys, timeout=None): return self._count("wait", keys, *([timeout] if timeout else []))
    def num_keys(self): return self.inner.num_keys()
    def set_timeout(self, timeout): return self.inner.set_timeout(timeout)

def sockets():  # this process's open sockets (an fd may close between the listing and the look)
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return count

received = [0]
def counted(function, outputs):  # the bytes a collective brings this rank
    def call(*args, **kwargs):
        result = function(*args, **kwargs)
        received[0] += sum(t.numel() * t.element_size() for t in outputs(args, kwargs))
        return result
    return call

def cuda_only(store, rank, size, timeout):  # gloo's transport known to torch for CUDA tensors only, as NCCL:
    return dist.ProcessGroupGloo(store, rank, size, timeout)  # the vote must make its own gloo group

dist.Backend.register_backend("cudaonly", cuda_only, devices=["cuda"])
folder, rank, size = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
store = CountingStore(dist.FileStore(str(folder / "store"), size))
dist.init_process_group("cudaonly", store=store, rank=rank, world_size=size, timeout=datetime.timedelta(seconds=60))
env = SimpleNamespace(rank=rank, world_size=size, is_distributed=True)
announce(env)
before = sockets(), sum(store.requests.values())
reasons = [agree(StopReason.CANCELLED if rank == size - 1 and vote == 1 else StopReason.NONE).label
           for vote in range(3)]
result = {"vote_sockets": sockets() - before[0], "vote_requests": sum(store.requests.values()) - before[1],
          "reasons": reasons}
took = []  # a vote's latency, back to back: gloo's ring, 2 (N - 1) hops
for _ in range(30):
    started = time.perf_counter()
    agree(StopReason.NONE)
    took.append(time.perf_counter() - started)
result["vote_ms"] = sorted(took)[len(took) // 2] * 1e3

# The checkpoint's closing barrier would run on the default group, NCCL on a GPU job, which this stand-in of it
# cannot run on the CPU: here it runs on the vote's gloo group (a barrier brings no bytes either way).
loop_state.barrier = lambda: dist.barrier(group=vote_group())
if hasattr(loop_state, "all_gather_object"):  # the code before issue 32 (--compare): its gather, likewise
    from hpctrain.distributed import all_gather_object
    loop_state.all_gather_object = lambda obj: all_gather_object(obj, group=vote_group())
dist.all_gather = counted(dist.all_gather, lambda a, k: a[0])
dist.all_reduce = counted(dist.all_reduce, lambda a, k: [a[0]])
dist.broadcast = counted(dist.broadcast, lambda a, k: [a[0]])
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
optimization = SimpleNamespace(optimizer=optimizer, scheduler=torch.optim.lr_scheduler.StepLR(optimizer, 1),
                               scaler=None)
run = SimpleNamespace(env=env, is_main=rank == 0, lock=None, run_dir=folder, writer=None,
                      cfg=SimpleNamespace(to_dict=lambda: {}, keep_checkpoints=None))
loop_state.save(run, SimpleNamespace(model=model, optimization=optimization),
                 Position(epoch=0, step=7, step_in_epoch=7, loss_sum=float(rank)), end_of_epoch=False)
path = folder / "checkpoints" / "checkpoint_step_7.pt"
result["checkpoint_received"] = received[0]
result["checkpoint_bytes"] = path.stat().st_size
if hasattr(loop_state, "load_own_part"):  # not in the code before issue 32, whose file held every rank's part
    state, opened, real_open = checkpoint.load(path), [], os.open
    def counting_open(file, *args, **kwargs):  # the files read; the folders opened on the way (no links) are none
        fd = real_open(file, *args, **kwargs)
        if stat.S_ISREG(os.fstat(fd).st_mode):
            opened.append(os.path.basename(file))
        return fd
    os.open = counting_open
    loop_state.load_own_part(state, path, rank)  # what a resumed rank reads besides the checkpoint file
    os.open = real_open
    part, saved = loop_state.saved_part(state, rank)
    result["resume_opened"] = opened
    result["resumed"] = [saved, part["loss_sum"], state["ranks"]["loss_sum_mean"]]

if rank < size - 1:  # the last rank is the one gone: it takes no part in the roll call
    before = collections.Counter(store.requests)
    result["missing"] = {str(r): bool(host) for r, host in missing_ranks(env, 1.0).items()}
    result["roll_call"] = dict(store.requests - before)
print(json.dumps(result), flush=True)
os._exit(0)  # no shutdown handshake: the last rank is "gone"
"""


def run_size(size: int, src: str | None) -> list[dict]:
    """Each rank's counts at `size` processes, in rank order; `src`: the hpctrain source tree to import."""
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    if src:
        environ["PYTHONPATH"] = src
    with tempfile.TemporaryDirectory(prefix="scale-ranks-") as folder:
        script = Path(folder) / "worker.py"
        script.write_text(WORKER)
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), folder, str(rank), str(size)],
                env=environ,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in range(size)
        ]
        results = []
        try:
            for proc in procs:
                out, err = proc.communicate(timeout=600)
                if proc.returncode != 0:
                    raise SystemExit(f"rank {len(results)} of {size} failed:\n{err}")
                results.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for proc in procs:
                proc.kill()
        return results


def per_rank(results: list[dict]) -> dict[str, float]:
    """The figures of one size: the most any rank paid (rank 0's file)."""
    survivors = [r for r in results if "roll_call" in r]
    return {
        "vote group: new sockets": max(r["vote_sockets"] for r in results),
        "vote group: store requests": max(r["vote_requests"] for r in results),
        "vote: ms a vote (median; the fastest rank's)": min(r["vote_ms"] for r in results),
        "roll call: key checks": max(r["roll_call"].get("check", 0) for r in survivors),
        "roll call: key checks, all ranks together": sum(r["roll_call"].get("check", 0) for r in survivors),
        "checkpoint: bytes received": max(r["checkpoint_received"] for r in results),
        "checkpoint: file bytes (rank 0)": results[0]["checkpoint_bytes"],
    }


def growth(first: float, last: float, n0: int, n1: int) -> str:
    if first <= 0 or last <= 0:
        return "-"
    return f"N^{math.log(last / first) / math.log(n1 / n0):.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,4,8", help="process counts, comma-separated")
    parser.add_argument("--compare", metavar="OLD_SRC", help="also count with the hpctrain under this source folder")
    parser.add_argument("--json", action="store_true", help="print each rank's counts by size, as JSON")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.json:
        print(json.dumps({size: run_size(size, None) for size in sizes}))
        return 0
    trees = [("now", None)] + ([("before", args.compare)] if args.compare else [])
    for label, src in trees:
        figures = {size: per_rank(run_size(size, src)) for size in sizes}
        where = f" ({src})" if src else ""
        print(f"\n{label}{where}: the most one rank paid, at {', '.join(map(str, sizes))} processes")
        print("| what | " + " | ".join(f"N={n}" for n in sizes) + " | growth |")
        print("|---|" + "---:|" * len(sizes) + "---|")
        for name in figures[sizes[0]]:
            row = [figures[n][name] for n in sizes]
            print(
                f"| {name} | "
                + " | ".join(f"{v:,.2f}" if name.startswith("vote: ms") else f"{v:,.0f}" for v in row)
                + f" | {growth(row[0], row[-1], sizes[0], sizes[-1])} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
