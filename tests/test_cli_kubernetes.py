"""The CLI with `--scheduler kubernetes`: dry-run manifests, job files (.params, YAML with `scheduler:`), flags that
belong to the other scheduler, and what the commands import. All run `python -m hpctrain` as a user would; none
needs a cluster (the live tests are in test_cli_kubernetes_live.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpctrain.schedulers.job_sections import JobFile, read_job_file
from hpctrain.errors import UserError
from hpctrain.schedulers import base
from hpctrain.schedulers.kubernetes.manifests.validate import validate_manifest
from hpctrain.schedulers.kubernetes.queries.replica_logs import KEEP_LOG
from hpctrain.schedulers.slurm.queries.job_states import JobInfo
from hpctrain.schedulers.slurm.scheduler import job_status
from training_helpers import run_hpctrain

IMAGE = "registry.example/hpctrain:1"


def hpctrain(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_hpctrain(*args, cwd=cwd)


def manifest_of(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stderr
    manifest = yaml.safe_load(proc.stdout)
    assert validate_manifest(manifest) == [], validate_manifest(manifest)
    return manifest


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    """A refused command: exit 2, nothing on stdout, one line on stderr, no traceback."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    return line


def test_dry_run_of_a_recipe_prints_a_valid_pytorchjob(tmp_path: Path) -> None:
    proc = hpctrain(
        "submit",
        "--scheduler",
        "kubernetes",
        "--dry-run",
        "--image",
        IMAGE,
        "--nodes",
        "2",
        "--cpus-per-task",
        "2",
        "--mem",
        "4G",
        "--shm",
        "1Gi",
        "--namespace",
        "team-a",
        "--volume",
        "pvc:shared:/shared",
        "--time",
        "01:00:00",
        "--job-name",
        "mnist-k8s",
        "train",
        "mnist",
        "--epochs",
        "1",
        "--run-dir",
        "/shared/runs/mnist",
        cwd=tmp_path,
    )
    manifest = manifest_of(proc)
    assert manifest["kind"] == "PyTorchJob" and manifest["metadata"]["namespace"] == "team-a"
    spec = manifest["spec"]
    assert spec["runPolicy"]["activeDeadlineSeconds"] == 3600 + 24 * 3600  # a backstop: --time is the job's own timer
    assert spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    container = spec["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["image"] == IMAGE
    # Under the program that keeps the replica's output in the run directory (replica_logs.py), as arguments.
    assert container["command"][:4] == ["python3", "-c", KEEP_LOG, "/shared/runs/mnist/pod-logs"]
    assert container["command"][4:] == [
        "hpctrain",
        "train",
        "mnist",
        "--epochs",
        "1",
        "--run-dir",
        "/shared/runs/mnist",
    ]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container["resources"]["limits"] == {"cpu": "2", "memory": "4Gi"}
    assert {"name": "HPCTRAIN_RUN_DIR", "value": "/shared/runs/mnist"} in container["env"]
    assert {"name": "HPCTRAIN_TIME_LIMIT_S", "value": "3600"} in container["env"]
    assert "live cluster" in proc.stderr
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


def test_a_recipe_without_run_dir_trains_where_the_job_says(tmp_path: Path) -> None:
    """The pods' recipe writes to the job's run dir, runs/JOBNAME (HPCTRAIN_RUN_DIR), which `hpctrain status` reads;
    the name is not doubled (runs/mnist-fashion-mnist, not runs/mnist-fashion-mnist-mnist-fashion-mnist)."""
    from hpctrain.cli.train import config_from_argv
    from hpctrain.config import default_run_dir

    proc = hpctrain(
        "submit",
        "--scheduler",
        "kubernetes",
        "--dry-run",
        "--image",
        IMAGE,
        "train",
        "mnist",
        "--dataset",
        "fashion-mnist",
        cwd=tmp_path,
    )
    container = manifest_of(proc)["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}  # HPCTRAIN_NODE_NAME: valueFrom
    assert env["HPCTRAIN_RUN_DIR"] == "runs/mnist-fashion-mnist"
    cfg = config_from_argv(["mnist", "--dataset", "fashion-mnist"])
    assert default_run_dir(cfg, environ=env) == "runs/mnist-fashion-mnist"  # what the pod's `hpctrain train` uses
    assert default_run_dir(cfg, environ={"SLURM_JOB_ID": "7"}) == "runs/mnist-fashion-mnist-7"


def test_dry_run_trainjob_of_any_command(tmp_path: Path) -> None:
    proc = hpctrain(
        "submit",
        "--scheduler",
        "kubernetes",
        "--k8s-api",
        "trainjob",
        "--dry-run",
        "--image",
        IMAGE,
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--nproc-per-node",
        "1",
        "--job-name",
        "ddp",
        "--",
        "python3",
        "train.py",
        "--lr",
        "0.1",
        cwd=tmp_path,
    )
    manifest = manifest_of(proc)
    assert manifest["kind"] == "TrainJob"
    assert manifest["spec"]["trainer"]["numNodes"] == 2
    assert manifest["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "1"


def test_params_job_file(tmp_path: Path) -> None:
    (tmp_path / "job.params").write_text(
        "name=mnist-params\nkind=PyTorchJob\nworker_count=2\nworker_cpu=4\nworker_gpu=0\nworker_memory=4\n"
        "worker_shared_memory=1\nworker_image=master0:5000/eflops/pytorch:v1\n"
        "command=python3 /mnt/user/me/mnist.py --backend gloo --epochs=10\npriority=1\nworkspace_id=team-b\n"
        "interactive=false\n"
    )
    # No --scheduler: a .params file is for Kubernetes, whatever this machine has.
    manifest = manifest_of(hpctrain("submit", "--dry-run", "--job-file", "job.params", cwd=tmp_path))
    assert manifest["metadata"]["name"] == "mnist-params" and manifest["metadata"]["namespace"] == "team-b"
    master = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert master["containers"][0]["image"] == "master0:5000/eflops/pytorch:v1"
    assert master["containers"][0]["command"][2] == KEEP_LOG
    assert master["containers"][0]["command"][4:] == [
        "python3",
        "/mnt/user/me/mnist.py",
        "--backend",
        "gloo",
        "--epochs=10",
    ]
    assert master["containers"][0]["resources"]["limits"] == {"cpu": "4", "memory": "4Gi"}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}} in master["volumes"]
    # Flags override the file.
    manifest = manifest_of(
        hpctrain(
            "submit", "--dry-run", "--job-file", "job.params", "--namespace", "team-c", "--nodes", "3", cwd=tmp_path
        )
    )
    assert manifest["metadata"]["namespace"] == "team-c"
    assert manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2


def test_params_job_file_errors_name_every_bad_key(tmp_path: Path) -> None:
    (tmp_path / "bad.params").write_text("worker_count=zero\nworker_gpus=1\ncommand=python3 x.py\n")
    line = one_error(hpctrain("submit", "--dry-run", "--job-file", "bad.params", cwd=tmp_path))
    assert "worker_count='zero' must be a whole number" in line and "unknown key(s) worker_gpus" in line


def test_yaml_job_file_names_its_scheduler_and_options(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(
        f"scheduler: kubernetes\nname: from-yaml\nnodes: 2\ncommand: [python3, train.py]\n"
        f"kubernetes:\n  namespace: team-d\n  image: {IMAGE}\n  volumes: ['host:/mnt/share:/mnt/share']\n"
    )
    manifest = manifest_of(hpctrain("submit", "--dry-run", "--job-file", "job.yaml", cwd=tmp_path))
    assert manifest["metadata"] == {
        "name": "from-yaml",
        "namespace": "team-d",
        "labels": {"app.kubernetes.io/managed-by": "hpctrain"},
    }
    pod = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "vol-0", "hostPath": {"path": "/mnt/share", "type": "Directory"}}]


