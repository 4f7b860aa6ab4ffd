"""The job description: time/memory parsing (and Slurm's GRES), validation messages, job files (YAML and TOML)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.errors import UserError
from hpctrain.jobs import load_job_file
from hpctrain.jobs.mapping import VALID_KEYS, from_mapping
from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.jobs.values import format_duration, mem_text, parse_mem_bytes, parse_time_limit, time_text
from hpctrain.schedulers.slurm.flags import complete_job
from hpctrain.schedulers.slurm.grammar import read_gres_request
from hpctrain.schedulers.slurm.checks.login_node import missing_prerequisites, output_problems
from hpctrain.schedulers.slurm.batch.options import EnvironmentSpec, SlurmOptions, gres, read_file_section
from hpctrain.schedulers.slurm.batch.script import render_sbatch


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


@pytest.mark.parametrize("seconds", [1, 90, 1800, 3600, 5400, 86399, 86400, 86400 + 62, 100 * 86400])
def test_time_text_reads_back(seconds: int) -> None:
    assert parse_time_limit(time_text(seconds)) == seconds
    assert time_text(1800) == "30:00" and time_text(5400) == "1:30:00"


@pytest.mark.parametrize(
    "text,size",
    [
        ("0", 0),
        ("4000", 4000 << 20),
        ("4000M", 4000 << 20),
        ("16G", 16 << 30),
        ("1T", 1 << 40),
        ("2048K", 2 << 20),
        ("8gb", 8 << 30),
    ],
)
def test_mem(text: str, size: int) -> None:
    assert parse_mem_bytes(text) == size
    assert parse_mem_bytes(mem_text(size)) == size


@pytest.mark.parametrize("text", ["", "-1G", "16X", "G", "1.5G"])
def test_bad_mem(text: str) -> None:
    with pytest.raises(UserError, match="16G"):
        parse_mem_bytes(text)


@pytest.mark.parametrize(
    "text,parsed", [("gpu:2", (2, None, 0)), ("gpu:a100:4", (4, "a100", 0)), ("shard:16", (0, None, 16))]
)
def test_gres(text: str, parsed) -> None:
    assert read_gres_request(text) == parsed


@pytest.mark.parametrize("text", ["gpu", "gpu:0", "mps:50", "shard:x", "gpu:a:b:1", "gpu:1,shard:2"])
def test_bad_gres(text: str) -> None:
    with pytest.raises(UserError, match="gpu:N|both"):
        read_gres_request(text)


def test_resource_validation_messages() -> None:
    with pytest.raises(UserError, match="--nodes must be at least 1"):
        Resources(nodes=0)
    with pytest.raises(UserError, match="--cpus-per-task must be a whole number"):
        Resources(cpus_per_task="2")
    with pytest.raises(UserError, match="--mem must be a size"):
        Resources(mem_bytes=-1)


def test_slurm_checks_its_gpu_requests_against_the_job() -> None:
    """A GPU type and shards are Slurm's options: Slurm checks them with the job's GPU count."""
    job = JobSpec(command=("x",))
    with pytest.raises(UserError, match="not both"):
        render_sbatch(job.replace(resources=Resources(gpus_per_node=1)), SlurmOptions(shards_per_node=4))
    with pytest.raises(UserError, match="needs --gpus-per-node"):
        render_sbatch(job, SlurmOptions(gpu_type="a100"))
    with pytest.raises(UserError, match="sinfo -o %G"):
        SlurmOptions(gpu_type="a 100")
    two = job.replace(resources=Resources(gpus_per_node=2))
    assert gres(two, SlurmOptions(gpu_type="a100")) == "gpu:a100:2"
    assert gres(job, SlurmOptions(shards_per_node=16)) == "shard:16"
    assert gres(job, SlurmOptions()) is None


def test_job_validation_messages() -> None:
    with pytest.raises(UserError, match="no command"):
        JobSpec(command=())
    with pytest.raises(UserError, match="lower --signal-grace or raise --time"):
        JobSpec(command=("x",), time_limit_s=60, signal_grace=120)
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
    ok = SlurmOptions(environment=EnvironmentSpec(kind="apptainer", image=str(sif)))
    assert missing_prerequisites(ok) == []
    missing = SlurmOptions(environment=EnvironmentSpec(kind="apptainer", image=str(tmp_path / "nope.sif")))
    assert missing_prerequisites(missing) == [
        f"apptainer image {tmp_path / 'nope.sif'} does not exist: build or pull "
        "it first (apptainer pull ...) or fix --image"
    ]
    registry = SlurmOptions(
        environment=EnvironmentSpec(kind="pyxis", image="registry.example.com#team/pytorch:24.01-py3")
    )
    assert missing_prerequisites(registry) == []  # a registry reference is pulled by enroot on the node
    sqsh = SlurmOptions(environment=EnvironmentSpec(kind="pyxis", image=str(tmp_path / "x.sqsh")))
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
    section = read_file_section("job", {k: data.pop(k) for k in ("partition", "launcher", "gres", "environment")})
    data, section = complete_job(data, section, {})
    options = SlurmOptions(**section)
    assert (options.partition, options.launcher, options.gpu_type) == ("debug", "srun", "a100")
    assert options.environment == EnvironmentSpec(kind="conda", conda_env="train", modules=("cuda/12.4",))
    job = from_mapping(data)
    assert job.time_limit_s == 1800
    assert job.resources == Resources(nodes=2, nproc_per_node=2, gpus_per_node=2, cpus_per_task=4, mem_bytes=16 << 30)
    assert job.env == (("OMP_NUM_THREADS", "1"),)
    assert job.command == ("python", "train.py", "--lr", "0.1")


def test_to_dict_round_trips() -> None:
    job = JobSpec(
        command=("python", "x.py"),
        time_limit_s=86400,
        resources=Resources(nodes=2, nproc_per_node=2, gpus_per_node=2, mem_bytes=1536 << 20),
        env=(("A", "1"),),
    )
    assert job.to_dict()["time"] == "1-00:00:00" and job.to_dict()["mem"] == "1536M"
    assert from_mapping(job.to_dict()) == job
    environment = EnvironmentSpec(kind="pyxis", image="img", mounts=("/a:/b",), workdir="/w")
    assert read_file_section("job", {"environment": environment.to_data()}) == {"environment": environment.to_data()}
    assert SlurmOptions(environment=environment.to_data()).environment == environment


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
        ({"command": ["x"], "env": ["A=1"]}, "env must be a mapping"),
    ],
)
def test_job_file_errors(data: dict, message: str) -> None:
    with pytest.raises(UserError) as err:
        from_mapping(data, "job file j.yaml")
    assert message in str(err.value)


def test_slurm_environment_errors_name_the_key() -> None:
    with pytest.raises(UserError, match=r"unknown environment key\(s\) imag"):
        read_file_section("job file j.yaml", {"environment": {"kind": "apptainer", "imag": "x.sif"}})


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
