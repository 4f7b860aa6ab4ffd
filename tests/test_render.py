"""render_sbatch: golden files for every launcher x environment x resource kind, bash -n + shellcheck on each,
and the rendered script executed by bash with stand-ins for srun/scontrol/torchrun (no Slurm needed here; the
real cluster runs the same scripts in test_submit_slurm.py) to prove that quoting, signal forwarding and the
requeue decision work."""

from __future__ import annotations

import difflib
import json
import re
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dataclasses import replace

from hpctrain.distributed.ports import job_port
from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.jobs.values import parse_time_limit
from hpctrain.schedulers.slurm.batch.options import FILE_KEYS, EnvironmentSpec, SlurmOptions
from hpctrain.schedulers.slurm.batch.requeue import helper_lines
from hpctrain.schedulers.slurm.batch.script import render_sbatch, sbatch_argv, step_command, submit
from hpctrain.schedulers.slurm.batch.torchrun_shim import TORCHRUN_SHIM

GOLDEN_DIR = Path(__file__).parent / "golden" / "slurm"
UPDATE = os.environ.get("HPCTRAIN_UPDATE_GOLDEN") == "1"

ENVIRONMENTS = {
    "none": EnvironmentSpec(),
    "modules": EnvironmentSpec(kind="modules", modules=("cuda/12.4", "nccl")),
    "conda": EnvironmentSpec(kind="conda", conda_env="hpctrain"),
    "venv": EnvironmentSpec(kind="venv", venv="~/venvs/hpctrain"),
    "apptainer": EnvironmentSpec(kind="apptainer", image="images/pytorch.sif", mounts=("/scratch:/scratch",)),
    "pyxis": EnvironmentSpec(
        kind="pyxis",
        image="registry.example.com#team/pytorch:24.01-py3",
        mounts=("/scratch:/scratch",),
        workdir="/workspace",
    ),
}
RESOURCES = {"cpu": {}, "gpu2": {"gpus_per_node": 2}, "shard16": {"shards_per_node": 16}}
# Environment kind none runs hpctrain and torchrun with the submitting interpreter (sys.executable at submit time);
# the goldens use this stand-in so that they hold no path of the machine that renders them.
GOLDEN_PYTHON = "/opt/python/bin/python3"


def slurm_job(**fields) -> tuple[JobSpec, SlurmOptions]:
    """A JobSpec and its SlurmOptions from one set of keywords (SlurmOptions' own go to it; `time` as typed)."""
    if "time" in fields:
        fields["time_limit_s"] = parse_time_limit(fields.pop("time"))
    return (
        JobSpec(**{k: v for k, v in fields.items() if k not in FILE_KEYS}),
        SlurmOptions(**{k: v for k, v in fields.items() if k in FILE_KEYS}),
    )


def golden_job(launcher: str, env: str, res: str) -> tuple[JobSpec, SlurmOptions]:
    multi = launcher != "single"
    nproc = 2 if multi else 1
    return slurm_job(
        command=("hpctrain", "train", "mnist", "--dataset", "fashion-mnist", "--epochs", "1"),
        name=f"mnist-{launcher}-{env}-{res}",
        partition="debug",
        time="30:00",
        launcher=launcher,
        resources=Resources(
            nodes=2 if multi else 1,
            nproc_per_node=nproc,
            cpus_per_task=1,
            **({"gpus_per_node": nproc} if "gpus_per_node" in RESOURCES[res] else {}),
        ),
        shards_per_node=RESOURCES[res].get("shards_per_node", 0),
        environment=ENVIRONMENTS[env],
        python=GOLDEN_PYTHON if env == "none" else None,
        run_dir="runs/mnist-fashion-mnist-%j",
        env=(("OMP_NUM_THREADS", "1"),),
    )


CASES = [(l, e, r) for l in ("torchrun", "srun", "single") for e in ENVIRONMENTS for r in RESOURCES]


def elastic_job() -> tuple[JobSpec, SlurmOptions]:
    """`--nodes 1:2 --max-restarts 3`: an elastic torchrun job (its golden file: torchrun-elastic.sbatch)."""
    job, options = golden_job("torchrun", "none", "cpu")
    resources = Resources(nodes=2, min_nodes=1, nproc_per_node=2)
    return job.replace(name="mnist-elastic", resources=resources, max_restarts=3), options


