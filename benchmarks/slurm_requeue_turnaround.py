"""Requeue turnaround: from the time-limit warning to the first training step of the next attempt, and the
steps of work lost on the way, for hpctrain's `train mnist` job and for submitit's checkpoint-and-requeue.

Both jobs train the same thing: the classic MNIST recipe (the pytorch/examples CNN, Adadelta, batch 64) on the
first 4096 Fashion-MNIST images, one process, one epoch of 64 steps, printing a line per step.

  hpctrain  `hpctrain submit --launcher single --time 10 train mnist ...`: the script asks for
            `--signal=B:USR1@120`; the batch shell forwards USR1 to the run, which checkpoints at the next step
            boundary and stops; the batch script requeues the job; the next attempt resumes from the checkpoint.
  submitit  a `submitit.helpers.Checkpointable` whose checkpoint() saves the same model and optimizer state;
            submitit asks for `--signal=USR2@90` (to the job step); its handler calls checkpoint(), requeues the
            job with scontrol and exits; the next attempt resumes from the file checkpoint() wrote.

Each job is warned after a few training steps with `hpctrain debug preempt JOB`, which sends exactly the signal
the job's script asks for, to the process Slurm would send it to. Slurm then holds a requeued job (reason
BeginTime) for about two minutes; the benchmark releases the hold the same way for both tools
(`scontrol update JobId=ID StartTime=now`, as soon as the job is seen held), so the figures leave that hold out.

Figures (seconds, medians; the clock is this script's, the job states and log lines are polled every --poll s):
  requeued      warning sent until Slurm shows the job requeued (restart count 1)
  restarted     requeued until the next attempt is RUNNING (includes our release of the BeginTime hold)
  first step    RUNNING until the next attempt's first training step is in the log (start-up, data, resume)
  total         warning sent until that first step
  steps lost    steps the first attempt logged as done minus the step the second attempt resumed at (max)

Needs the local cluster (scripts/local-slurm.sh up), `pip install submitit` (or `pip install -e '.[bench]'`)
and Fashion-MNIST where `hpctrain download fashion-mnist --data-dir DIR` puts it.

    python benchmarks/slurm_requeue_turnaround.py --data-dir data --runs 3
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

TRAIN_LIMIT = 4096
BATCH = 64
STEPS = TRAIN_LIMIT // BATCH
WARN_AFTER_STEPS = 5
TIME_LIMIT_MIN = 10

try:
    import submitit

    _Checkpointable: type = submitit.helpers.Checkpointable
except ImportError:  # reported by preflight(); the class below still has to be definable
    submitit = None
    _Checkpointable = object


class SubmititTrainer(_Checkpointable):
    """hpctrain's classic MNIST recipe trained the way submitit's documentation shows: state kept on the object,
    saved by checkpoint() (which submitit calls from its signal handler), reloaded by __call__ after a requeue."""

    def __init__(self, data_dir: str, checkpoint_path: str) -> None:
        self.data_dir = data_dir
        self.checkpoint_path = checkpoint_path
        self._live = None  # (model, optimizer, step) while training; never pickled

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_live"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._live = None

    def __call__(self) -> int:
        import torch

        from hpctrain.recipes import get_recipe

        recipe = get_recipe("mnist", "classic")
        data = recipe.load_data("fashion-mnist", self.data_dir, torch.device("cpu"), TRAIN_LIMIT)
        torch.manual_seed(0)
        model = recipe.build_model()
        optimizer = recipe.build_optimization(model, 1.0, 1, STEPS).optimizer
        step = 0
        if os.path.exists(self.checkpoint_path):
            state = torch.load(self.checkpoint_path, weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            step = int(state["step"])
            print(f"resumed at step {step}", flush=True)
        model.train()
        self._live = [model, optimizer, step]
        while self._live[2] < STEPS:
            i = self._live[2] * BATCH
            loss = recipe.loss(model(data.train_images[i : i + BATCH]), data.train_labels[i : i + BATCH])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            self._live[2] += 1
            print(f"step {self._live[2]}", flush=True)
        return self._live[2]

    def checkpoint(self, *args, **kwargs):
        import torch

        if self._live is not None:
            model, optimizer, step = self._live
            tmp = self.checkpoint_path + ".tmp"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
            os.replace(tmp, self.checkpoint_path)
            print(f"checkpoint at step {step}", flush=True)
        return super().checkpoint(*args, **kwargs)


@dataclass
class Run:
    tool: str
    job_id: str = ""
    log: Path | None = None
    warned: float = math.nan
    requeued: float = math.nan
    running: float = math.nan
    first_step: float = math.nan
    steps_before: int | None = None  # last step the first attempt logged
    resumed_at: int | None = None
    busy: bool = False
    ok: bool = False
    note: str = ""

    @property
    def lost(self) -> int | None:
        if self.steps_before is None or self.resumed_at is None:
            return None
        return self.steps_before - self.resumed_at


def scontrol_fields(job_id: str) -> dict[str, str] | None:
    """`scontrol show job` as a dict; {} once the controller forgot the job; None when scontrol failed (a busy
    controller times out now and then: ask again)."""
    result = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    if result.returncode != 0:
        return {} if "invalid job id" in result.stderr.lower() else None
    return dict(word.split("=", 1) for word in result.stdout.split() if "=" in word)


def wait_for_quiet_cluster(limit_s: float) -> bool:
    """Wait (up to limit_s) until no job is queued or running; True when others are still there."""
    deadline = time.monotonic() + limit_s
    while subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split():
        if time.monotonic() > deadline:
            return True
        time.sleep(1.0)
    return False


@dataclass(frozen=True)
class LogFormat:
    """How a tool's job log shows training steps and the second attempt."""

    step: re.Pattern[str]  # group 1: the global step just done
    second_attempt: re.Pattern[str]  # where the second attempt's output starts
    resumed: re.Pattern[str]  # group 1: the step the second attempt resumed at


