"""The job description is neutral (issue 40, item 1): JobSpec holds only what every scheduler means the same way, in
plain numbers (seconds, bytes), and each backend's own fields are its typed options part. Before, `Resources` held
Slurm's GPU type, shards and `--gres` form and memory in Slurm's text, `JobSpec` Slurm's software environment, its
interpreter and hang-restart budget, and `jobs/values.py` Slurm's output grammars; the Kubernetes renderer refused
those fields one by one. These tests read the code and run the CLI in-process (no cluster: `--dry-run`)."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

import hpctrain.jobs
from hpctrain.cli import main
from hpctrain.jobs.mapping import from_mapping
from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
from hpctrain.schedulers.slurm.batch.options import SlurmOptions

NEUTRAL_JOB = {
    "command",
    "name",
    "time_limit_s",
    "resources",
    "exclude_nodes",
    "env",
    "run_dir",
    "signal_grace",
    "max_restarts",
}
NEUTRAL_RESOURCES = {"nodes", "min_nodes", "nproc_per_node", "gpus_per_node", "cpus_per_task", "mem_bytes"}
JOBS_DIR = Path(hpctrain.jobs.__file__).parent
# Names of a scheduler's own grammar or fields: none may be an identifier in jobs/.
SCHEDULER_WORDS = ("slurm", "sbatch", "gres", "shard", "gpu_type", "environmentspec", "kubernetes", "quantity")


def test_the_job_description_holds_only_the_neutral_fields() -> None:
    assert {f.name for f in fields(JobSpec)} == NEUTRAL_JOB
    assert {f.name for f in fields(Resources)} == NEUTRAL_RESOURCES
    job = from_mapping({"command": ["x"], "time": "1:30:00", "mem": "16G", "nodes": "1:2", "max_restarts": 1})
    assert (job.time_limit_s, job.resources.mem_bytes) == (5400, 16 << 30)
    assert from_mapping(job.to_dict()) == job  # what job.yaml records reads back


def test_each_backend_keeps_its_own_fields_in_its_options_part() -> None:
    slurm = {f.name for f in fields(SlurmOptions)}
    assert {"partition", "account", "qos", "gpu_type", "shards_per_node", "environment", "python"} <= slurm
    assert {"max_hang_restarts", "max_requeues", "max_preemptions", "launcher"} <= slurm
    kubernetes = {f.name for f in fields(KubernetesOptions)}
    assert {"image", "shm", "volumes", "node_selector", "tolerations", "priority_class", "api"} <= kubernetes
    assert not (slurm | kubernetes) & NEUTRAL_JOB - {"name"}


def _identifiers(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            names.add(node.value)  # a dataclass field or a mapping key named in a string
    return names


@pytest.mark.parametrize("path", sorted(JOBS_DIR.glob("*.py")), ids=lambda p: p.name)
def test_jobs_imports_no_backend_and_names_no_scheduler_grammar(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = [
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    ]
    assert not [m for m in imported if m and m.startswith("hpctrain.schedulers")], imported
    named = sorted(n for n in _identifiers(tree) if any(word in n.lower() for word in SCHEDULER_WORDS))
    assert named == [], f"{path.name} names a scheduler's own grammar or fields: {named}"


@pytest.mark.parametrize(
    ("flags", "flag"),
    [
        (["--gres", "shard:4"], "--gres"),
        (["--gpu-type", "a100"], "--gpu-type"),
        (["--env-kind", "conda", "--conda-env", "x"], "--env-kind"),
        (["--max-hang-restarts", "1"], "--max-hang-restarts"),
    ],
)
def test_a_slurm_flag_for_kubernetes_is_one_line_before_anything_renders(capsys, flags: list[str], flag: str) -> None:
    code = main(["submit", "--scheduler", "kubernetes", "--dry-run", "--image", "img:1", *flags, "--", "true"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"{flag} is a Slurm option but the job goes to kubernetes" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("key", "value", "flag"),
    [("gpu_type", "a100", "--gpu-type"), ("environment", "conda", "environment"), ("max_hang_restarts", 5, "--max")],
)
def test_a_slurm_key_in_a_job_file_for_kubernetes_is_one_line(
    tmp_path: Path, capsys, key: str, value: object, flag: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"scheduler": "kubernetes", "command": ["true"], key: value}))
    code = main(["submit", "--dry-run", "--image", "img:1", "--job-file", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"({key} in a job file) is Slurm's: drop it for Kubernetes" in err and flag in err


def test_a_params_file_and_a_job_file_fill_the_same_two_parts(tmp_path: Path) -> None:
    """A platform's .params file and the YAML job file that says the same: the same JobSpec, the same options."""
    from hpctrain.engine.job_options import submission_from_args
    from hpctrain.cli.submit import add_arguments

    params = tmp_path / "job.params"
    params.write_text(
        "name=run1\nkind=PyTorchJob\nworker_count=2\nworker_cpu=8\nworker_gpu=2\nworker_memory=16\n"
        "worker_shared_memory=4\nworker_image=img:1\ncommand=python3 train.py\n"
    )
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        yaml.safe_dump(
            {
                "scheduler": "kubernetes",
                "name": "run1",
                "nodes": 2,
                "nproc_per_node": 2,
                "gpus_per_node": 2,
                "cpus_per_task": 4,
                "mem": "16G",
                "command": ["python3", "train.py"],
                "kubernetes": {"api": "pytorchjob", "image": "img:1", "shm": "4Gi"},
            }
        )
    )
    parser = __import__("argparse").ArgumentParser()
    add_arguments(parser)
    read = [submission_from_args(parser.parse_args(["--job-file", str(p)]), dry_run=True) for p in (params, job_file)]
    assert read[0].job == read[1].job
    assert read[0].job.resources == Resources(
        nodes=2, nproc_per_node=2, gpus_per_node=2, cpus_per_task=4, mem_bytes=16 << 30
    )
    ours = {k: v for k, v in read[0].options.items() if k != "namespace"}
    assert ours == {k: v for k, v in read[1].options.items() if k != "namespace"}
