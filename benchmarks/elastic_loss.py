"""A lost node's cost on the local 2-node Slurm cluster (issue 42): from the loss to the next training step, for an
elastic job that goes on within its allocation beside one that falls back to the requeue, in one run.

Both train the classic MNIST recipe on 2048 Fashion-MNIST images (batch 64: 32 steps an epoch), one process on each
of node1 and node2, a checkpoint every 8 steps, under torchrun (`--launcher torchrun --nproc-per-node 1
--max-restarts 2`). Once the first checkpoint exists, node2's torchrun agent and worker are SIGKILLed (the moment
taken as the loss); the figure is the time until a training process that did not exist before the loss writes its
first progress record of phase `training` (RUN/progress/rank-N.json, written at once on a change of phase, so at
the first step that process completes).

  elastic   `--nodes 1:2`: node1's torchrun restarts its worker group alone; it resumes from the checkpoint.
  requeue   `--nodes 2:3` (at MIN from the start: the cluster has 2 nodes): node1's torchrun cannot form a group
            of 2; torch's rendezvous gives up after its join timeout (--join-timeout, default 60 s, set through
            torchrun's own PET_RDZV_CONF; torch's default is 600 s; it must outlast the first round's 30 s last
            call), the batch script requeues the job, Slurm holds it (BeginTime, 30 s to 2 minutes here, not
            released by hand), and the next attempt resumes on both nodes.

The loss is seen at once here (the killed processes' sockets close, so the survivors' collective fails); a node that
stops answering without closing them is seen after --hang-timeout instead (the hang watchdog; --dist-timeout when that
is shorter), on both paths alike (benchmarks/gloo_missed_close.py: a survivor stopped while its peer died can miss
the close too).

    python benchmarks/elastic_loss.py --data-dir data            # hpctrain importable (or PYTHONPATH=src)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = [
    *("train", "mnist", "--recipe", "classic", "--dataset", "fashion-mnist", "--train-limit", "2048"),
    *("--test-limit", "200", "--threads", "1", "--log-interval", "2", "--checkpoint-every", "8", "--epochs", "2"),
]
OPTIONS = ["--launcher", "torchrun", "--nproc-per-node", "1", "--max-restarts", "2", "--time", "30"]
PATHS = {"elastic": ["--nodes", "1:2"], "requeue": ["--nodes", "2:3", "--no-check"]}


def job_processes(job_id: str, node: str) -> list[tuple[int, list[str]]]:
    """The job's torchrun agents and training processes on `node` (the local cluster's nodes are this host)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in environ and f"SLURMD_NODENAME={node}".encode() in environ:
            if any("torch.distributed" in a or a == "train" for a in argv):
                out.append((int(entry.name), argv))
    return out


def in_queue(job_id: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i"], capture_output=True, text=True).stdout
    return job_id in out.split()


def wait(what: str, job_id: str, check, timeout_s: float, log: Path):
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        if time.monotonic() > deadline or not in_queue(job_id):
            subprocess.run(["scancel", job_id], capture_output=True)
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
            raise SystemExit(f"job {job_id}: {what} never happened; its log ends:\n{tail}")
        time.sleep(0.1)
    return found


def first_step_after(run_dir: Path, before: set[int], since: float) -> float | None:
    """The `updated` time of the first training record of a process that did not exist at the loss."""
    for path in (run_dir / "progress").glob("rank-*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("phase") == "training" and record.get("pid") not in before and record["updated"] > since:
            return record["updated"]
    return None


def one(path: str, data_dir: Path, workdir: Path, join_timeout: int) -> dict[str, float | str]:
    env = {**os.environ, "PET_RDZV_CONF": f"join_timeout={join_timeout}"}
    submit = [sys.executable, "-m", "hpctrain", "submit", "--output", "job-%j.out", *OPTIONS, *PATHS[path]]
    train = [*TRAIN, "--data-dir", str(data_dir)]
    done = subprocess.run([*submit, "--sbatch=--hold", *train], cwd=workdir, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{path}: submit failed: {done.stderr.strip()}")
    job_id = done.stdout.strip()
    for command in (["update", f"JobId={job_id}", "NumNodes=2"], ["release", job_id]):  # both nodes, as a test
        subprocess.run(["scontrol", *command], check=True, capture_output=True)
    run_dir = workdir / "runs" / f"mnist-fashion-mnist-classic-{job_id}"
    checkpoints, log = run_dir / "checkpoints", workdir / f"job-{job_id}.out"
    wait("a first checkpoint", job_id, lambda: any(checkpoints.glob("checkpoint_step_*.pt")), 900, log)
    lost = wait("node2's processes", job_id, lambda: len(p := job_processes(job_id, "node2")) >= 2 and p, 300, log)
    before = {pid for node in ("node1", "node2") for pid, _ in job_processes(job_id, node)}
    loss = time.time()
    for pid, _ in lost:
        os.kill(pid, signal.SIGKILL)
    next_step = lambda: first_step_after(run_dir, before, loss)
    step = wait("a training step after the loss", job_id, next_step, 1200, log)
    while in_queue(job_id):
        time.sleep(1)
    said = log.read_text()
    return {"path": path, "job": job_id, "loss_to_next_step_s": round(step - loss, 1), "requeued": "requeueing" in said}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, help="where `hpctrain download fashion-mnist` put the data")
    parser.add_argument(
        "--join-timeout", type=int, default=60, help="torch's rendezvous join timeout, s (PET_RDZV_CONF)"
    )
    parser.add_argument("--paths", default="elastic,requeue", help="which paths, in order (default: both)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    data_dir = Path(args.data_dir).resolve()
    work = Path(tempfile.mkdtemp(prefix="elastic-loss-"))  # kept: the jobs' logs and run directories
    print(f"jobs' logs and run directories: {work}", file=sys.stderr)
    rows = [one(path, data_dir, work, args.join_timeout) for path in args.paths.split(",")]
    if args.json:
        print(json.dumps(rows))
        return
    print(f"| path | job | loss → next training step, s | requeued | (join timeout {args.join_timeout} s) |")
    print("|---|---:|---:|---|---|")
    for r in rows:
        print(f"| {r['path']} | {r['job']} | {r['loss_to_next_step_s']} | {r['requeued']} | |")


if __name__ == "__main__":
    main()
