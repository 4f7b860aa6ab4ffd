"""Every job command goes through the Scheduler interface (issue 19): each backend offers all of it, the CLI names
no scheduler, nothing below the CLI imports it, and what a command prints in a scheduler's own words comes from
that backend. The commands run as a user runs them (`python -m hpctrain`); nothing here needs a cluster."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hpctrain
from hpctrain.schedulers import SCHEDULERS, backend_info, base
from hpctrain.schedulers.slurm.queries.job_states import JobInfo
from hpctrain.schedulers.slurm.scheduler import SlurmScheduler, job_status
from training_helpers import run_hpctrain

SRC = Path(hpctrain.__file__).parent
# The job commands and their shared flag module (dev, top and tensorboard are the services' commands).
JOB_COMMANDS = ("submit", "check", "status", "logs", "cancel", "cluster", "debug")
ENGINE = ("scheduling", "job_options", "submission")  # under both faces: it names no scheduler either


def hpctrain_cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_hpctrain(*args, cwd=cwd, env={**os.environ, **env})


def test_every_backend_offers_the_whole_interface() -> None:
    members = [name for name, _ in inspect.getmembers(base.Scheduler) if not name.startswith("_")]
    members += list(base.Scheduler.__annotations__)
    assert {"local_check", "status_view", "cluster_view", "cancel_and_wait", "preempt"} <= set(members)
    for name, module in SCHEDULERS.items():
        sched = __import__(module, fromlist=["create"])
        cls = {"slurm": SlurmScheduler}.get(name) or __import__(
            f"{module}.scheduler", fromlist=["x"]
        ).KubernetesScheduler
        missing = [m for m in members if not hasattr(cls, m)]
        assert missing == [], f"{name} lacks {missing}"
        assert sched.INFO.name == name and backend_info(name) is sched.INFO


def test_the_job_commands_name_no_scheduler() -> None:
    """Only the --scheduler flag's choices and help may say "slurm"/"kubernetes" (the choices come from the
    registry, so not even they do)."""
    hits = [
        f"{path.name}:{n}: {line.strip()}"
        for path in [
            *(SRC / "cli" / f"{name}.py" for name in JOB_COMMANDS),
            *(SRC / "engine" / f"{n}.py" for n in ENGINE),
        ]
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\"(slurm|kubernetes)\"", line)
    ]
    assert hits == []


LOWER_LAYERS = """
import importlib, pkgutil, sys
import hpctrain.schedulers, hpctrain.servers
for package in (hpctrain.schedulers, hpctrain.servers):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(info.name)
# The Kubernetes local check of a recipe job parses nothing itself: the caller hands it the recipe's config.
from hpctrain.jobs.spec import JobSpec
from hpctrain.config import TrainConfig
from hpctrain.schedulers.kubernetes.checks.submit_host import local_problems
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
job = JobSpec(command=("hpctrain", "train", "mnist"), run_dir="runs/%j")
lines = local_problems(job, KubernetesOptions(image="img"), TrainConfig(data_dir=sys.argv[1]))
print(sorted(m for m in sys.modules if m == "hpctrain.cli" or m.startswith("hpctrain.cli.")))
print(lines)
"""


def test_no_scheduler_or_service_module_imports_the_cli(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", LOWER_LAYERS, str(tmp_path)], capture_output=True, text=True, timeout=300, check=True
    )
    loaded, lines = proc.stdout.splitlines()
    assert loaded == "[]"
    assert "skipped the check for dataset" in lines  # the data dir is on no --volume: said, not checked


def test_slurm_says_the_wait_in_its_own_words() -> None:
    sched = SlurmScheduler()
    held = job_status(JobInfo(job_id="7", name="x", state="PENDING", reason="BeginTime", restarts=1))
    assert sched.progress(held) == "PENDING (BeginTime), attempt 2"
    done = job_status(JobInfo(job_id="7", name="x", state="TIMEOUT", exit_code=0))
    assert (done.state, done.shown_state, done.finished) == (base.FAILED, "TIMEOUT", True)
    assert base.progress(held) == "PENDING (BeginTime), 1 restart(s)"  # the neutral words (Kubernetes)


def test_debug_preempt_goes_to_the_chosen_scheduler(tmp_path: Path) -> None:
    proc = hpctrain_cli("debug", "preempt", "j", "--scheduler", "kubernetes", cwd=tmp_path, HPCTRAIN_NAMESPACE="ns")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        "a Kubernetes job's time-limit warning comes from its own timer in the pods (--time), not from outside"
        in proc.stderr
    )
    signal = hpctrain_cli("debug", "preempt", "j", "--scheduler", "kubernetes", "--signal", "USR1", cwd=tmp_path)
    assert "--signal is a Slurm option but the job goes to kubernetes" in signal.stderr


@pytest.mark.parametrize("flag,hint", [("--partition", "--node-selector"), ("--venv", "--image")])
def test_a_foreign_flag_is_refused_with_the_chosen_backends_way(tmp_path: Path, flag: str, hint: str) -> None:
    proc = hpctrain_cli(
        "submit",
        "--dry-run",
        "--scheduler",
        "kubernetes",
        "--image",
        "img",
        flag,
        "x",
        "--",
        "python3",
        "x.py",
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{flag} is a Kubernetes option" not in proc.stderr
    assert (
        f"{flag} is a Slurm option but the job goes to kubernetes: drop {flag} (" in proc.stderr and hint in proc.stderr
    )


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_backend_offers_the_whole_services_interface_through_its_scheduler(name: str) -> None:
    """`dev`, `tensorboard --on-cluster`, `top`, `debug stacks` and `cancel` of a service reach a backend's services
    through the one registry (get_scheduler(name).services()), and each backend's offer all of Services."""
    from hpctrain.schedulers import get_scheduler
    from hpctrain.schedulers.service_api import Services

    services = get_scheduler(name, **({"namespace": "team-a"} if name == "kubernetes" else {})).services()
    members = [m for m, _ in inspect.getmembers(Services) if not m.startswith("_")] + list(Services.__annotations__)
    assert {"dev_render", "dev_start", "tensorboard", "top", "stacks", "stop"} <= set(members)
    assert [m for m in members if not hasattr(services, m)] == []
    assert services.name == name
    assert type(services).__module__.startswith(f"{SCHEDULERS[name]}.services.")  # in the backend's own package