def test_job_file_scheduler_keys_are_checked(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("scheduler: nomad\ncommand: [x]\n")
    with pytest.raises(UserError, match="scheduler 'nomad' is unknown: use slurm or kubernetes"):
        read_job_file(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("command: [x]\nkubernetes: {namespace: a, nodes: 2}\n")
    with pytest.raises(UserError, match="unknown kubernetes key.s. nodes; valid keys: .*namespace"):
        read_job_file(tmp_path / "b.yaml")
    (tmp_path / "c.toml").write_text('command = ["x"]\n')
    assert read_job_file(tmp_path / "c.toml") == JobFile(job={"command": ["x"]})


@pytest.mark.parametrize(
    "args,words",
    [
        (
            ["--scheduler", "kubernetes", "--image", IMAGE, "--partition", "gpu"],
            ["--partition is a Slurm option", "--node-selector"],
        ),
        (
            ["--scheduler", "kubernetes", "--image", IMAGE, "--mount", "/a:/b"],
            ["--mount is a Slurm option", "--volume"],
        ),
        (
            ["--scheduler", "kubernetes", "--image", IMAGE, "--sbatch=--exclusive"],
            ["--sbatch is a Slurm option", "--scheduler slurm"],
        ),
        (
            ["--scheduler", "slurm", "--namespace", "team-a"],
            ["--namespace is a Kubernetes option", "--scheduler kubernetes"],
        ),
        (["--scheduler", "slurm", "--shm", "1Gi"], ["--shm is a Kubernetes option"]),
        (["--scheduler", "kubernetes", "--gpus-per-node", "1", "--nproc-per-node", "1"], ["give --image"]),
        (["--scheduler", "kubernetes", "--image", IMAGE, "--shm", "lots"], ["--shm 'lots' is not a size"]),
    ],
)
def test_flags_of_the_other_scheduler_are_refused(tmp_path: Path, args: list[str], words: list[str]) -> None:
    line = one_error(hpctrain("submit", "--dry-run", *args, "--", "python3", "x.py", cwd=tmp_path))
    assert line.startswith("hpctrain submit: error: ")
    for word in words:
        assert word in line


def test_params_file_with_scheduler_slurm_is_refused(tmp_path: Path) -> None:
    (tmp_path / "job.params").write_text("worker_image=img:1\ncommand=python3 x.py\nworkspace_id=team-a\n")
    line = one_error(hpctrain("submit", "--dry-run", "--scheduler", "slurm", "--job-file", "job.params", cwd=tmp_path))
    assert "holds Kubernetes options" in line and "--scheduler kubernetes" in line


@pytest.mark.parametrize(
    "command",
    [["logs", "1", "--replica", "worker-0"], ["status", "--namespace", "x"], ["cluster", "--k8s-api", "trainjob"]],
)
def test_follow_commands_refuse_kubernetes_flags_on_slurm(tmp_path: Path, command: list[str]) -> None:
    line = one_error(hpctrain(*command, "--scheduler", "slurm", cwd=tmp_path))
    assert "is a Kubernetes option but the job goes to slurm" in line


@pytest.mark.parametrize(
    "command",
    [
        ["cancel", "j", "--signal", "USR1"],
        ["status", "--all-users"],
        ["logs", "j", "--err"],
        ["cluster", "--partition", "debug"],
    ],
)
def test_follow_commands_refuse_slurm_flags_on_kubernetes(tmp_path: Path, command: list[str]) -> None:
    line = one_error(hpctrain(*command, "--scheduler", "kubernetes", cwd=tmp_path))
    assert "is a Slurm option but the job goes to kubernetes" in line


IMPORTS = """
import sys
from hpctrain.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as stop:
    code = stop.code
loaded = sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in ('kubernetes', 'torch')}
                | {m for m in sys.modules if m.startswith('hpctrain.cli.')})
print('LOADED', code, loaded, file=sys.stderr)
"""


def loaded_modules(tmp_path: Path, *args: str) -> tuple[int, list[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", IMPORTS, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("LOADED"), proc.stderr
    _, code, names = last.split(" ", 2)
    return int(code), eval(names)  # our own print of a list of strings


def test_help_and_status_import_neither_torch_nor_the_kubernetes_client(tmp_path: Path) -> None:
    assert loaded_modules(tmp_path, "--help") == (0, [])  # no subcommand module either: --help is cheap
    code, names = loaded_modules(tmp_path, "status", "--help")
    assert (code, names) == (0, ["hpctrain.cli.status"])
    code, names = loaded_modules(
        tmp_path, "submit", "--scheduler", "kubernetes", "--dry-run", "--image", IMAGE, "--", "python3", "x.py"
    )
    assert code == 0 and "kubernetes" not in names, names


def test_slurm_records_map_onto_the_neutral_status() -> None:
    running = job_status(JobInfo(job_id="7", name="x", state="RUNNING", nodes="node[1-2]", num_nodes=2, restarts=1))
    assert (running.state, running.restarts, running.finished) == (base.RUNNING, 1, False)
    assert [r.node for r in running.replicas] == ["node[1-2]"]
    pending = job_status(JobInfo(job_id="8", name="x", state="PENDING", reason="Resources"))
    assert pending.state == base.PENDING and pending.pending_reasons == ("Resources",)
    timeout = job_status(JobInfo(job_id="9", name="x", state="TIMEOUT", exit_code=0))
    assert timeout.state == base.FAILED and timeout.finished
    assert job_status(JobInfo(job_id="9", name="x", state="CANCELLED")).state == base.CANCELLED


@pytest.mark.parametrize("key,value", [("partition", "gpu"), ("launcher", "srun"), ("max_requeues", 1)])
def test_slurm_keys_in_a_kubernetes_job_file_are_refused(tmp_path: Path, key: str, value: object) -> None:
    (tmp_path / "job.yaml").write_text(
        yaml.safe_dump(
            {"scheduler": "kubernetes", key: value, "command": ["python3", "x.py"], "kubernetes": {"image": IMAGE}}
        )
    )
    line = one_error(hpctrain("submit", "--dry-run", "--job-file", "job.yaml", cwd=tmp_path))
    assert f"({key} in a job file) is Slurm's: drop it for Kubernetes" in line


@pytest.mark.parametrize(
    "key,value,expected",
    [
        ("name", "mnist\\run", "--job-name 'mnist\\\\run' is not a valid Kubeflow job name"),
        ("partition", "gpu\\a", "--partition (partition in a job file) is Slurm's: drop it for Kubernetes"),
        ("output", "out\t%j", "--output (output in a job file) is Slurm's: drop it for Kubernetes"),
    ],
)
def test_a_kubernetes_job_meets_kubernetes_rules_not_sbatch_ones(
    tmp_path: Path, key: str, value: str, expected: str
) -> None:
    """What an #SBATCH line can hold is Slurm's rule: a Kubernetes job's name is refused by the Kubeflow name rule,
    and a Slurm-only value by "drop it", not by "cannot be written on an #SBATCH line" that points the user at a
    scheduler the job does not go to."""
    (tmp_path / "job.yaml").write_text(
        yaml.safe_dump(
            {"scheduler": "kubernetes", key: value, "command": ["python3", "x.py"], "kubernetes": {"image": IMAGE}}
        )
    )
    line = one_error(hpctrain("submit", "--dry-run", "--job-file", "job.yaml", cwd=tmp_path))
    assert expected in line
    assert "SBATCH" not in line


def test_a_kubernetes_job_yaml_of_an_earlier_version_still_resubmits(tmp_path: Path) -> None:
    """Before SlurmOptions, job.yaml held every JobSpec field, Slurm's too, at their defaults: such a file still
    resubmits to Kubernetes (a Slurm key at its default is no option); a value set is refused with the fix."""
    earlier = {
        "command": ["python3", "x.py"],
        "name": "older",
        "partition": None,
        "account": None,
        "qos": None,
        "launcher": "torchrun",
        "output": None,
        "error": None,
        "sbatch_extra": [],
        "rdzv_port": None,
        "max_requeues": 3,
        "max_preemptions": 10,
        "scheduler": "kubernetes",
        "kubernetes": {"image": IMAGE},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(earlier))
    manifest = manifest_of(hpctrain("submit", "--dry-run", "--job-file", "job.yaml", cwd=tmp_path))
    assert manifest["metadata"]["name"] == "older"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({**earlier, "sbatch_extra": ["--exclusive"]}))
    line = one_error(hpctrain("submit", "--dry-run", "--job-file", "job.yaml", cwd=tmp_path))
    assert "--sbatch (sbatch_extra in a job file) is Slurm's: drop it for Kubernetes" in line


@pytest.mark.parametrize("value", ["abc", "nan", "inf", "0", "-1", "1e999", "86401"])
def test_a_bad_wait_note_period_is_one_line(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """HPCTRAIN_WAIT_NOTE_S (how long `submit --wait` lets a job sit PENDING before saying what it has seen) is
    checked for its use: a number of seconds above 0 and at most a day, else one line naming it."""
    from hpctrain.cli.submit import _quiet_s

    monkeypatch.setenv("HPCTRAIN_WAIT_NOTE_S", value)
    with pytest.raises(UserError, match=r"^HPCTRAIN_WAIT_NOTE_S=.* must be a number of seconds above 0 and at most"):
        _quiet_s()
    monkeypatch.setenv("HPCTRAIN_WAIT_NOTE_S", "1.5")
    assert _quiet_s() == 1.5
    monkeypatch.delenv("HPCTRAIN_WAIT_NOTE_S")
    assert _quiet_s() == 60.0
