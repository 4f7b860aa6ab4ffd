"""Kubernetes (and shared) submission input that must be refused or hidden before anything reaches a cluster:
absurd resource values, a key given twice in a YAML job file, URL passwords in a dry run; and the defaults of
where jobs go (HPCTRAIN_SCHEDULER, HPCTRAIN_NAMESPACE, the kubeconfig context's namespace). No cluster is needed:
`submit --dry-run` renders and checks here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from around_helpers import cli_env
from hpctrain.servers.sessions import DevConfig
from hpctrain.errors import UserError
from hpctrain.schedulers.slurm.batch.options import EnvironmentSpec
from training_helpers import run_hpctrain

IMAGE = "example.invalid/hpctrain:test"
K8S_DRY = ("submit", "--dry-run", "--scheduler", "kubernetes", "--image", IMAGE)


def run(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**cli_env(cwd / "home"), **env}
    for name in ("HPCTRAIN_SCHEDULER", "HPCTRAIN_NAMESPACE"):
        if name not in env:
            environ.pop(name, None)
    return run_hpctrain(*args, cwd=cwd, env=environ)


def one_error(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, proc
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, proc.stderr
    for word in words:
        assert word in errors[0], proc.stderr


# ---- absurd values (item 9) -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--nodes", "99999999999999"), "--nodes 99999999999999 is more than 100000"),
        (("--gpus-per-node", "99999999999999999999"), "--gpus-per-node 99999999999999999999 is more than 1024"),
        (("--nproc-per-node", "5000"), "--nproc-per-node 5000 is more than 1024"),
        (("--mem", "99999999999999999999999T"), "is more than 1024T per node"),
        (("--mem", "99999999999999999999999K"), "is more than 1024T per node"),
        (("--shm", "99999999999Ei"), "--shm '99999999999Ei' is more than 1Pi"),
    ],
)
def test_absurd_resources_are_refused_before_rendering(tmp_path: Path, flags: tuple[str, ...], said: str) -> None:
    proc = run(*K8S_DRY, *flags, "--", "python", "-c", "pass", cwd=tmp_path)
    one_error(proc, said)
    assert proc.stdout == ""


def test_absurd_params_file_values_are_refused(tmp_path: Path) -> None:
    params = tmp_path / "job.params"
    params.write_text(
        f"name=big\nworker_image={IMAGE}\nworker_gpu=99999999999999999999\nworker_cpu=99999999999999999999\n"
        "command=python -c pass\n"
    )
    one_error(run("submit", "--dry-run", "--job-file", str(params), cwd=tmp_path), "more than")
    params.write_text(f"name=big\nworker_image={IMAGE}\nworker_memory=1e100000\ncommand=python -c pass\n")
    one_error(run("submit", "--dry-run", "--job-file", str(params), cwd=tmp_path), "worker_memory='1e100000'")


# ---- a key given twice (item 10) --------------------------------------------------------------------------------


def test_a_yaml_job_file_with_a_key_twice_is_refused(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        f"scheduler: kubernetes\nnodes: 2\ncommand: [python, -c, pass]\nkubernetes: {{image: {IMAGE}}}\nnodes: 4\n"
    )
    one_error(run("submit", "--dry-run", "--job-file", str(job), cwd=tmp_path), "'nodes' is given twice", "line 5")
    nested = tmp_path / "nested.yaml"
    nested.write_text(
        f"scheduler: kubernetes\ncommand: [python]\nkubernetes:\n  image: {IMAGE}\n  namespace: a\n  namespace: b\n"
    )
    one_error(run("submit", "--dry-run", "--job-file", str(nested), cwd=tmp_path), "'namespace' is given twice")


# ---- secrets in URLs (item 11) ----------------------------------------------------------------------------------


@pytest.mark.parametrize("scheduler", [("--scheduler", "kubernetes", "--image", IMAGE), ("--scheduler", "slurm")])
def test_dry_run_hides_url_passwords(tmp_path: Path, scheduler: tuple[str, ...]) -> None:
    proc = run(
        "submit",
        "--dry-run",
        *scheduler,
        "--setenv",
        "HTTPS_PROXY=http://user:s3cret-1@proxy.example:3128",
        "--",
        "python",
        "-c",
        "pass",
        "--mirror",
        "http://bob:s3cret-2@mirror.example/data",
        cwd=tmp_path,
    )
    assert "HTTPS_PROXY" in proc.stdout and "--mirror" in proc.stdout, proc
    assert "s3cret" not in proc.stdout + proc.stderr
    assert "http://user:***@proxy.example:3128" in proc.stdout and "http://bob:***@mirror.example/data" in proc.stdout


# ---- where jobs go by default (item 3) --------------------------------------------------------------------------


def kubeconfig(path: Path, namespace: str | None, current: str = "work") -> Path:
    contexts = [
        {"name": "work", "context": {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}},
        {"name": "other", "context": {"cluster": "c", "user": "u", "namespace": "other-ns"}},
    ]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": current,
                "contexts": contexts,
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )
    return path


def manifest_namespace(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode in (0, 2) and proc.stdout, proc
    return yaml.safe_load(proc.stdout)["metadata"]["namespace"]


def test_the_kubeconfig_contexts_namespace_is_the_default(tmp_path: Path) -> None:
    config = str(kubeconfig(tmp_path / "config", "team-a"))
    job = (*K8S_DRY, "--", "python", "-c", "pass")
    assert manifest_namespace(run(*job, cwd=tmp_path, KUBECONFIG=config)) == "team-a"
    assert (
        manifest_namespace(run(*job[:4], "--context", "other", *job[4:], cwd=tmp_path, KUBECONFIG=config)) == "other-ns"
    )
    assert manifest_namespace(run(*job, cwd=tmp_path, KUBECONFIG=config, HPCTRAIN_NAMESPACE="env-ns")) == "env-ns"
    assert (
        manifest_namespace(
            run(
                *job[:4],
                "--namespace",
                "flag-ns",
                *job[4:],
                cwd=tmp_path,
                KUBECONFIG=config,
                HPCTRAIN_NAMESPACE="env-ns",
            )
        )
        == "flag-ns"
    )
    plain = str(kubeconfig(tmp_path / "plain", None))
    assert manifest_namespace(run(*job, cwd=tmp_path, KUBECONFIG=plain)) == "default"


def test_context_namespace_merges_kubeconfig_files_as_kubectl(tmp_path: Path) -> None:
    from hpctrain.schedulers.kubernetes.api.kubeconfig import context_namespace, default_namespace

    first = kubeconfig(tmp_path / "a", "first-ns", current="other")
    second = tmp_path / "b"
    second.write_text("{not yaml")
    env = {"KUBECONFIG": f"{second}{os.pathsep}{first}"}
    assert context_namespace(None, env) == "other-ns"
    assert context_namespace("work", env) == "first-ns"
    assert context_namespace("missing", env) is None
    assert default_namespace(None, {"KUBECONFIG": str(second)}) == "default"


def test_hpctrain_scheduler_picks_the_scheduler(tmp_path: Path) -> None:
    proc = run(
        "submit",
        "--dry-run",
        "--image",
        IMAGE,
        "--",
        "python",
        "-c",
        "pass",
        cwd=tmp_path,
        HPCTRAIN_SCHEDULER="kubernetes",
        HPCTRAIN_NAMESPACE="env-ns",
    )
    assert yaml.safe_load(proc.stdout)["kind"] == "PyTorchJob", proc
    one_error(run("status", cwd=tmp_path, HPCTRAIN_SCHEDULER="pbs"), "HPCTRAIN_SCHEDULER='pbs' is unknown")


# ---- dev start without JupyterLab (item 4) ----------------------------------------------------------------------


def test_dev_start_refuses_an_environment_without_jupyterlab(tmp_path: Path) -> None:
    from hpctrain.schedulers.slurm.services.dev_sessions import check_program

    venv = tmp_path / "bare-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    cfg, environment = DevConfig("nb"), EnvironmentSpec("venv", venv=str(venv))
    with pytest.raises(UserError, match=r"pip install 'hpctrain\[jupyter\]'"):
        check_program(cfg, environment, {"PATH": "/usr/bin:/bin"})
    check_program(cfg, environment, {"PATH": f"{Path(sys.executable).parent}:/usr/bin"})  # the tests' venv has it
    check_program(cfg, EnvironmentSpec("modules", modules=("jupyter",)), {"PATH": "/usr/bin"})

    proc = run("dev", "start", "nb", "--scheduler", "slurm", "--venv", str(venv), cwd=tmp_path, PATH="/usr/bin:/bin")
    one_error(proc, "JupyterLab is not in the session's environment", "pip install 'hpctrain[jupyter]'")
    assert not (tmp_path / "home" / "dev" / "nb" / "connection.json").exists()
