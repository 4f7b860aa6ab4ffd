"""`hpctrain dev start|list|stop`: the rendered batch script and pod (pure), a real JupyterLab in a job on the
local Slurm cluster, and `cancel` of a session Pod on the local Kubernetes API server. The real JupyterLab in a
session Pod on the cluster's real node is tests/test_k8s_real_jobs.py's
test_dev_start_jupyterlab_through_a_real_port_forward."""

from __future__ import annotations

import json
import re
import stat
import time
from pathlib import Path

import pytest

from around_helpers import all_cmdlines, cli_env, hpctrain, venv_args
from hpctrain.servers.sessions import DevConfig
from hpctrain.schedulers.kubernetes.services.service_pods import render_dev_pod
from hpctrain.schedulers.slurm.services.service_jobs import render_dev_script
from hpctrain.errors import UserError
from hpctrain.jobs.spec import Resources
from hpctrain.schedulers.service_api import Placement
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
from hpctrain.servers.common import http_get


def test_script_reads_the_token_from_a_private_file_and_quotes_paths(tmp_path: Path) -> None:
    state = tmp_path / "it's here"
    cfg = DevConfig("nb", resources=Resources(cpus_per_task=4, mem_bytes=8 << 30))
    placement = Placement(options={"gres": "shard:8", "venv": "~/venvs/my env"})  # Slurm's own flags
    script = render_dev_script(cfg, state, placement)
    assert "umask 077" in script
    assert '"$(cat "$state_dir/token")"' in script and "export JUPYTER_TOKEN" in script
    assert "state_dir=" + "'" in script and "it'\"'\"'s here" in script  # shlex-quoted
    assert "#SBATCH --gres=shard:8" in script and "#SBATCH --cpus-per-task=4" in script
    assert "source \"$HOME\"/'venvs/my env/bin/activate'" in script
    assert "--token" not in script and "token=" not in script.replace("JUPYTER_TOKEN=", "")
    assert "sshd" in render_dev_script(DevConfig("nb", service="ssh"), state)


@pytest.mark.parametrize("service", ["jupyter", "ssh", "code"])
def test_scripts_pass_shellcheck(tmp_path: Path, service: str) -> None:
    import shutil
    import subprocess

    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (scripts/test.sh installs it)")
    cfg = DevConfig("nb", service=service)
    placement = Placement(image="a.sif", options={"mounts": ("/d:/d",)})
    script = tmp_path / "dev.sbatch"
    script.write_text(render_dev_script(cfg, tmp_path / "state", placement))
    result = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


def test_bad_names_and_services_are_refused() -> None:
    for bad in ("Nb", "a b", "x" * 41, "-x"):
        with pytest.raises(UserError, match="session name"):
            DevConfig(bad)
    with pytest.raises(UserError, match="--service"):
        DevConfig("nb", service="vnc")


