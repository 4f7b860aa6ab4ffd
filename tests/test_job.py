"""The job description: time/memory/gres parsing, validation messages, job files (YAML and TOML)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.errors import UserError
from hpctrain.jobs import load_job_file
from hpctrain.jobs.mapping import VALID_KEYS, from_mapping
from hpctrain.jobs.spec import EnvironmentSpec, JobSpec, Resources, missing_prerequisites
from hpctrain.jobs.values import format_duration, parse_gres, parse_mem_mb, parse_time_limit
from hpctrain.schedulers.slurm.local import output_problems
from hpctrain.schedulers.slurm.options import SlurmOptions, read_file_section
from hpctrain.schedulers.slurm.render import render_sbatch


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("30", 30 * 60),
        ("30:15", 30 * 60 + 15),
        ("01:30:00", 5400),
        ("2-00", 2 * 86400),
        ("1-12", 86400 + 12 * 3600),
        ("1-02:03", 86400 + 2 * 3600 + 3 * 60),
        ("1-02:03:04", 86400 + 2 * 3600 + 3 * 60 + 4),
        ("100:00:00", 100 * 3600),
    ],
)
def test_time_forms(text: str, seconds: int) -> None:
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["", "1h", "1:2:3:4", "-5", "1-", "a-01", "0", "00:00:00", "1.5", "1--2"])
def test_bad_times_name_the_forms(text: str) -> None:
    with pytest.raises(UserError, match=r"MM:SS|zero"):
        parse_time_limit(text)


def test_format_duration() -> None:
    assert format_duration(5400) == "01:30:00"
    assert format_duration(86400 + 62) == "1-00:01:02"


@pytest.mark.parametrize(
    "text,mb", [("0", 0), ("4000", 4000), ("4000M", 4000), ("16G", 16384), ("1T", 1048576), ("2048K", 2), ("8gb", 8192)]
)
def test_mem(text: str, mb: int) -> None:
    assert parse_mem_mb(text) == mb


@pytest.mark.parametrize("text", ["", "-1G", "16X", "G", "1.5G"])
def test_bad_mem(text: str) -> None:
    with pytest.raises(UserError, match="16G"):
        parse_mem_mb(text)


@pytest.mark.parametrize(
    "text,parsed", [("gpu:2", (2, None, 0)), ("gpu:a100:4", (4, "a100", 0)), ("shard:16", (0, None, 16))]
)
def test_gres(text: str, parsed) -> None:
    assert parse_gres(text) == parsed


@pytest.mark.parametrize("text", ["gpu", "gpu:0", "mps:50", "shard:x", "gpu:a:b:1", "gpu:1,shard:2"])
def test_bad_gres(text: str) -> None:
    with pytest.raises(UserError, match="gpu:N|both"):
        parse_gres(text)


def test_resource_validation_messages() -> None:
    with pytest.raises(UserError, match="--nodes must be at least 1"):
        Resources(nodes=0)
    with pytest.raises(UserError, match="--cpus-per-task must be a whole number"):
        Resources(cpus_per_task="2")
    with pytest.raises(UserError, match="not both"):
        Resources(gpus_per_node=1, shards_per_node=4)
    with pytest.raises(UserError, match="needs --gpus-per-node"):
        Resources(gpu_type="a100")
    assert Resources(gpus_per_node=2, gpu_type="a100").gres == "gpu:a100:2"
    assert Resources(shards_per_node=16).gres == "shard:16"
    assert Resources().gres is None


def test_job_validation_messages() -> None:
    with pytest.raises(UserError, match="no command"):
        JobSpec(command=())
    with pytest.raises(UserError, match="lower --signal-grace or raise --time"):
        JobSpec(command=("x",), time="1", signal_grace=120)
    with pytest.raises(UserError, match="environment variable name"):
        JobSpec(command=("x",), env=(("1BAD", "x"),))


def test_slurm_checks_the_launcher_against_the_resources() -> None:
    """How processes start is Slurm's option (SlurmOptions.launcher): Slurm checks it with the job's resources."""
    with pytest.raises(UserError, match="set --nproc-per-node 4"):
        render_sbatch(JobSpec(command=("x",), resources=Resources(nproc_per_node=2, gpus_per_node=4)))
    with pytest.raises(UserError, match="--launcher single runs one process"):
        render_sbatch(JobSpec(command=("x",), resources=Resources(nodes=2)), SlurmOptions(launcher="single"))
    with pytest.raises(UserError, match="use one of torchrun, srun, single"):
        SlurmOptions(launcher="mpirun")
    # one process driving several GPUs (DataParallel) is allowed
    render_sbatch(JobSpec(command=("x",), resources=Resources(gpus_per_node=4)), SlurmOptions(launcher="single"))


def test_environment_validation_messages() -> None:
    with pytest.raises(UserError, match="needs --image"):
        EnvironmentSpec(kind="apptainer")
    with pytest.raises(UserError, match="add --env-kind conda"):
        EnvironmentSpec(kind="venv", venv="v", conda_env="c")
    with pytest.raises(UserError, match="apply to containers"):
        EnvironmentSpec(kind="conda", conda_env="c", mounts=("/a:/a",))
    with pytest.raises(UserError, match="absolute path"):
        EnvironmentSpec(kind="pyxis", image="img", workdir="rel")
    with pytest.raises(UserError, match="unknown: use one of none, modules"):
        EnvironmentSpec(kind="docker")


def test_local_problems_find_missing_images(tmp_path: Path) -> None:
    sif = tmp_path / "ok.sif"
    sif.write_bytes(b"")
    ok = JobSpec(command=("x",), environment=EnvironmentSpec(kind="apptainer", image=str(sif)))
    assert missing_prerequisites(ok) == []
    missing = ok.replace(environment=EnvironmentSpec(kind="apptainer", image=str(tmp_path / "nope.sif")))
    assert missing_prerequisites(missing) == [
        f"apptainer image {tmp_path / 'nope.sif'} does not exist: build or pull "
        "it first (apptainer pull ...) or fix --image"
    ]
    registry = JobSpec(
        command=("x",), environment=EnvironmentSpec(kind="pyxis", image="registry.example.com#team/pytorch:24.01-py3")
    )
    assert missing_prerequisites(registry) == []  # a registry reference is pulled by enroot on the node
    sqsh = registry.replace(environment=EnvironmentSpec(kind="pyxis", image=str(tmp_path / "x.sqsh")))
    assert "enroot image" in missing_prerequisites(sqsh)[0]


# ---- job files ------------------------------------------------------------------------------------------

YAML_JOB = """\
name: ddp
partition: debug
time: 30:00          # unquoted: must stay 30 minutes, not YAML 1.1's base-60 integer 1800
nodes: 2
nproc_per_node: 2
gres: gpu:a100:2
cpus-per-task: 4
mem: 16G
launcher: srun
env:
  OMP_NUM_THREADS: 1
