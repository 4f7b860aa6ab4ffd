"""`hpctrain top JOB`: the probe step runs inside a real job on the local Slurm cluster, through
`srun --jobid --overlap`, and in each pod of a job on the local Kubernetes API server through its real exec
stream (answered by the real kubelet of the local cluster's node, tests/real_node.py). nvidia-smi is
a STAND-IN (tests/standins.py: no GPU or driver here) that prints the documented `--format=csv,noheader,nounits`
lines, and records that it was called with the query hpctrain needs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from around_helpers import cli_env, hpctrain
from hpctrain.health import ProgressRecorder, read_progress
from hpctrain.servers.top import NVIDIA_SMI, parse_probe, rank_lines, report
from real_node import Real, real_free  # noqa: F401 - the fixture: pods that ask for no CPU
from standins import calls, install


def test_rank_lines_show_each_rank_the_slowest_and_a_straggler(tmp_path: Path) -> None:
    for rank, forward_s in ((0, 0.010), (1, 0.011), (2, 0.050)):  # rank 2 computes five times as long
        ProgressRecorder(tmp_path, rank, 3, "a" if rank < 2 else "b", 100, interval_s=0.0).step(
            2, 150, 50, 32, 0.1, 0.001, forward_s
        )
    records = read_progress(tmp_path)
    lines = rank_lines(records, records[0].updated + 3)
    assert lines[0].split() == [
        "RANK",
        "HOST",
        "PHASE",
        "EPOCH",
        "STEP",
        "STEP",
        "ms",
        "INPUT",
        "ms",
        "FWD",
        "ms",
        "IMG/S",
        "AGE",
    ]
    assert lines[3].split() == ["2", "b", "training", "2", "150", "100.0", "1.0", "50.0", "320", "3s"]
    assert "images/s per node: a 640, b 320" in lines
    assert "slowest: rank 2 on b, 51.0 ms of its own per step (most of it compute (forward pass))" in lines
    assert lines[-1].startswith("straggler: rank 2 on b is a straggler")
    assert rank_lines([], 0.0) == []


def test_report_says_when_all_gpus_sit_idle() -> None:
    busy = parse_probe("0: @node node1\n0: @gpu 0, 97, 70000, 81559\n0: @gpu 1, 0, 3, 81559\n")
    lines = report(busy, None, "job 7")
    assert "1 of the 2 GPUs held by job 7 sit idle" in lines[-1]
    idle = parse_probe("0: @node node1\n0: @gpu 0, 0, 3, 81559\n1: @node node2\n1: @gpu 0, [N/A], 3, 81559\n")
    assert [s.node for s in idle] == ["node1", "node2"]
    assert "holds 2 GPU(s) and none is working" in report(idle, None, "job 7")[-1]
    assert not any("warning" in line for line in report(parse_probe("0: @node n\n0: @gpu 0, 50, 1, 2\n"), None, "j"))
    # Every node gets a line, also when it shows no GPU: no nvidia-smi, or one that listed nothing (it failed).
    assert "no nvidia-smi" in report(parse_probe("0: @node n1\n0: @load 0.5 0.4 0.3 1/9 7\n0: @nogpu\n"), None, "j")[1]
    assert "nvidia-smi: none" in report(parse_probe("0: @node n1\n0: @load 0.5 0.4 0.3 1/9 7\n"), None, "j")[1]


def test_report_columns_fit_pod_names() -> None:
    """On Kubernetes a node is shown as `NODE (POD)`, longer than a Slurm node name: the columns still line up."""
    samples = parse_probe(
        "0: @node standin-1 (imagenet-resnet50-worker-12)\n0: @gpu 0, 97, 70000, 81559\n"
        "1: @node n2\n1: @gpu 0, 0, 3, 81559\n"
    )
    header, *rows = report(samples, None, "job j")[:3]
    assert [row.index("%") for row in rows] == [header.index("UTIL") + 3] * 2
    assert [row.rindex("GiB") + 3 for row in rows] == [header.index("MEMORY") + 6] * 2


def test_exec_failure_reads_the_status_that_ends_the_stream() -> None:
    from hpctrain.schedulers.kubernetes.services.pods import exec_failure

    assert exec_failure('{"metadata":{},"status":"Success"}') is None
    assert exec_failure("") is None
    failed = json.dumps(
        {
            "metadata": {},
            "status": "Failure",
            "reason": "NonZeroExitCode",
            "message": "command terminated with non-zero exit code: exit status 3",
            "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
        }
    )
    assert exec_failure(failed) == "command terminated with non-zero exit code: exit status 3"


def test_run_dir_is_read_from_the_rendered_batch_script() -> None:
    from hpctrain.jobs.spec import JobSpec
    from hpctrain.schedulers.slurm.batch.script import render_sbatch
    from hpctrain.schedulers.slurm.queries.run_dir import parse_run_dir

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
    for rank, data_s in ((0, 0.002), (1, 0.080)):  # the live records two ranks of a run leave; rank 1 starves
        recorder = ProgressRecorder(run_dir, rank, 2, f"host{rank}", 100, interval_s=0.0)
        recorder.step(1, 120, 20, 64, 0.1, data_s, 0.01)
    # The job's steps see PATH and STANDIN_* of the srun that starts them (srun exports the caller's environment).
    env = cli_env(
        tmp_path / "home", path_prefix=bin_dir, STANDIN_LOG=str(log), STANDIN_GPUS="0, 0, 3, 81559;1, 0, 3, 81559"
    )
    job = slurm_cluster.sbatch("--job-name=top-test", "--cpus-per-task=1", "--wrap", "sleep 600", cwd=tmp_path)
    try:
        slurm_cluster.wait_state(job, {"RUNNING"}, timeout_s=400)
        result = hpctrain(
            "top",
            job,
            "--scheduler",
            "slurm",
            "--run-dir",
            str(run_dir),
            "--watch",
            "--count",
            "2",
            "--interval",
            "1",
            env=env,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.count(f"job {job} at ") == 2
        assert "RANK HOST " in result.stdout and "images/s per node: host0 640, host1 640" in result.stdout
        assert "slowest: rank 1 on host1, 90.0 ms of its own per step (most of it input)" in result.stdout
        assert "straggler: rank 1 on host1 is a straggler" in result.stdout
        assert f"job {job} holds 2 GPU(s) and none is working" in result.stdout
        node = slurm_cluster_node(slurm_cluster, job)
        assert any(line.startswith(node) and "IDLE" in line for line in result.stdout.splitlines())
        smi = [c for c in calls(log) if c[0] == "nvidia-smi"]
        assert len(smi) == 2 and all(c[1:] == list(NVIDIA_SMI[1:]) for c in smi)
        gone = hpctrain("top", "999999", "--scheduler", "slurm", env=env)
        assert gone.returncode == 2 and "not found" in gone.stderr
        # --watch outlives the job: it ends cleanly, saying so
        watching = subprocess.Popen(
            [sys.executable, "-m", "hpctrain", "top", job, "--scheduler", "slurm", "--watch", "--interval", "1"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            first = watching.stdout.readline()
            assert first.startswith(f"job {job} at "), first + watching.stderr.read()
            slurm_cluster.cancel_quietly(job)
            out, err = watching.communicate(timeout=120)
        finally:
            watching.kill()
        assert watching.returncode == 0, out + err
        assert f"job {job} is " in out and "not running" in out and out.rstrip().endswith("top ends"), out
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
        core.patch_node_status(
            node,
            {
                "status": {
                    "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": free_port()}},
                }
            },
        )
        custom.create_namespaced_custom_object(
            "kubeflow.org",
            "v1",
            namespace,
            "pytorchjobs",
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "metadata": {"name": "busy"},
                "spec": {
                    "pytorchReplicaSpecs": {
                        "Master": {
                            "replicas": 1,
                            "template": {
                                "spec": {
                                    "containers": [{"name": "pytorch", "image": "img", "command": ["sleep", "600"]}]
                                }
                            },
                        }
                    }
                },
            },
        )
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": "busy-master-0", "labels": {"training.kubeflow.org/job-name": "busy"}},
                "spec": {"nodeName": node, "containers": [{"name": "pytorch", "image": "img"}]},
            },
        )
        core.patch_namespaced_pod_status("busy-master-0", namespace, {"status": {"phase": "Running"}})
        result = hpctrain(
            "top",
            "busy",
            "--scheduler",
            "kubernetes",
            "--namespace",
            namespace,
            "--context",
            k8s_cluster.context,
            env=cli_env(tmp_path / "home"),
        )
        assert result.returncode == 2, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        assert "cannot run the probe in pod busy-master-0 through the API server's exec" in result.stderr
        assert "error dialing backend" in result.stderr  # the API server's own reason, not the raw handshake
        assert f"kubectl exec -n {namespace} busy-master-0 -- true" in result.stderr
    finally:
        core.delete_node(node)
        delete_namespace(api, namespace)


@pytest.mark.k8s
def test_top_on_kubernetes_runs_the_probe_in_each_pod(real_free: Real, tmp_path: Path) -> None:
    """The probe goes through the real API server's pods/exec to the real kubelet, which runs it in each pod's
    container (from the training image) with that container's environment. nvidia-smi is the stand-in of
    tests/standins.py (no GPU or nvidia-smi here), on the PATH of the pod spec as it would be in the image, from a
    hostPath volume; each replica reports its own GPUs, so the lines prove that every pod was asked, and asked with
    its own environment. The pods ask for no CPU: they share the node with other tests."""
    from kubernetes import client

    real = real_free
    bin_dir = install(tmp_path / "bin")
    log = tmp_path / "calls.jsonl"

    run_dir = tmp_path / "run"  # on the pods' volume: the ranks' live records, which only the pods can read
    for rank, host in ((0, "gpus-master-0"), (1, "gpus-worker-0")):
        recorder = ProgressRecorder(run_dir, rank, 2, host, steps_per_epoch=100)
        recorder.step(1, 40 + rank, 40 + rank, 64, 0.05, data_s=0.001, compute_s=0.01)
        recorder.phase("training")
    volume = {"volumes": [{"name": "test", "hostPath": {"path": str(tmp_path)}}]}
    mount = {"volumeMounts": [{"name": "test", "mountPath": str(tmp_path)}]}

    def replica(gpus: str) -> dict:
        env = [
            {"name": "PATH", "value": f"{bin_dir}:/usr/bin:/bin"},
            {"name": "STANDIN_LOG", "value": str(log)},
            {"name": "STANDIN_GPUS", "value": gpus},
            {"name": "HPCTRAIN_RUN_DIR", "value": str(run_dir)},
        ]
        return {
            "replicas": 1,
            "template": {
                "spec": {
                    **volume,
                    "containers": [
                        {"name": "pytorch", "image": real.image, "command": ["sleep", "600"], "env": env, **mount}
                    ],
                }
            },
        }

    custom, core = client.CustomObjectsApi(real.api), client.CoreV1Api(real.api)
    custom.create_namespaced_custom_object(
        "kubeflow.org",
        "v1",
        real.namespace,
        "pytorchjobs",
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "gpus"},
            "spec": {
                "pytorchReplicaSpecs": {"Master": replica("0, 97, 70000, 81559"), "Worker": replica("0, 0, 3, 81559")}
            },
        },
    )
    real.wait(
        "both pods running",
        lambda: [p.status.phase for p in core.list_namespaced_pod(real.namespace).items] == ["Running", "Running"],
    )
    result = hpctrain("top", "gpus", *real.where, env=real.env)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    master = [line for line in lines if "(gpus-master-0)" in line]
    worker = [line for line in lines if "(gpus-worker-0)" in line]
    assert len(master) == 1 and len(worker) == 1, result.stdout
    assert master[0].startswith(tuple(real.nodes)) and "97%" in master[0] and "68.4 GiB/79.6 GiB" in master[0], master
    assert "IDLE" not in master[0]
    assert "0%" in worker[0] and "3 MiB/79.6 GiB" in worker[0] and worker[0].endswith("IDLE")
    assert "1 of the 2 GPUs held by job gpus sit idle" in lines[-1]
    rows = [line.split() for line in lines if line.split()[:2] in (["0", "gpus-master-0"], ["1", "gpus-worker-0"])]
    assert [row[2:5] for row in rows] == [["training", "1", "40"], ["training", "1", "41"]], result.stdout
    smi = [c for c in calls(log) if c[0] == "nvidia-smi"]
    assert len(smi) == 2 and all(c[1:] == list(NVIDIA_SMI[1:]) for c in smi)

    # A container without a shell on its PATH (as in a distroless image): exec itself works, the probe cannot
    # start; one clear error.
    custom.create_namespaced_custom_object(
        "kubeflow.org",
        "v1",
        real.namespace,
        "pytorchjobs",
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "noshell"},
            "spec": {
                "pytorchReplicaSpecs": {
                    "Master": {
                        "replicas": 1,
                        "template": {
                            "spec": {
                                "containers": [
                                    {
                                        "name": "pytorch",
                                        "image": real.image,
                                        "command": [shutil.which("sleep") or "/usr/bin/sleep", "600"],
                                        "env": [{"name": "PATH", "value": str(tmp_path / "empty")}],
                                    }
                                ]
                            }
                        },
                    }
                }
            },
        },
    )
    real.wait(
        "the shell-less pod running",
        lambda: (
            [
                p.status.phase
                for p in core.list_namespaced_pod(
                    real.namespace, label_selector="training.kubeflow.org/job-name=noshell"
                ).items
            ]
            == ["Running"]
        ),
    )
    failed = hpctrain("top", "noshell", *real.where, env=real.env)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stdout + failed.stderr
    # containerd's words, through the kubelet and the API server
    assert re.search(
        r"the probe failed in pod noshell-master-0: Internal error occurred: error executing command in "
        r'container: .*exec: "sh": executable file not found in \$PATH',
        failed.stderr,
    ), failed.stderr
    assert "needs a POSIX shell" in failed.stderr
    assert not real.standin.errors, real.standin.errors
