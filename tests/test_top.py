"""`hpctrain top JOB`: the probe step runs inside a real job on the local Slurm cluster, through
`srun --jobid --overlap`; nvidia-smi is a STAND-IN (tests/standins.py: no GPU or driver here) that prints the
documented `--format=csv,noheader,nounits` lines, and records that it was called with the query hpctrain needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from around_helpers import cli_env, hpctrain
from hpctrain.top import NVIDIA_SMI, parse_probe, report
from standins import calls, install


def test_report_says_when_all_gpus_sit_idle() -> None:
    busy = parse_probe("0: @node node1\n0: @gpu 0, 97, 70000, 81559\n0: @gpu 1, 0, 3, 81559\n")
    lines = report(busy, None, "job 7")
    assert "1 of the 2 GPUs held by job 7 sit idle" in lines[-1]
    idle = parse_probe("0: @node node1\n0: @gpu 0, 0, 3, 81559\n1: @node node2\n1: @gpu 0, [N/A], 3, 81559\n")
    assert [s.node for s in idle] == ["node1", "node2"]
    assert "holds 2 GPU(s) and none is working" in report(idle, None, "job 7")[-1]
    assert not any("warning" in line for line in report(parse_probe("0: @node n\n0: @gpu 0, 50, 1, 2\n"), None, "j"))


def test_run_dir_is_read_from_the_rendered_batch_script() -> None:
    from hpctrain.jobs.spec import JobSpec
    from hpctrain.schedulers.slurm.render import render_sbatch
    from hpctrain.top import parse_run_dir

    for given, expected in (("runs/mnist-%j", "/scratch/proj/runs/mnist-77"), ("~/my runs/%j", "/home/u/my runs/77")):
        script = render_sbatch(JobSpec(command=("python", "train.py"), run_dir=given))
        assert parse_run_dir(script, "77", "/scratch/proj", home="/home/u") == Path(expected)
    assert parse_run_dir("#!/bin/bash\nsleep 1\n", "77", "/w") is None


@pytest.mark.slurm
def test_top_of_a_running_job(slurm_cluster, tmp_path: Path) -> None:
    bin_dir = install(tmp_path / "bin")
    log = tmp_path / "calls.jsonl"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 120, "epoch": 2, "images_per_s": 2345.0}) + "\n")
    # The job's steps see PATH and STANDIN_* of the srun that starts them (srun exports the caller's environment).
    env = cli_env(tmp_path / "home", path_prefix=bin_dir, STANDIN_LOG=str(log), STANDIN_GPUS="0, 0, 3, 81559;1, 0, 3, 81559")
    job = slurm_cluster.sbatch("--job-name=top-test", "--cpus-per-task=1", "--wrap", "sleep 600", cwd=tmp_path)
    try:
        slurm_cluster.wait_state(job, {"RUNNING"}, timeout_s=400)
        result = hpctrain("top", job, "--scheduler", "slurm", "--run-dir", str(run_dir), "--watch", "--count", "2",
                          "--interval", "1", env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.count(f"job {job} at ") == 2
        assert "step 120, epoch 2, 2,345 images/s" in result.stdout
        assert f"job {job} holds 2 GPU(s) and none is working" in result.stdout
        node = slurm_cluster_node(slurm_cluster, job)
        assert any(line.startswith(node) and "IDLE" in line for line in result.stdout.splitlines())
        smi = [c for c in calls(log) if c[0] == "nvidia-smi"]
        assert len(smi) == 2 and all(c[1:] == list(NVIDIA_SMI[1:]) for c in smi)
        gone = hpctrain("top", "999999", "--scheduler", "slurm", env=env)
        assert gone.returncode == 2 and "not found" in gone.stderr
    finally:
        slurm_cluster.cancel_quietly(job)


def slurm_cluster_node(cluster, job: str) -> str:
    import subprocess

    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True, check=False).stdout
    return out.strip()


@pytest.mark.k8s
def test_top_on_kubernetes_says_why_exec_failed(k8s_cluster, tmp_path: Path) -> None:
    """exec needs a kubelet, and none can run here: the pod is bound to a Node object whose kubelet port nobody
    listens on, so the real API server fails to dial it, as it would with a dead kubelet. `top` must say so in one
    clear message (exit 2), not with a traceback."""
    from kubernetes import client

    from kubeflow_standin import create_namespace, delete_namespace, free_port

    api = k8s_cluster.api_client()
    namespace = create_namespace(api)
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    node = f"no-kubelet-{namespace}"
    try:
        core.create_node({"metadata": {"name": node}})
        core.patch_node_status(node, {"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                                                 "daemonEndpoints": {"kubeletEndpoint": {"Port": free_port()}}}})
        custom.create_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", {
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "busy"},
            "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {"spec": {
                "containers": [{"name": "pytorch", "image": "img", "command": ["sleep", "600"]}]}}}}}})
        core.create_namespaced_pod(namespace, {
            "metadata": {"name": "busy-master-0", "labels": {"training.kubeflow.org/job-name": "busy"}},
            "spec": {"nodeName": node, "containers": [{"name": "pytorch", "image": "img"}]}})
        core.patch_namespaced_pod_status("busy-master-0", namespace, {"status": {"phase": "Running"}})
        result = hpctrain("top", "busy", "--scheduler", "kubernetes", "--namespace", namespace,
                          "--context", k8s_cluster.context, env=cli_env(tmp_path / "home"))
        assert result.returncode == 2, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        assert "cannot run the probe in pod busy-master-0 through the API server's exec" in result.stderr
        assert "error dialing backend" in result.stderr  # the API server's own reason, not the raw handshake
        assert f"kubectl exec -n {namespace} busy-master-0 -- true" in result.stderr
    finally:
        core.delete_node(node)
        delete_namespace(api, namespace)