environment:
  kind: conda
  conda_env: train
  modules: [cuda/12.4]
command: [python, train.py, --lr, "0.1"]
"""

TOML_JOB = """\
name = "ddp"
partition = "debug"
time = "30:00"
nodes = 2
nproc_per_node = 2
gres = "gpu:a100:2"
cpus_per_task = 4
mem = "16G"
launcher = "srun"
command = ["python", "train.py", "--lr", "0.1"]

[env]
OMP_NUM_THREADS = "1"

[environment]
kind = "conda"
conda_env = "train"
modules = ["cuda/12.4"]
"""


@pytest.mark.parametrize("suffix,text", [(".yaml", YAML_JOB), (".toml", TOML_JOB)])
def test_job_file_formats_agree(tmp_path: Path, suffix: str, text: str) -> None:
    path = tmp_path / f"job{suffix}"
    path.write_text(text)
    data = load_job_file(path)
    # Slurm's options at the top level, where job files kept them before the `slurm:` section
    assert read_file_section("job", {k: data.pop(k) for k in ("partition", "launcher")}) == {
        "partition": "debug",
        "launcher": "srun",
    }
    job = from_mapping(data)
    assert job.time_limit_s == 1800
    assert job.resources == Resources(
        nodes=2, nproc_per_node=2, gpus_per_node=2, gpu_type="a100", cpus_per_task=4, mem="16G"
    )
    assert job.environment == EnvironmentSpec(kind="conda", conda_env="train", modules=("cuda/12.4",))
    assert job.env == (("OMP_NUM_THREADS", "1"),)
    assert job.command == ("python", "train.py", "--lr", "0.1")


def test_to_dict_round_trips() -> None:
    job = JobSpec(
        command=("python", "x.py"),
        time="1-00",
        resources=Resources(nodes=2, nproc_per_node=2, gpus_per_node=2),
        environment=EnvironmentSpec(kind="pyxis", image="img", mounts=("/a:/b",), workdir="/w"),
        env=(("A", "1"),),
    )
    assert from_mapping(job.to_dict()) == job


@pytest.mark.parametrize(
    "data,message",
    [
        ({"command": ["x"], "nodez": 2}, "unknown key(s) nodez; valid keys: " + ", ".join(VALID_KEYS)),
        ({"command": ["x"], "nodes": "two"}, "--nodes 'two' is neither a node count nor MIN:MAX"),
        ({"command": ["x"], "nodes": True}, "nodes must be a whole number"),
        ({"command": ["x"], "nodes": -1}, "--nodes must be at least 1 (got -1)"),
        ({"command": ["x"], "gpus_per_node": -2}, "--gpus-per-node must be at least 0 (got -2)"),
        ({"command": ["x"], "time": "1h"}, "use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"),
        ({"command": "python x.py"}, "command must be a list of strings"),
        ({"command": ["x"], "environment": {"kind": "apptainer", "imag": "x.sif"}}, "unknown environment key(s) imag"),
        ({"command": ["x"], "env": ["A=1"]}, "env must be a mapping"),
    ],
)
def test_job_file_errors(data: dict, message: str) -> None:
    with pytest.raises(UserError) as err:
        from_mapping(data, "job file j.yaml")
    assert message in str(err.value)


def test_job_file_syntax_and_suffix_errors(tmp_path: Path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text("nodes: [1\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_job_file(bad)
    bad_toml = tmp_path / "job.toml"
    bad_toml.write_text("nodes = \n")
    with pytest.raises(UserError, match="not valid TOML"):
        load_job_file(bad_toml)
    with pytest.raises(UserError, match=".yaml, .yml or .toml"):
        load_job_file(tmp_path / "job.json")
    with pytest.raises(UserError, match="cannot read job file"):
        load_job_file(tmp_path / "missing.yaml")


def test_local_problems_find_missing_log_directories(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    ok = SlurmOptions(output=str(tmp_path / "logs" / "%x-%j.out"))
    assert output_problems(ok) == []
    missing = SlurmOptions(error=str(tmp_path / "nope" / "%j.err"))
    assert output_problems(missing) == [
        f"--error {tmp_path / 'nope' / '%j.err'}: directory {tmp_path / 'nope'} does not exist and sbatch will not "
        "create it; "
        f"mkdir -p {tmp_path / 'nope'}"
    ]
    assert output_problems(SlurmOptions(output="job-%j.out")) == []  # the submit directory
