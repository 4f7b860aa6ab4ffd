"""KubernetesOptions and the params file: every bad value is refused with a message naming the fix; good values
parse to what the manifest needs. Also the scheduler registry and its detect()."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.errors import UserError
from hpctrain.jobs.mapping import from_mapping
from hpctrain.schedulers import SCHEDULERS, blocking, detect, get_scheduler
from hpctrain.schedulers.kubernetes.manifests.options import (
    KubernetesOptions,
    Volume,
    parse_quantity,
    parse_toleration,
    parse_volume,
)
from hpctrain.schedulers.job_sections import read_job_file
from hpctrain.schedulers.kubernetes.manifests.params import parse_params_text


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"namespace": "Team_A"}, "--namespace 'Team_A' is not a valid Kubernetes name"),
        ({"api": "mpijob"}, "use pytorchjob (Kubeflow v1) or trainjob"),
        ({"image": "a b"}, "--image 'a b' is not an image reference"),
        ({"shm": "lots"}, "--shm 'lots' is not a size: use a Kubernetes quantity such as 8Gi"),
        ({"shm": "8"}, "below 1Mi: give the size with a unit"),
        ({"priority_class": "High!"}, "--priority-class 'High!'"),
        ({"service_account": "_x"}, "--service-account '_x'"),
        ({"image_pull_secrets": ("Reg Cred",)}, "--image-pull-secret 'Reg Cred'"),
        ({"volumes": ("pvc:data",)}, "use pvc:CLAIM:/mount[:ro]"),
        ({"volumes": ("s3:bucket:/mnt",)}, "use pvc:CLAIM:/mount[:ro]"),
        ({"volumes": ("pvc:data:relative",)}, "the mount path must be an absolute directory"),
        ({"volumes": ("pvc:data:/dev/shm",)}, "use --shm for that"),
        ({"volumes": ("nfs:server:export:/mnt",)}, "absolute export path"),
        ({"volumes": ("host:relative:/mnt",)}, "the node path must be absolute"),
        ({"volumes": ("pvc:Data:/mnt",)}, "give the PVC's name"),
        ({"volumes": ("pvc:a:/mnt", "pvc:b:/mnt/")}, "/mnt is mounted twice"),
        ({"node_selector": ("gpu",)}, "--node-selector 'gpu': use KEY=VALUE"),
        ({"node_selector": ("a=b c",)}, "not a valid label value"),
        ({"tolerations": ("gpu:Sometimes",)}, "the effect must be one of NoSchedule, PreferNoSchedule, NoExecute"),
        ({"tolerations": (":NoSchedule",)}, "not a valid label key"),
        ({"labels": ("x",)}, "--label 'x': use KEY=VALUE"),
        ({"volumes": "pvc:a:/mnt"}, "volumes must be a list of strings"),
    ],
)
def test_options_refused(fields: dict, message: str) -> None:
    with pytest.raises(UserError) as err:
        KubernetesOptions(**fields)
    assert message in str(err.value)


def test_options_parse() -> None:
    o = KubernetesOptions(
        volumes=("pvc:runs:/mnt/share:ro", "nfs:nas:/export/u:/mnt/user", "host:/scratch:/scratch:rw"),
        node_selector=("nvidia.com/gpu.product=A100",),
        tolerations=("nvidia.com/gpu:NoSchedule", "dedicated=ml", "spot=true:NoExecute"),
        shm="2Gi",
    )
    assert o.parsed_volumes == (
        Volume("pvc", "runs", "/mnt/share", read_only=True),
        Volume("nfs", "/export/u", "/mnt/user", server="nas"),
        Volume("host", "/scratch", "/scratch"),
    )
    assert o.node_selector_map == {"nvidia.com/gpu.product": "A100"}
    assert o.toleration_list == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml"},
        {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute"},
    ]
    assert o.shm_bytes == 2 * 2**30


@pytest.mark.parametrize(
    "text,value", [("500m", 0.5), ("4", 4), ("16Gi", 16 * 2**30), ("8G", 8e9), ("1.5Ki", 1536), (".5", 0.5)]
)
def test_parse_quantity(text: str, value: float) -> None:
    assert float(parse_quantity(text)) == value


@pytest.mark.parametrize("text", ["", "1.2.3", "4 Gi", "-1", "1gb", "Gi"])
def test_parse_quantity_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


def test_parse_helpers_direct() -> None:
    assert parse_volume("nfs:10.0.0.5:/export:/mnt/nas:ro") == Volume(
        "nfs", "/export", "/mnt/nas", server="10.0.0.5", read_only=True
    )
    assert parse_toleration("gpu") == {"key": "gpu", "operator": "Exists"}


PAI_EXAMPLE = """\
name=yourtaskname
kind=PyTorchJob
worker_count=1
worker_cpu=4
worker_gpu=0
worker_memory=4
worker_shared_memory=4
worker_image=master0:5000/eflops/pytorch:v1
command=python3 /mnt/user/NAME/mnist.py --backend nccl --epochs=10
priority=1
workspace_id=your-workspace-id
interactive=false
"""


def test_params_platform_example(tmp_path: Path) -> None:
    path = tmp_path / "job.params"
    path.write_text("# the platform's example\n\n" + PAI_EXAMPLE)
    read = read_job_file(path)
    job_fields, option_fields = read.job, read.options
    assert job_fields == {
        "name": "yourtaskname",
        "nodes": 1,
        "nproc_per_node": 1,
        "cpus_per_task": 4,
        "mem": "4096M",
        "command": ["python3", "/mnt/user/NAME/mnist.py", "--backend", "nccl", "--epochs=10"],
    }
    assert option_fields == {
        "api": "pytorchjob",
        "shm": "4Gi",
        "image": "master0:5000/eflops/pytorch:v1",
        "labels": ("hpctrain.io/priority=1",),
        "namespace": "your-workspace-id",
    }
    job = from_mapping(job_fields, source=str(path))  # the same checks as a YAML/TOML job file
    options = KubernetesOptions(**option_fields)
    assert job.resources.mem_bytes == 4096 * 2**20 and options.shm_bytes == 4 * 2**30


def test_params_gpus_split_cpus_per_process() -> None:
    job, options = parse_params_text("kind=TrainJob\nworker_count=2\nworker_cpu=16\nworker_gpu=2\nworker_memory=0.5\n")
    assert job == {"nodes": 2, "gpus_per_node": 2, "nproc_per_node": 2, "cpus_per_task": 8, "mem": "512M"}
    assert options == {"api": "trainjob"}


@pytest.mark.parametrize(
    "text,messages",
    [
        ("worker_count=two\n", ["worker_count='two' must be a whole number >= 1"]),
        ("worker_count=0\n", ["worker_count='0' must be a whole number >= 1"]),
        (
            "worker_memory=-4\nworker_cpu=1.5\n",
            ["worker_memory='-4' must be a positive number of GB", "worker_cpu='1.5' must be a whole number"],
        ),
        ("worker_shared_memory=lots\n", ["worker_shared_memory='lots' must be a positive number of GB"]),
        ("worker_memory=4\nworker_shared_memory=8\n", ["worker_shared_memory=8 exceeds worker_memory=4"]),
        ("worker_cpu=5\nworker_gpu=2\n", ["worker_cpu=5 is not a multiple of worker_gpu=2"]),
        ("kind=TFJob\n", ["kind='TFJob' is not supported: use PyTorchJob or TrainJob"]),
        ("interactive=true\n", ["interactive=true asks for an interactive session"]),
        ("interactive=maybe\n", ["interactive='maybe' must be true or false"]),
        ("command=python 'unclosed\n", ["cannot be split into words"]),
        ("command=\n", ["command= is empty"]),
        ("gpus=1\nqueue=a\nname=x\n", ["unknown key(s) gpus, queue (valid: name, kind,"]),
        ("name=a\nname=b\n", ["name is given twice (line 2)"]),
        ("just words\n", ["line 1 'just words' is not key=value"]),
    ],
)
def test_params_refused(text: str, messages: list[str]) -> None:
    with pytest.raises(UserError) as err:
        parse_params_text(text, source="job.params")
    assert str(err.value).startswith("job.params: ")
    for message in messages:
        assert message in str(err.value)


def test_params_unreadable(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot read job file"):
        read_job_file(tmp_path / "missing.params")


def test_registry_and_detect(tmp_path: Path) -> None:
    assert set(SCHEDULERS) == {"slurm", "kubernetes"}
    with pytest.raises(UserError, match="--scheduler 'pbs' is unknown: use one of slurm, kubernetes"):
        get_scheduler("pbs")
    assert get_scheduler("kubernetes", namespace="team-a").options.namespace == "team-a"
    no_sbatch = lambda name: None
    assert detect({}, which=lambda name: "/usr/bin/sbatch") == "slurm"
    config = tmp_path / "config"
    config.write_text("{}")
    assert detect({"KUBECONFIG": f"{tmp_path / 'none'}:{config}"}, which=no_sbatch) == "kubernetes"
    (tmp_path / "home" / ".kube").mkdir(parents=True)
    (tmp_path / "home" / ".kube" / "config").write_text("{}")
    assert detect({"HOME": str(tmp_path / "home")}, which=no_sbatch) == "kubernetes"
    with pytest.raises(UserError, match="no scheduler found"):
        detect({"KUBECONFIG": str(tmp_path / "none")}, which=no_sbatch)
    assert (
        detect({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}, which=no_sbatch)
        == "kubernetes"
    )
    with pytest.raises(UserError, match="no scheduler found"):
        detect({"HOME": str(tmp_path / "nobody")}, which=no_sbatch)


def test_blocking_ignores_warnings() -> None:
    assert blocking(["warning: no --run-dir", "namespace 'x' does not exist"]) == ["namespace 'x' does not exist"]


def test_kubernetes_client_is_imported_only_when_used() -> None:
    code = (
        "import sys; import hpctrain.cli, hpctrain.schedulers;"
        "from hpctrain.schedulers import get_scheduler;"
        "from hpctrain.jobs.spec import JobSpec;"
        "s = get_scheduler('kubernetes', image='img:1'); s.render(JobSpec(command=('hpctrain', 'train', 'mnist')));"
        "print(sorted(m for m in sys.modules if m == 'kubernetes' or m.startswith('kubernetes.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