def test_cli_refuses_bad_input_with_exit_2(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    result = hpctrain("dev", "start", "Bad Name", "--scheduler", "slurm", "--dry-run", env=env)
    assert result.returncode == 2 and "session name" in result.stderr and "Traceback" not in result.stderr
    result = hpctrain(
        "dev", "start", "nb", "--scheduler", "slurm", "--image", "docker://pytorch/pytorch:2.3.0", env=env
    )
    assert result.returncode == 2 and "hpctrain image pull" in result.stderr
    assert not (tmp_path / "dev").exists()


def test_idle_warn_reads_times_as_time_does(tmp_path: Path) -> None:
    """One grammar of times: --idle-warn takes --time's forms (it had its own: 90s, 30m, 2h, 1d)."""
    env = cli_env(tmp_path)
    result = hpctrain("dev", "list", "--idle-warn", "2h", env=env)
    assert result.returncode == 2 and "--idle-warn '2h': give a time as --time takes it" in result.stderr
    assert "Traceback" not in result.stderr
    from hpctrain.cli.dev import parse_duration_s

    assert [parse_duration_s(t, "--idle-warn") for t in ("30", "0:01", "2:00:00", "1-0")] == [1800, 1, 7200, 86400]


def test_pod_reads_the_token_from_its_secret() -> None:
    cfg = DevConfig("nb", resources=Resources(cpus_per_task=4, gpus_per_node=1, mem_bytes=16 << 30), time="2:00:00")
    pod = render_dev_pod(
        cfg,
        KubernetesOptions(
            namespace="team", image="quay.io/jupyter/pytorch-notebook", shm="4Gi", volumes=("pvc:data:/data",)
        ),
    )
    container = pod["spec"]["containers"][0]
    assert container["env"] == [
        {"name": "HPCTRAIN_PORT", "value": "8888"},
        {"name": "JUPYTER_TOKEN", "valueFrom": {"secretKeyRef": {"name": "dev-nb", "key": "token"}}},
    ]
    assert container["readinessProbe"]["httpGet"] == {"path": "/api", "port": "http"}
    assert container["resources"]["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"] or any(
        m["mountPath"] == "/dev/shm" for m in container["volumeMounts"]
    )
    assert pod["spec"]["activeDeadlineSeconds"] == 7200
    assert "token" not in json.dumps(container["command"])


@pytest.mark.slurm
def test_jupyterlab_session_on_slurm(slurm_cluster, tmp_path: Path) -> None:
    env = cli_env(tmp_path / "home")
    started = hpctrain(
        "dev",
        "start",
        "nb",
        "--scheduler",
        "slurm",
        "--cpus",
        "1",
        "--wait",
        "500",
        *venv_args(),
        env=env,
        cwd=tmp_path,
    )
    state = tmp_path / "home" / "dev" / "nb"
    conn = json.loads((state / "connection.json").read_text()) if (state / "connection.json").exists() else {}
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        token = (state / "token").read_text().strip()
        # Private: the folder 0700, the files with the token 0600, the job's output too.
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        for name in ("token", "connection.json", f"slurm-{conn['job_id']}.out"):
            assert stat.S_IMODE((state / name).stat().st_mode) == 0o600, name
        # It answers over HTTP with the token, and only with it.
        assert http_get(f"http://{conn['node']}:{conn['port']}/api/status", token)[0] == 200
        assert http_get(f"http://{conn['node']}:{conn['port']}/api/status")[0] == 403
        # The token is on no command line of any process on this host (ps shows them).
        assert not [c for c in all_cmdlines() if token in c]
        tunnel = f"ssh -N -L {conn['port']}:{conn['node']}:{conn['port']} "
        assert tunnel in started.stdout and f"http://localhost:{conn['port']}/lab?token={token}" in started.stdout
        time.sleep(2)
        listed = hpctrain("dev", "list", "--idle-warn", "0:01", "--scheduler", "slurm", env=env)
        assert listed.returncode == 0, listed.stderr
        assert re.search(rf"^nb\s+slurm\s+{conn['job_id']}\s+RUNNING\s", listed.stdout, re.M), listed.stdout
        assert "nb has been idle" in listed.stderr
        quiet = hpctrain("dev", "list", "--idle-warn", "1:00:00", "--scheduler", "slurm", env=env)
        assert "idle" not in quiet.stderr
        stopped = hpctrain("dev", "stop", "nb", env=env)
        assert stopped.returncode == 0 and "cancelled" in stopped.stdout, stopped.stdout + stopped.stderr
        assert slurm_cluster.state(conn["job_id"]) in ("CANCELLED", "COMPLETED", "GONE")
        assert not (state / "token").exists() and not (state / "connection.json").exists()
        assert hpctrain("dev", "list", "--scheduler", "slurm", env=env).stdout.startswith("no dev sessions")
    finally:
        if conn.get("job_id"):
            slurm_cluster.cancel_quietly(conn["job_id"])


@pytest.mark.k8s
@pytest.mark.slurm
def test_dev_list_notes_a_session_whose_job_has_ended(slurm_cluster, tmp_path: Path) -> None:
    """Which states mean "ended" is the backend's (SessionView.ended): a session whose job finished, and one whose
    job the scheduler forgot, are each noted with the `dev stop` that forgets them."""
    env = cli_env(tmp_path / "home")
    job_id = slurm_cluster.sbatch("--wrap", "true", "--output", "/dev/null", cwd=tmp_path)
    slurm_cluster.wait_state(job_id, {"COMPLETED"})
    for name, recorded_id in (("done", job_id), ("forgotten", "999999999")):
        state = tmp_path / "home" / "dev" / name
        state.mkdir(parents=True)
        (state / "connection.json").write_text(
            json.dumps({"name": name, "scheduler": "slurm", "job_id": recorded_id, "service": "jupyter"})
        )
    listed = hpctrain("dev", "list", "--scheduler", "slurm", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "note: done has ended (COMPLETED); `hpctrain dev stop done` forgets it" in listed.stdout, listed.stdout
    assert "note: forgotten has ended (GONE); `hpctrain dev stop forgotten` forgets it" in listed.stdout, listed.stdout


def test_cancel_deletes_a_service_pod_and_its_secret(k8s_cluster, tmp_path: Path) -> None:
    """`hpctrain cancel NAME` on Kubernetes: a dev or TensorBoard pod (no job object) goes with its Secret. No pod
    runs (no kubelet): deleting one the API server has never seen bound is immediate."""
    from kubernetes import client

    from hpctrain.schedulers.kubernetes.services import pods
    from hpctrain.schedulers.kubernetes.services import service_pods as k8s
    from kubeflow_standin import create_namespace, delete_namespace

    api = k8s_cluster.api_client()
    namespace = create_namespace(api)
    core = client.CoreV1Api(api)
    env = cli_env(tmp_path / "home")
    where = ["--scheduler", "kubernetes", "--namespace", namespace, "--context", k8s_cluster.context]
    try:
        spec = k8s.ServicePod(name="dev-gone", kind="dev", command=("sleep", "1"), port=8888)
        options = KubernetesOptions(namespace=namespace, image="img")
        pods.create(core, k8s.render_pod(spec, options), k8s.render_secret(spec, options, {"token": "t"}))
        cancelled = hpctrain("cancel", "dev-gone", *where, env=env)
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        assert f"dev pod {namespace}/dev-gone and its secret deleted" in cancelled.stdout
        assert not core.list_namespaced_pod(namespace).items
        assert not [s for s in core.list_namespaced_secret(namespace).items if s.metadata.name == "dev-gone"]
        missing = hpctrain("cancel", "dev-gone", *where, env=env)
        assert missing.returncode == 2 and "no PyTorchJob named 'dev-gone'" in missing.stderr, missing.stderr
    finally:
        delete_namespace(api, namespace)