@pytest.mark.parametrize("launcher,env,res", CASES, ids=["-".join(c) for c in CASES])
def test_golden(launcher: str, env: str, res: str) -> None:
    check_golden(render_sbatch(*golden_job(launcher, env, res)), f"{launcher}-{env}-{res}.sbatch")


def test_golden_elastic() -> None:
    check_golden(render_sbatch(*elastic_job()), "torchrun-elastic.sbatch")


def check_golden(script: str, name: str) -> None:
    path = GOLDEN_DIR / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(script)
    if not path.exists():
        pytest.fail(f"{path} is missing; create it with: HPCTRAIN_UPDATE_GOLDEN=1 pytest {__file__}")
    expected = path.read_text()
    if script != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), script.splitlines(True), str(path), "rendered"))
        pytest.fail(
            f"rendered script differs from {path.name}:\n{diff}\nIf the change is intended, refresh with: "
            f"HPCTRAIN_UPDATE_GOLDEN=1 pytest {__file__}"
        )


def test_goldens_pass_bash_n_and_shellcheck() -> None:
    files = sorted(GOLDEN_DIR.glob("*.sbatch"))
    assert len(files) == len(CASES) + 1  # and the elastic one
    for path in files:
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{path.name}: {proc.stderr}"
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed: apt-get install shellcheck")
    proc = subprocess.run(["shellcheck", "--shell=bash", *map(str, files)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_render_is_pure_and_has_no_local_paths() -> None:
    job = golden_job("torchrun", "venv", "gpu2")
    assert render_sbatch(*job) == render_sbatch(*job)
    text = render_sbatch(*job)
    assert str(Path.cwd()) not in text and str(Path.home()) not in text
    assert '"$HOME"/venvs/hpctrain/bin/activate' in text


def test_resources_render_per_launcher() -> None:
    torch_job, slurm = golden_job("torchrun", "none", "gpu2")
    text = render_sbatch(torch_job, slurm)
    # torchrun: one task per node holding the CPUs of both workers
    assert "#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=2\n#SBATCH --gres=gpu:2\n" in text
    srun_text = render_sbatch(*golden_job("srun", "none", "shard16"))
    assert "#SBATCH --ntasks-per-node=2\n#SBATCH --cpus-per-task=1\n#SBATCH --gres=shard:16\n" in srun_text
    assert "#SBATCH --time=00:30:00" in srun_text
    single = render_sbatch(*golden_job("single", "apptainer", "gpu2"))
    assert "#SBATCH --ntasks=1" in single and "apptainer exec --nv" in single
    assert "apptainer exec --bind" in render_sbatch(*golden_job("single", "apptainer", "cpu"))  # no --nv without GPUs
    no_signal = render_sbatch(
        torch_job.replace(signal_grace=0), slurm
    )  # no time-limit warning: requeued after a hang only
    assert "#SBATCH --signal" not in no_signal and "#SBATCH --requeue" in no_signal
    assert no_signal.count('scontrol requeue "') == 1 and '[ "$stop_reason" = hung ]' in no_signal
    assert "scontrol requeuehold" in no_signal and '[ "$stop_reason" = sick_node ]' in no_signal
    never = render_sbatch(torch_job.replace(signal_grace=0), replace(slurm, max_hang_restarts=0))
    assert "--requeue" not in never and "scontrol requeue" not in never


def test_excluded_nodes_are_excluded_and_stay_excluded_after_a_sick_node_requeue(tmp_path: Path) -> None:
    job = JobSpec(command=("hpctrain", "train", "mnist"), run_dir="runs/x-%j", exclude_nodes=("node07", "node12"))
    script = render_sbatch(job)
    assert "#SBATCH --exclude=node07,node12\n" in script
    # The requeue after a sick node replaces the job's excluded list (scontrol update ExcNodeList): it must hold the
    # job's own exclusions, those of earlier requeues and the new finding. Run the script's own line.
    [line] = [line for line in script.splitlines() if line.strip().startswith("excluded=")]
    (tmp_path / "bad_nodes").write_text("node03\n")
    (tmp_path / "excluded_nodes").write_text("node01\n")
    helpers = "\n".join(helper_lines())
    out = subprocess.run(
        ["bash", "-c", f'{helpers}\nrun_dir={tmp_path}\n{line}\necho "$excluded"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "node01,node03,node07,node12"
    assert "--exclude" not in render_sbatch(job.replace(exclude_nodes=()))


@pytest.mark.parametrize(("sinfo", "expected"), [("echo 2", "end"), ("echo 3", "requeue"), ("exit 1", "requeue")])
def test_a_sick_node_requeue_ends_the_job_only_when_the_partition_is_known_to_be_too_small(
    tmp_path: Path, sinfo: str, expected: str
) -> None:
    """2 nodes needed, 1 excluded: a partition of 2 cannot hold the job any more (end it), one of 3 can; and when
    sinfo says nothing (missing, or failing), nothing is known, so the requeue goes ahead."""
    script = render_sbatch(
        JobSpec(command=("hpctrain", "train", "mnist"), run_dir="runs/x-%j", resources=Resources(nodes=2))
    )
    lines = [
        line.strip()
        for line in script.splitlines()
        if line.strip().startswith(("partition_nodes=", "left=", 'elif [ "$partition_nodes"'))
    ]
    assert len(lines) == 3, script
    (tmp_path / "sinfo").write_text(f"#!/bin/sh\n{sinfo}\n")
    (tmp_path / "sinfo").chmod(0o755)
    body = "\n".join([*lines[:2], f"{lines[2].removeprefix('el')} echo end; else echo requeue; fi"])
    out = subprocess.run(
        ["bash", "-c", f"excluded=node1\nSLURM_JOB_NUM_NODES=2\n{body}"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
    ).stdout
    assert out.strip() == expected


@pytest.mark.parametrize("bad", ["node[1-3]", "a b", "-x", "", "n;rm"])
def test_exclude_nodes_takes_plain_node_names(bad: str) -> None:
    from hpctrain.errors import UserError

    with pytest.raises(UserError, match="is not a node name; give names as sinfo or `kubectl get nodes` shows"):
        JobSpec(command=("true",), exclude_nodes=(bad,))


def test_sbatch_lines_quote_as_sbatch_reads_them() -> None:
    text = render_sbatch(*slurm_job(command=("true",), name="it's $(x) `y`", output="logs/a b-%j.out"))
    assert '#SBATCH --job-name="it\'s $(x) `y`"' in text
    assert '#SBATCH --output="logs/a b-%j.out"' in text
    text = render_sbatch(JobSpec(command=("true",), name='say "hi"'))
    assert "#SBATCH --job-name='say \"hi\"'" in text


# ---- executing rendered scripts with stand-ins -------------------------------------------------------------

FAKE_SRUN = r'''#!{python}
"""Stand-in for srun (Slurm's own srun is exercised in test_submit_slurm.py): record argv, then behave as told."""
import json, os, signal, sys, time
out = os.environ["FAKE_OUT"]
with open(os.path.join(out, "srun.json"), "w") as f:
    json.dump(sys.argv[1:], f)
mode = os.environ.get("FAKE_MODE", "exit0")
if mode == "exit0":
    sys.exit(0)
got = []
def handler(signum, frame):
    got.append(signal.Signals(signum).name)
    with open(os.path.join(out, "signals"), "a") as f:
        f.write(signal.Signals(signum).name + "\n")
signal.signal(signal.SIGUSR1, handler)
signal.signal(signal.SIGTERM, handler)
with open(os.path.join(out, "srun.pid"), "w") as f:
    f.write(str(os.getpid()))
if mode != "ignores" and os.environ.get("HPCTRAIN_RUN_DIR"):  # the program says it handles USR1, as StopRequest does
    os.makedirs(os.environ["HPCTRAIN_RUN_DIR"], exist_ok=True)
    open(os.path.join(os.environ["HPCTRAIN_RUN_DIR"], "handles_signals"), "w").close()
open(os.path.join(out, "ready"), "w").close()
deadline = time.time() + (3 if mode == "ignores" else 30)  # ignores: a program the time limit ends
while not got and time.time() < deadline:
    time.sleep(0.05)
if mode in ("preempt", "preempt-75", "completed-then-failed", "diverged") and os.environ.get("HPCTRAIN_RUN_DIR"):
    os.makedirs(os.environ["HPCTRAIN_RUN_DIR"], exist_ok=True)
    with open(os.path.join(os.environ["HPCTRAIN_RUN_DIR"], "stop_reason"), "w") as f:
        if mode == "completed-then-failed":  # training finished; torchrun then died on the late warning
            f.write("completed")
        elif mode == "diverged":  # the loss became non-finite (exit 3), then the warning came
            f.write("diverged")
        else:
            f.write("preempted" if got == ["SIGUSR1"] else "cancelled")
sys.exit({"preempt": 0, "preempt-75": 75}.get(mode, 3))  # 75: the status of a planned stop
'''

FAKE_SCONTROL = r"""#!/bin/sh
# Stand-in for scontrol: hostnames of the fake allocation; requeue requests are recorded.
if [ "$1" = show ] && [ "$2" = hostnames ]; then printf 'node7\nnode8\n'; exit 0; fi
printf '%s\n' "$*" >> "$FAKE_OUT/scontrol"
"""

FAKE_SCANCEL = r"""#!/bin/sh
# Stand-in for scancel: records its arguments and, as Slurm would, signals the step (the stand-in srun).
printf '%s\n' "$*" >> "$FAKE_OUT/scancel"
case "$1" in --signal=*) kill -s "${1#--signal=}" "$(cat "$FAKE_OUT/srun.pid")" ;; esac
"""


@pytest.fixture
def fake_slurm(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN.replace("{python}", sys.executable))
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scancel").write_text(FAKE_SCANCEL)
    for p in bin_dir.iterdir():
        p.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_OUT": str(out),
        "SLURM_JOB_ID": "4242",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "node[7-8]",
        "HOME": str(tmp_path),
    }
    return tmp_path, env, out


HOSTILE = ["it's", '"dq"', "$(touch pwned)", "`touch pwned2`", "a\nb", "$HOME", "*", "; rm -rf /", "--x=1 2", ""]


@pytest.mark.parametrize("launcher", ["torchrun", "srun", "single"])
def test_hostile_arguments_arrive_literally(fake_slurm, launcher: str) -> None:
    tmp_path, env, out = fake_slurm
    nodes, nproc = (1, 1) if launcher == "single" else (2, 2)
    job = slurm_job(
        command=("python", "train.py", *HOSTILE),
        name="q'uote $(x)",
        launcher=launcher,
        resources=Resources(nodes=nodes, nproc_per_node=nproc),
        env=(("MSG", "$(touch pwned3) 'x'"),),
        run_dir="runs/odd dir $(x)-%j",
        signal_grace=0,
    )
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(*job))
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    argv = json.loads((out / "srun.json").read_text())
    assert argv[-len(HOSTILE) - 2 :] == ["python", "train.py", *HOSTILE]
    assert not list(tmp_path.glob("pwned*"))
    if launcher == "torchrun":
        assert f"--rdzv-endpoint=node7:{job_port(4242)}" in argv and "--rdzv-id=4242" in argv and "--nnodes=2" in argv
    expected_ntasks = {"torchrun": "--ntasks-per-node=1", "srun": "--ntasks-per-node=2", "single": "--ntasks=1"}
    assert expected_ntasks[launcher] in argv


def test_environment_and_run_dir_reach_the_step(fake_slurm) -> None:
    tmp_path, env, out = fake_slurm
    # The stand-in srun records the environment the step would inherit.
    (tmp_path / "bin" / "srun").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "json.dump({k: os.environ.get(k) for k in ('MSG', 'HPCTRAIN_RUN_DIR')}, "
        "open(os.environ['FAKE_OUT'] + '/env.json', 'w'))\n"
    )
    job = JobSpec(
        command=("true",), env=(("MSG", "$(touch pwned) 'x' \"y\""),), run_dir="runs/odd dir $(x)-%j", signal_grace=0
    )
    (tmp_path / "job.sbatch").write_text(render_sbatch(job))
    proc = subprocess.run(["bash", "job.sbatch"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads((out / "env.json").read_text())
    assert seen == {"MSG": "$(touch pwned) 'x' \"y\"", "HPCTRAIN_RUN_DIR": "runs/odd dir $(x)-4242"}


def test_busy_rendezvous_port_is_skipped(fake_slurm) -> None:
    import socket

    tmp_path, env, out = fake_slurm
    first = job_port(4242)
    busy = socket.socket()
    try:
        busy.bind(("127.0.0.1", first))
    except OSError:
        pytest.skip(f"port {first} is taken by something else on this machine")
    busy.listen()
    try:
        job = JobSpec(command=("true",), resources=Resources(nodes=2, nproc_per_node=2), signal_grace=0)
        (tmp_path / "job.sbatch").write_text(render_sbatch(job))
        proc = subprocess.run(["bash", "job.sbatch"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    finally:
        busy.close()
    assert proc.returncode == 0, proc.stderr
    endpoint = next(a for a in json.loads((out / "srun.json").read_text()) if a.startswith("--rdzv-endpoint="))
    port = int(endpoint.rsplit(":", 1)[1])
    assert port != first and first < port < first + 200


def _run_and_signal(
    tmp_path: Path, env: dict, out: Path, job: tuple[JobSpec, SlurmOptions], sig: signal.Signals, mode: str
):
    (tmp_path / "runs").mkdir(exist_ok=True)
    (tmp_path / "job.sbatch").write_text(render_sbatch(*job))
    proc = subprocess.Popen(
        ["bash", "job.sbatch"],
        cwd=tmp_path,
        env={**env, "FAKE_MODE": mode},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not (out / "ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.05)
    os.kill(proc.pid, sig)
    output, _ = proc.communicate(timeout=60)
    return proc.returncode, output


@pytest.mark.parametrize(
    "restart_count,own_requeues,requeued",
    [
        ("0", None, True),
        ("3", "3", False),  # this script's own budget is spent
        ("5", "1", True),  # four of the restarts were Slurm's (preemptions): they do not count against --max-requeues
    ],
)
def test_time_limit_warning_is_forwarded_and_requeues_within_budget(
    fake_slurm, restart_count: str, own_requeues: str | None, requeued: bool
) -> None:
    tmp_path, env, out = fake_slurm
    env = {**env, "SLURM_RESTART_COUNT": restart_count}
    count_file = tmp_path / "runs" / "r-4242" / "requeue_count"
    if own_requeues is not None:
        count_file.parent.mkdir(parents=True)
        count_file.write_text(own_requeues + "\n")
    job = slurm_job(
        command=("true",),
        launcher="srun",
        resources=Resources(nodes=1, nproc_per_node=1),
        run_dir="runs/r-%j",
        signal_grace=60,
        max_requeues=3,
    )
    code, output = _run_and_signal(tmp_path, env, out, job, signal.SIGUSR1, "preempt")
    assert (out / "signals").read_text() == "SIGUSR1\n", output
    scontrol = (out / "scontrol").read_text() if (out / "scontrol").exists() else ""
    assert ("requeue 4242" in scontrol) == requeued, output
    if requeued:
        assert code == 0
        assert count_file.read_text().strip() == str(int(own_requeues or 0) + 1)
    else:  # stopped early and may not requeue: the job must not look like a success
        assert code == 1 and "requeue budget (3) is used up" in output


@pytest.mark.parametrize("mode", ["completed-then-failed", "diverged"])
def test_a_completed_or_diverged_run_is_not_requeued_when_a_warning_fails_the_step(fake_slurm, mode: str) -> None:
    tmp_path, env, out = fake_slurm
    job = slurm_job(
        command=("true",),
        launcher="srun",
        resources=Resources(nodes=1, nproc_per_node=1),
        run_dir="runs/r-%j",
        signal_grace=60,
    )
    code, output = _run_and_signal(tmp_path, env, out, job, signal.SIGUSR1, mode)
    assert not (out / "scontrol").exists(), output
    assert code == 3 and "requeueing" not in output


def test_slurm_requeues_beyond_their_budget_stop_the_job_before_it_runs(fake_slurm) -> None:
    tmp_path, env, out = fake_slurm
    (tmp_path / "runs" / "r-4242").mkdir(parents=True)
    (tmp_path / "runs" / "r-4242" / "requeue_count").write_text("1\n")
    job = slurm_job(
        command=("true",),
        launcher="srun",
        resources=Resources(nodes=1, nproc_per_node=1),
        run_dir="runs/r-%j",
        signal_grace=60,
        max_preemptions=2,
    )
    (tmp_path / "job.sbatch").write_text(render_sbatch(*job))
    proc = subprocess.run(
        ["bash", "job.sbatch"],
        cwd=tmp_path,
        env={**env, "SLURM_RESTART_COUNT": "4"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "requeued this job 3 times" in proc.stderr and "--max-preemptions" in proc.stderr
    assert not (out / "ready").exists(), "the step must not start"


def test_scancel_term_is_forwarded_and_never_requeues(fake_slurm) -> None:
    tmp_path, env, out = fake_slurm
    job = slurm_job(
        command=("true",),
        launcher="srun",
        resources=Resources(nodes=1, nproc_per_node=1),
        run_dir="runs/r-%j",
        signal_grace=60,
    )
    code, output = _run_and_signal(tmp_path, env, out, job, signal.SIGTERM, "fail")
    assert (out / "signals").read_text() == "SIGTERM\n", output
    # through Slurm, not as a TERM to srun (which srun turns into a SIGKILL of the step: no checkpoint)
    assert (out / "scancel").read_text() == "--signal=TERM 4242\n", output
    assert not (out / "scontrol").exists(), output
    assert code == 3  # the step's own status is the job's


# step_command takes resolved options (options.for_job): a command of the user's own runs under torchrun.
TORCHRUN = SlurmOptions(launcher="torchrun")


def test_torchrun_signal_flags_are_decided_in_the_job() -> None:
    """torchrun < 2.9 rejects --signals-to-handle: the step never passes it itself; the script's torchrun shim gets
    the signals and the shutdown timeout as its first two arguments and asks the job's torchrun (test_torchrun_shim.py
    runs it)."""
    words = step_command(JobSpec(command=("x",), signal_grace=120), TORCHRUN)
    assert not [w for w in words if w.startswith(("--signals-to-handle", "--shutdown-timeout"))]
    shim = words.index('"$hpctrain_torchrun"')
    assert words[shim - 2 : shim + 3] == [
        "python3",
        "-c",
        '"$hpctrain_torchrun"',
        "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
        "110",
    ]
    assert words.index("--no-python") > shim
    no_warning = step_command(JobSpec(command=("x",), signal_grace=0), TORCHRUN)
    assert no_warning[no_warning.index('"$hpctrain_torchrun"') + 1 :][:2] == ["''", "0"]
    text = render_sbatch(JobSpec(command=("x",), signal_grace=120))
    assert "hpctrain_torchrun='" + TORCHRUN_SHIM + "'" in text


def test_submit_parses_job_id_and_reports_sbatch_errors() -> None:
    job = JobSpec(command=("true",))
    calls = []

    def run(argv, **kw):
        calls.append((argv, kw["input"]))
        return subprocess.CompletedProcess(argv, 0, stdout="123;cluster\n", stderr="")

    assert submit(job, "#!/bin/bash\n", run=run) == "123"
    assert calls == [(sbatch_argv(job), b"#!/bin/bash\n")]  # the script goes in as UTF-8 bytes (commands.run_text)

    def refuse(argv, **kw):
        return subprocess.CompletedProcess(argv, 1, stdout="", stderr="sbatch: error: Invalid partition name specified")

    from hpctrain.errors import UserError

    with pytest.raises(UserError, match="Invalid partition"):
        submit(job, "#!/bin/bash\n", run=refuse)


def test_hostile_values_still_pass_shellcheck(tmp_path: Path) -> None:
    job = slurm_job(
        command=("python", "x.py", *HOSTILE),
        name="a'b $(x) `y` #z;|&",
        output="o ut-%j.log",
        env=(("A", "$(x) 'y' \"z\""),),
        run_dir="~/r un/$(x)-%j",
        sbatch_extra=("--comment='hello world'",),
        environment=EnvironmentSpec(kind="conda", conda_env="~/my env", modules=("a/1",)),
    )
    path = tmp_path / "job.sbatch"
    path.write_text(render_sbatch(*job))
    proc = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_the_options_are_resolved_and_checked_once_per_script() -> None:
    """render_sbatch resolves the job's options (for_job) and checks them (check_job) once, and hands the resolved
    options to every part of the script (before, the parts resolved them again: four for_job and two check_job for
    one script). Counted with a profile hook on the functions' code, whatever the module that calls them."""
    from hpctrain.schedulers.slurm.batch import options

    counted = {options.for_job.__code__: "for_job", options.check_job.__code__: "check_job"}
    calls: list[str] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in counted:
            calls.append(counted[frame.f_code])

    resources = Resources(nodes=2, nproc_per_node=2)
    job = slurm_job(command=("hpctrain", "train", "mnist"), run_dir="runs/r-%j", time="00:30:00", resources=resources)
    sys.setprofile(profile)
    try:
        render_sbatch(*job)
    finally:
        sys.setprofile(None)
    assert sorted(calls) == ["check_job", "for_job"]


def test_max_restarts_reaches_torchrun_only() -> None:
    words = step_command(JobSpec(command=("x",), max_restarts=2), TORCHRUN)
    assert "--max-restarts=2" in words and words.index("--max-restarts=2") < words.index("--no-python")
    assert not any(w.startswith("--max-restarts") for w in step_command(JobSpec(command=("x",)), TORCHRUN))
    from hpctrain.errors import UserError

    with pytest.raises(UserError, match="use --launcher torchrun"):
        render_sbatch(*slurm_job(command=("x",), launcher="srun", max_restarts=1))


# ---- one option per --sbatch value ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra,line",
    [
        ("--exclusive", "#SBATCH --exclusive"),
        ("--constraint=a100", "#SBATCH --constraint=a100"),
        ("--constraint a100", "#SBATCH --constraint=a100"),
        ("-C a100", "#SBATCH -C a100"),
        ("--comment='hello world'", '#SBATCH --comment="hello world"'),
        ('--comment="it\'s"', '#SBATCH --comment="it\'s"'),
        ("--comment='--output=/x'", "#SBATCH --comment=--output=/x"),  # one word for sbatch: a comment
        ("--nice=-5", "#SBATCH --nice=-5"),
    ],
)
def test_an_extra_sbatch_option_renders_as_one_option(extra: str, line: str) -> None:
    text = render_sbatch(JobSpec(command=("true",)), SlurmOptions(sbatch_extra=(extra,)))
    assert line + "\n" in text


@pytest.mark.parametrize(
    "extra,message",
    [
        ("--comment --output=/x", "holds 2 options"),
        ("--constraint=a100 --exclusive", "holds 2 options"),
        ("--comment=x\n#SBATCH --output=/x", "control characters"),
        ("--comment=x\r--output=/x", "control characters"),
        ("--exclusive\n", "control characters"),
        ("-vH", "is not one sbatch option"),
        ("-Ca100", "is not one sbatch option"),
        ("--comment=hello world", "is 2 words"),
        ("--comment 'a b' --output=/x", "is 3 words"),
        ("-C a100 -w node1", "is 4 words"),
        ("--nice -5", "attach it with = (--nice=-5)"),
        ("--comment='a", "unbalanced quotes"),
        ("exclusive", "must start with -"),
        ("", "is empty"),
        ("--comment=", "is empty"),
        ("--comment='\\x'", "backslashes"),
    ],
)
def test_an_extra_sbatch_value_that_smuggles_a_second_option_is_refused(extra: str, message: str) -> None:
    from hpctrain.errors import UserError

    with pytest.raises(UserError, match=re.escape(message)):
        SlurmOptions(sbatch_extra=(extra,))


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"name": "two\nlines"}, "--job-name 'two\\nlines' contains control characters"),
        ({"name": "a'b\"c"}, "use only one kind of quote"),
        ({"partition": "gpu\\a"}, "--partition 'gpu\\\\a' cannot be written on an #SBATCH line"),
        ({"output": "out\t%j"}, "--output 'out\\t%j' contains control characters"),
        ({"sbatch_extra": ("exclusive",)}, "must start with -"),
        ({"python": "/opt/py\\thon"}, "python '/opt/py\\\\thon' cannot be written on an #SBATCH line"),
    ],
)
def test_slurm_refuses_what_an_sbatch_line_cannot_hold(fields: dict, message: str) -> None:
    """Slurm refuses them, naming the flag, before any script exists: SlurmOptions its own values, render the
    JobSpec's (which holds them for every scheduler; another has rules of its own)."""
    from hpctrain.errors import UserError

    with pytest.raises(UserError) as err:
        render_sbatch(*slurm_job(command=("true",), **fields))
    assert message in str(err.value)


# ---- the job finds the tools that submitted it ----------------------------------------------------------------


def test_kind_none_runs_hpctrain_and_torchrun_with_the_submitting_python() -> None:
    python = "/opt/my env/bin/python3"
    recipe = JobSpec(command=("hpctrain", "train", "mnist"), run_dir="runs/r-%j")
    words = step_command(recipe, SlurmOptions(launcher="torchrun", python=python))
    assert words[words.index("--quiet") + 1 :][:3] == [
        "'/opt/my env/bin/python3'",
        "-c",
        '"$hpctrain_torchrun"',
    ]
    assert words[words.index("--no-python") + 1 :][:4] == ["'/opt/my env/bin/python3'", "-m", "hpctrain", "train"]
    srun = step_command(
        recipe.replace(resources=Resources(nproc_per_node=2)), SlurmOptions(launcher="srun", python=python)
    )
    assert "torchrun" not in " ".join(srun) and "torch.distributed.run" not in srun
    own = step_command(*slurm_job(command=("python", "x.py"), python=python, launcher="srun"))
    assert own[-2:] == ["python", "x.py"]  # the user's own command is left as written (hpctrain check looks it up)
    # without an interpreter (other environment kinds): the names, found on the PATH the environment gives
    plain = step_command(
        JobSpec(command=("hpctrain", "train", "mnist")),
        SlurmOptions(launcher="torchrun", environment=ENVIRONMENTS["venv"]),
    )
    assert (
        plain[plain.index('"$hpctrain_torchrun"') - 2] == "python3"
        and plain[plain.index("--no-python") + 1] == "hpctrain"
    )


@pytest.mark.parametrize("env", ["venv", "conda", "apptainer", "pyxis", "modules"])
def test_an_interpreter_is_refused_with_an_environment_that_brings_its_own(env: str) -> None:
    from hpctrain.errors import UserError

    with pytest.raises(UserError, match=f"a {env} environment brings its own"):
        SlurmOptions(environment=ENVIRONMENTS[env], python="/usr/bin/python3")
    with pytest.raises(UserError, match="absolute path"):
        SlurmOptions(python="bin/python3")


# ---- %j in a recipe's run dir: expanded once, by the script ---------------------------------------------------


@pytest.mark.parametrize(
    "train_args",
    [
        ("--run-dir", "runs/r-%j"),
        ("--run-dir=runs/r-%j",),
        ("--run-d", "runs/r-%j"),  # argparse's abbreviation: the script's value comes last and wins
        (),  # the recipe's default run dir: runs/mnist-fashion-mnist-%j
    ],
)
def test_a_recipe_trains_in_the_run_dir_the_script_uses(fake_slurm, train_args: tuple[str, ...]) -> None:
    from hpctrain.cli.train import config_from_argv

    tmp_path, env, out = fake_slurm
    run_dir = "runs/r-%j" if train_args else "runs/mnist-fashion-mnist-%j"
    job = slurm_job(
        command=("hpctrain", "train", "mnist", *train_args, "--epochs", "1"),
        launcher="srun",
        resources=Resources(nodes=1, nproc_per_node=1),
        run_dir=run_dir,
        signal_grace=60,
    )
    (tmp_path / "bin" / "srun").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        "json.dump({'argv': sys.argv[1:], 'env': os.environ['HPCTRAIN_RUN_DIR']}, "
        "open(os.environ['FAKE_OUT'] + '/step.json', 'w'))\n"
    )
    (tmp_path / "job.sbatch").write_text(render_sbatch(*job))
    proc = subprocess.run(["bash", "job.sbatch"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    step = json.loads((out / "step.json").read_text())
    argv = step["argv"]
    train_argv = argv[argv.index("train") + 1 :]
    expected = run_dir.replace("%j", "4242")
    assert config_from_argv(train_argv).run_dir == expected == step["env"], train_argv
    if train_args[:1] != ("--run-d",):
        assert not any("%j" in a for a in argv), argv


def test_a_recipes_one_process_starts_without_torchrun_by_default() -> None:
    """Issue 39 §18: torchrun was the default launcher even for one process, whose log then held torchrun's banner
    and keep-alive warnings. A built-in recipe's one process starts plainly; more processes, a user's command
    (its script may read torchrun's variables) and --max-restarts keep torchrun."""
    recipe = JobSpec(command=("hpctrain", "train", "mnist"), run_dir="runs/m-%j")
    script = render_sbatch(recipe)
    assert "hpctrain_torchrun" not in script and " --nodes=1 --ntasks=1 " in script
    assert "(single)" in script.splitlines()[2]
    for torchrun_job in (
        recipe.replace(resources=Resources(nproc_per_node=2)),
        recipe.replace(max_restarts=1),
        JobSpec(command=("python3", "train.py")),
    ):
        assert '"$hpctrain_torchrun"' in render_sbatch(torchrun_job)
    assert "hpctrain_torchrun" in render_sbatch(recipe, SlurmOptions(launcher="torchrun"))