HPCTRAIN_LOG = LogFormat(
    step=re.compile(r"^epoch \d+/\d+ step (\d+)/\d+ ", re.M),  # one epoch: step in epoch == global step
    second_attempt=re.compile(r"^hpctrain: job \d+ attempt 2 ", re.M),
    resumed=re.compile(r"resumed at epoch \d+, step \d+ of \d+ \(global step (\d+)\)"),
)
SUBMITIT_LOG = LogFormat(
    step=re.compile(r"^step (\d+)$", re.M),
    second_attempt=re.compile(r"^resumed at step \d+$", re.M),
    resumed=re.compile(r"^resumed at step (\d+)$", re.M),
)


def read(path: Path | None) -> str:
    return path.read_text(errors="replace") if path is not None and path.exists() else ""


def follow(run: Run, fmt: LogFormat, hpctrain: list[str], poll_s: float, timeout_s: float) -> None:
    """Warn the job after a few steps, release its BeginTime hold, and time the way to the next first step."""
    deadline = time.monotonic() + timeout_s
    while len(fmt.step.findall(read(run.log))) < WARN_AFTER_STEPS:
        if (
            time.monotonic() > deadline
            or (fields := scontrol_fields(run.job_id)) == {}
            or (fields and fields.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING"))
        ):
            run.note = "training did not get going"
            return
        time.sleep(poll_s)
    warn = subprocess.run([*hpctrain, "debug", "preempt", run.job_id], capture_output=True, text=True)
    t0 = time.monotonic()
    if warn.returncode != 0:
        run.note = f"debug preempt failed: {warn.stderr.strip()}"
        return
    run.warned = 0.0
    last_release = -math.inf
    while True:
        now = time.monotonic()
        if now > deadline:
            run.note = f"no first step of the next attempt within {timeout_s:g} s"
            return
        fields = scontrol_fields(run.job_id)
        now = time.monotonic() - t0
        if fields == {}:
            run.note = "the job ended without a second attempt"
            return
        if fields:
            restarts = int(fields.get("Restarts", "0"))
            state = fields.get("JobState")
            if restarts >= 1 and math.isnan(run.requeued):
                run.requeued = now
            if restarts >= 1 and state == "PENDING" and fields.get("Reason") == "BeginTime" and now - last_release > 2:
                subprocess.run(["scontrol", "update", f"JobId={run.job_id}", "StartTime=now"], capture_output=True)
                last_release = now
            if restarts >= 1 and state == "RUNNING" and math.isnan(run.running):
                run.running = now
            if restarts == 0 and state not in ("RUNNING", "COMPLETING", "PENDING", "REQUEUED", "REQUEUE_HOLD"):
                run.note = f"the job ended {state} instead of requeueing"
                return
        text = read(run.log)
        second = fmt.second_attempt.search(text)
        if second and fmt.step.search(text, second.end()):
            run.first_step = time.monotonic() - t0
            if math.isnan(run.running):
                run.running = run.first_step
            before = fmt.step.findall(text, 0, second.start())
            run.steps_before = int(before[-1]) if before else None
            resumed = fmt.resumed.search(text)
            run.resumed_at = int(resumed.group(1)) if resumed else None
            break
        time.sleep(poll_s)
    # Let the job finish (it is short), so runs do not overlap and a failed resume shows.
    while (fields := scontrol_fields(run.job_id)) is None or (
        fields
        and fields.get("JobState") not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
    ):
        if time.monotonic() > deadline:
            run.note = "the second attempt did not end in time"
            return
        time.sleep(0.5)
    run.ok = fields == {} or fields.get("JobState") == "COMPLETED"
    if not run.ok:
        run.note = f"the second attempt ended {fields.get('JobState')}"


def run_hpctrain(args: argparse.Namespace, hpctrain: list[str], workdir: Path) -> Run:
    run = Run("hpctrain", busy=wait_for_quiet_cluster(120))
    argv = [
        *hpctrain,
        "submit",
        "--launcher",
        "single",
        "--time",
        str(TIME_LIMIT_MIN),
        "--job-name",
        "bench-requeue",
        "--output",
        "hpctrain-%j.out",
        "train",
        "mnist",
        "--recipe",
        "classic",
        "--dataset",
        "fashion-mnist",
        "--data-dir",
        str(args.data_dir),
        "--train-limit",
        str(TRAIN_LIMIT),
        "--batch-size",
        str(BATCH),
        "--epochs",
        "1",
        "--checkpoint-every",
        "0",
        "--log-interval",
        "0",
    ]
    result = subprocess.run(argv, cwd=workdir, capture_output=True, text=True)
    if result.returncode != 0 or not result.stdout.strip().isdigit():
        run.note = f"submit failed: {result.stderr.strip()}"
        return run
    run.job_id = result.stdout.strip()
    run.log = workdir / f"hpctrain-{run.job_id}.out"
    follow(run, HPCTRAIN_LOG, hpctrain, args.poll, args.timeout)
    return run


def run_submitit(args: argparse.Namespace, hpctrain: list[str], workdir: Path) -> Run:
    run = Run("submitit", busy=wait_for_quiet_cluster(120))
    folder = workdir / "submitit"
    executor = submitit.AutoExecutor(folder=str(folder / "%j"), cluster="slurm")
    executor.update_parameters(
        name="bench-requeue",
        timeout_min=TIME_LIMIT_MIN,
        nodes=1,
        tasks_per_node=1,
        cpus_per_task=1,
        slurm_partition=args.partition,
    )
    checkpoint = folder / f"checkpoint-{time.time_ns()}.pt"
    folder.mkdir(parents=True, exist_ok=True)
    job = executor.submit(SubmititTrainer(str(Path(args.data_dir).resolve()), str(checkpoint)))
    run.job_id = str(job.job_id)
    run.log = folder / run.job_id / f"{run.job_id}_0_log.out"
    follow(run, SUBMITIT_LOG, hpctrain, args.poll, args.timeout)
    return run


def median(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    return f"{statistics.median(values):.1f}" if values else "n/a"


def table(runs: list[Run]) -> str:
    lines = [
        "| tool | runs ok | requeued | restarted | first step | total, median | total, min–max | steps lost (max) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for tool in ("hpctrain", "submitit"):
        mine = [r for r in runs if r.tool == tool]
        ok = [r for r in mine if r.ok]
        totals = [r.first_step for r in ok]
        lost = [r.lost for r in ok if r.lost is not None]
        lines.append(
            f"| {tool} | {len(ok)}/{len(mine)} | {median([r.requeued for r in ok])} | "
            f"{median([r.running - r.requeued for r in ok])} | {median([r.first_step - r.running for r in ok])} | "
            f"{median(totals)} | {f'{min(totals):.1f}–{max(totals):.1f}' if totals else 'n/a'} | "
            f"{max(lost) if lost else 'n/a'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data-dir",
        required=True,
        type=Path,
        help="holds fashion-mnist/ as `hpctrain download fashion-mnist --data-dir DIR` leaves it",
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per tool (default 3)")
    parser.add_argument("--partition", default="debug", help="partition for the submitit job (default debug)")
    parser.add_argument("--poll", type=float, default=0.1, metavar="S", help="poll interval (default 0.1 s)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S", help="give up on a run after S seconds")
    parser.add_argument(
        "--workdir", type=Path, help="where jobs run (default: a temporary directory visible to the compute nodes)"
    )
    args = parser.parse_args(argv)

    problems = [
        f"{tool} is not on PATH: start the local cluster with scripts/local-slurm.sh up"
        for tool in ("sbatch", "scontrol", "squeue", "scancel")
        if shutil.which(tool) is None
    ]
    if submitit is None:
        problems.append("submitit is not installed: pip install submitit (or pip install -e '.[bench]')")
    if not (args.data_dir / "fashion-mnist").is_dir():
        problems.append(
            f"{args.data_dir}/fashion-mnist is missing: hpctrain download fashion-mnist --data-dir {args.data_dir}"
        )
    if problems:
        sys.exit("cannot run the benchmark:\n  " + "\n  ".join(problems))
    args.data_dir = args.data_dir.resolve()
    exe = shutil.which("hpctrain")
    hpctrain = [exe] if exe else [sys.executable, "-m", "hpctrain"]
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="slurm-requeue-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)

    runs: list[Run] = []
    order = []
    for i in range(args.runs):  # ABBA, so drift in the shared machine's load hits both alike
        order += [run_hpctrain, run_submitit] if i % 2 == 0 else [run_submitit, run_hpctrain]
    for step in order:
        run = step(args, hpctrain, workdir)
        runs.append(run)
        status = "ok" if run.ok else f"FAILED ({run.note})"
        print(
            f"{run.tool:8} job {run.job_id or '-':>6}: requeued {run.requeued:5.1f} s, running {run.running:5.1f} s, "
            f"first step {run.first_step:5.1f} s, lost {run.lost} step(s) {status}"
            f"{' (other jobs were on the cluster)' if run.busy else ''}",
            file=sys.stderr,
            flush=True,
        )

    print(
        f"\nWarning to the next attempt's first training step (seconds after the warning was sent; {args.runs} runs "
        f"per tool; BeginTime hold released at once for both; output in {workdir})\n"
    )
    print(table(runs))
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
