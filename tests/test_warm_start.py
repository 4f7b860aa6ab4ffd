"""The test harness's warm start (tests/warm_start.py) behaves as a fresh `python -m hpctrain`: the same exit
status, output on the same streams, the working directory and environment the test gave, death by a signal, and a
fresh interpreter wherever the environment asks for one at start-up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import warm_start
from training_helpers import QUICK, clean_environ, run_torchrun, torchrun

pytestmark = pytest.mark.skipif(not warm_start.enabled(), reason="warm start is off (HPCTRAIN_TEST_WARM_START=0)")


def fresh(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "args, variables, directories",
    [
        (["--version"], {}, []),
        (["no-such-command"], {}, []),  # exit 2, usage on stderr
        (["status"], {"HPCTRAIN_SCHEDULER": "nonsense"}, []),  # read from the environment the test gave
        (["cluster", "--scheduler", "kubernetes"], {"KUBECONFIG": "no-such-file"}, []),  # read at import, redone
        (["train", "mnist", "--data-dir", "data", "--run-dir", "run"], {}, []),  # ./data missing: names the fix
        (["train", "mnist", "--data-dir", "data", "--run-dir", "run"], {}, ["data"]),  # ./data there, empty
    ],
)
def test_a_warm_command_answers_as_a_fresh_one(tmp_path, args, variables, directories):
    for name in directories:
        (tmp_path / name).mkdir()
    env = {**clean_environ(), "HPCTRAIN_HOME": str(tmp_path / "home"), **variables}
    warm = warm_start.popen(args, tmp_path, env, merge_stderr=False, baseline=clean_environ())
    assert isinstance(warm, warm_start.WarmProcess), "the harness did not start this command warm"
    out, err = warm.communicate(timeout=120)
    expected = fresh(args, tmp_path, env)
    assert (warm.returncode, out, err) == (expected.returncode, expected.stdout, expected.stderr)
    assert warm.returncode != 0 or args == ["--version"]


def test_a_signal_ends_a_warm_command_as_it_ends_a_fresh_one(tmp_path, fashion_data_dir):
    args = ["train", "mnist", *QUICK, "--data-dir", str(fashion_data_dir), "--run-dir", "run", "--epochs", "50"]
    env = {**clean_environ(), "PYTHONUNBUFFERED": "1"}
    process = warm_start.popen(args, tmp_path, env, merge_stderr=True, baseline=clean_environ())
    assert isinstance(process, warm_start.WarmProcess)
    for line in process.stdout:
        if "TensorBoard" in line:
            break
    assert Path(f"/proc/{process.pid}/cwd").resolve() == tmp_path.resolve()
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL


def test_a_startup_variable_gets_a_fresh_interpreter(tmp_path):
    env = {**clean_environ(), "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    (tmp_path / "sitecustomize.py").write_text("print('fresh start', flush=True)\n")
    process = warm_start.popen(["--version"], tmp_path, env, merge_stderr=False, baseline=clean_environ())
    assert not isinstance(process, warm_start.WarmProcess)
    out, _ = process.communicate(timeout=60)
    assert out.startswith("fresh start")


def test_a_changed_worker_environment_still_starts_warm(tmp_path, monkeypatch):
    # An in-process test may leave a start-up variable behind in the worker (hpctrain sets TORCH_NCCL_* defaults when
    # it prepares a run): later commands get a warm process made in the new environment, not fresh ones for good.
    warm_start.run(["--version"], tmp_path, clean_environ(), timeout=60, baseline=clean_environ())
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "50")
    process = warm_start.popen(["--version"], tmp_path, clean_environ(), merge_stderr=False, baseline=clean_environ())
    assert isinstance(process, warm_start.WarmProcess)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0 and out.strip()


# ---- torchrun's workers, started warm by tests/warm_worker.py

WORKER = """
import os, sys, time
line = f"rank {os.environ['RANK']}: {sys.argv[1:]} in {os.getcwd()}, preloaded {'torch' in sys.modules}\\n"
os.write(1, line.encode())  # one write: under -u, print() writes the text and its newline apart, and ranks interleave
if sys.argv[1] == "sleep":
    time.sleep(600)
if os.environ["RANK"] == "0":
    open(f"wrote-{os.getpid()}", "w").close()  # rank 1 fails only after this: torchrun then ends rank 0
    sys.exit(0)
deadline = time.monotonic() + 60
while not any(name.startswith("wrote-") for name in os.listdir(".")) and time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(int(sys.argv[1]))
"""
TWO_WORKERS = ["--standalone", "--nproc-per-node", "2", "--max-restarts", "0"]


def test_torchrun_workers_started_warm_answer_as_fresh_ones(tmp_path, monkeypatch):
    (tmp_path / "worker.py").write_text(WORKER)
    results = {}
    for warm in ("1", "0"):
        monkeypatch.setenv("HPCTRAIN_TEST_WARM_START", warm)
        for marker in tmp_path.glob("wrote-*"):  # the run before's: rank 1 waits for this run's rank 0
            marker.unlink()
        result = run_torchrun(TWO_WORKERS, ["worker.py"], ["3"], cwd=tmp_path, timeout=120)
        lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank "))
        results[warm] = (result.returncode, lines, "exitcode  : 3 " in result.stderr)
    assert results["1"][1] == [f"rank {r}: ['3'] in {tmp_path}, preloaded True" for r in (0, 1)]  # forks: warm
    assert results["0"][1] == [f"rank {r}: ['3'] in {tmp_path}, preloaded False" for r in (0, 1)]
    assert results["1"][0] == results["0"][0] != 0 and results["1"][2] and results["0"][2]


def test_a_killed_warm_worker_takes_its_training_process_with_it(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    agent = torchrun(TWO_WORKERS, ["worker.py"], ["sleep"], cwd=tmp_path)
    try:
        for line in agent.stdout:
            if "rank 1:" in line:
                break
        stand_in = next(
            int(p.name)
            for p in Path("/proc").iterdir()
            if p.name.isdigit()
            and f"PPid:\t{agent.pid}\n" in _read(p / "status")
            and b"RANK=1\0" in _raw(p / "environ")
        )
        worker = warm_start.worker_pid(stand_in)
        assert worker != stand_in and Path(f"/proc/{worker}").exists()
        os.kill(stand_in, signal.SIGKILL)  # what torchrun's agent does last to a worker that will not stop
        agent.wait(timeout=120)
        assert not Path(f"/proc/{worker}").exists() or "State:\tZ" in _read(Path(f"/proc/{worker}/status"))
    finally:
        if agent.poll() is None:
            agent.kill()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _raw(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
