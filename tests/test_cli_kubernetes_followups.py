"""What happens around a Kubernetes job, through the CLI against the real local API server (scripts/local-k8s.sh):
where the submission is recorded (only where the run dir is visible here, owner-only), the commands hpctrain
suggests (they carry the flags that find the job, and work when pasted while another context is the current one),
`cancel` of a job whose object stays (this server has no garbage
collector: a foreground deletion never ends, as on a cluster whose kube-controller-manager is down), a namespace
that does not exist, and the API server's own reason for a refused object. No stand-in runs here: no pod exists.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from k8s_fixtures import CONTEXT, LocalK8s, hpctrain
from kubeflow_standin import create_namespace, delete_namespace

pytestmark = [pytest.mark.k8s]
IMAGE = "example.invalid/hpctrain:test"


@pytest.fixture
def namespace(k8s_cluster: LocalK8s):
    api = k8s_cluster.api_client()
    name = create_namespace(api, prefix="hpct-fu")
    yield name
    delete_namespace(api, name)


def where(namespace: str) -> list[str]:
    return ["--scheduler", "kubernetes", "--context", CONTEXT, "--namespace", namespace]


def submit(namespace: str, name: str, *flags: str, cwd: Path):
    return hpctrain(
        "submit",
        "--no-check",
        *where(namespace),
        "--image",
        IMAGE,
        "--job-name",
        name,
        *flags,
        "--",
        sys.executable,
        "-c",
        "pass",
        cwd=cwd,
    )


def test_the_record_goes_where_the_run_dir_is_visible_and_is_private(namespace: str, tmp_path: Path) -> None:
    nas = tmp_path / "nas"
    nas.mkdir()
    pod_mount = f"/hpct-pod-{uuid.uuid4().hex[:8]}"  # a path only the pods have
    proc = submit(
        namespace,
        "rec-1",
        "--volume",
        f"host:{nas}:{pod_mount}",
        "--run-dir",
        f"{pod_mount}/runs/%j",
        "--setenv",
        "HTTPS_PROXY=http://user:s3cret@proxy.example:3128",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    record = nas / "runs" / "rec-1"
    assert f"manifest and job description in {record}/ (the pods' {pod_mount}/runs/rec-1)" in proc.stderr
    assert not Path(pod_mount).exists()
    for name in ("pytorchjob.yaml", "job.yaml"):  # they hold the --setenv values
        assert stat.S_IMODE((record / name).stat().st_mode) == 0o600, name
        assert "s3cret" in (record / name).read_text()

    missing = f"/hpct-absent-{uuid.uuid4().hex[:8]}"
    proc = submit(
        namespace, "rec-2", "--volume", f"host:{missing}:{pod_mount}", "--run-dir", f"{pod_mount}/runs/%j", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert f"not recorded here (the host path {missing} of its --volume is not on this machine)" in proc.stderr
    assert f"kubectl --context {CONTEXT} get pytorchjob -n {namespace} rec-2 -o yaml" in proc.stderr
    assert not Path(pod_mount).exists() and not Path(missing).exists()


def test_suggested_commands_carry_their_flags(namespace: str, tmp_path: Path) -> None:
    proc = submit(namespace, "follow-1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    hint = f"hpctrain status --scheduler kubernetes --namespace {namespace} --context {CONTEXT} follow-1"
    assert f"follow it with `{hint}`" in proc.stderr

    logs = hpctrain("logs", "follow-1", *where(namespace), cwd=tmp_path)
    assert logs.returncode == 2 and f"`{hint}`" in logs.stderr, logs
    suggested = re.search(r"`(hpctrain status [^`]*)`", logs.stderr)[1]
    followed = hpctrain(*shlex.split(suggested)[1:], cwd=tmp_path)
    assert followed.returncode == 0 and followed.stdout.startswith("follow-1: PENDING"), followed


def test_cancel_says_what_happens_and_that_the_job_is_still_terminating(namespace: str, tmp_path: Path) -> None:
    assert submit(namespace, "stuck-1", cwd=tmp_path).returncode == 0
    proc = hpctrain("cancel", "stuck-1", "--wait", "2", *where(namespace), cwd=tmp_path)
    assert proc.returncode == 1, proc
    assert "hpctrain cancel: deleting job stuck-1 (PENDING); it has no pods; waiting up to 2 s" in proc.stderr
    assert proc.stdout.startswith(
        "job stuck-1: still terminating after 2 s: it has no pods left, but the object remains"
    )
    assert "garbage collector" in proc.stdout and "pods are stopping" not in proc.stdout
    status = hpctrain("status", "stuck-1", *where(namespace), cwd=tmp_path)
    assert status.stdout.startswith("stuck-1: CANCELLED"), status


def test_status_in_a_namespace_that_does_not_exist(k8s_cluster: LocalK8s, tmp_path: Path) -> None:
    nope = f"nope-{uuid.uuid4().hex[:8]}"
    proc = hpctrain("status", *where(nope), cwd=tmp_path)
    assert proc.returncode == 2, proc
    assert f"namespace {nope!r} does not exist" in proc.stderr and "no jobs" not in proc.stdout


def test_a_refused_object_shows_the_api_servers_reason(namespace: str) -> None:
    from hpctrain.errors import UserError
    from hpctrain.jobs.spec import JobSpec
    from hpctrain.schedulers.base import Rendered
    from hpctrain.schedulers.kubernetes import KubernetesOptions, create

    sched = create(KubernetesOptions(namespace=namespace, image=IMAGE), context=CONTEXT)
    job = JobSpec(command=("python", "-c", "pass"), name="bad-1")
    rendered = sched.render(job)
    payload = {**rendered.payload, "metadata": {**rendered.payload["metadata"], "name": "Not_A_Name"}}
    with pytest.raises(UserError) as err:
        sched.submit(job, Rendered(text=rendered.text, filename=rendered.filename, payload=payload))
    assert "422" in str(err.value) and "Invalid value" in str(err.value) and "Not_A_Name" in str(err.value)


@pytest.fixture
def elsewhere(k8s_cluster: LocalK8s, tmp_path: Path) -> dict[str, str]:
    """A user's shell whose current kubeconfig context is another cluster (one that does not answer), with no
    HPCTRAIN_NAMESPACE: what hpctrain prints must carry --context and --namespace to reach the local server."""
    import yaml
    from kubernetes import config

    path = Path(os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or config.KUBE_CONFIG_DEFAULT_LOCATION)
    kubeconfig = yaml.safe_load(path.expanduser().read_text())
    user = next(c for c in kubeconfig["contexts"] if c["name"] == CONTEXT)["context"]["user"]
    kubeconfig["clusters"].append({"name": "elsewhere", "cluster": {"server": "https://127.0.0.1:9"}})
    kubeconfig["contexts"].append({"name": "elsewhere", "context": {"cluster": "elsewhere", "user": user}})
    kubeconfig["current-context"] = "elsewhere"
    mine = tmp_path / "kubeconfig"
    mine.write_text(yaml.safe_dump(kubeconfig))
    env = {k: v for k, v in os.environ.items() if k != "HPCTRAIN_NAMESPACE"}
    return {**env, "KUBECONFIG": str(mine), "HPCTRAIN_HOME": str(tmp_path / "home")}


def pasted(line: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a command hpctrain printed, as a user pastes it into the same shell."""
    words = shlex.split(line)
    assert words[0] == "hpctrain", line
    return subprocess.run(
        [sys.executable, "-m", "hpctrain", *words[1:]], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_printed_commands_work_when_pasted_while_another_context_is_current(
    k8s_cluster: LocalK8s, namespace: str, elsewhere: dict[str, str], tmp_path: Path
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(k8s_cluster.api_client())

    def pods() -> set[str]:
        return {p.metadata.name for p in core.list_namespaced_pod(namespace).items}

    # `dev start` (no node: the pod stays Pending, which is all this needs): its port-forward and its stop command
    started = pasted(
        shlex.join(["hpctrain", "dev", "start", "nb", *where(namespace), "--image", IMAGE, "--wait", "0"]),
        elsewhere,
        tmp_path,
    )
    assert started.returncode == 0, started.stderr
    assert f"kubectl --context {CONTEXT} port-forward -n {namespace} pod/dev-nb 8888:8888" in started.stdout
    stop = re.search(r"Stop it when done: (.*)", started.stdout)[1]
    assert stop == f"hpctrain dev stop --scheduler kubernetes --namespace {namespace} --context {CONTEXT} nb"
    listed = pasted(f"hpctrain dev list --scheduler kubernetes --context {CONTEXT}", elsewhere, tmp_path)
    assert re.search(rf"^nb\s+kubernetes\s+{namespace}/dev-nb\s+PENDING", listed.stdout, re.M), listed
    assert "dev-nb" in pods()
    stopped = pasted(stop, elsewhere, tmp_path)
    assert stopped.returncode == 0 and stopped.stdout == f"dev session nb: pod {namespace}/dev-nb deleted\n", stopped
    assert "dev-nb" not in pods()

    # a plain `dev stop NAME` finds the session's cluster through the context it was started with
    assert (
        pasted(
            shlex.join(["hpctrain", "dev", "start", "nb2", *where(namespace), "--image", IMAGE, "--wait", "0"]),
            elsewhere,
            tmp_path,
        ).returncode
        == 0
    )
    bare = pasted("hpctrain dev stop nb2", elsewhere, tmp_path)
    assert bare.returncode == 0 and f"pod {namespace}/dev-nb2 deleted" in bare.stdout, bare
    assert "dev-nb2" not in pods()

    # `tensorboard --on-cluster`: its stop command
    board = pasted(
        shlex.join(["hpctrain", "tensorboard", "runs/x", "--on-cluster", *where(namespace), "--image", IMAGE]),
        elsewhere,
        tmp_path,
    )
    assert board.returncode == 0, board.stderr
    name = re.search(r"TensorBoard pod (\S+) created", board.stdout)[1]
    assert f"kubectl --context {CONTEXT} port-forward -n {namespace} pod/{name} 6006:6006" in board.stdout
    cancel = re.search(r"Stop it with: (.*)", board.stdout)[1]
    assert cancel == f"hpctrain cancel --scheduler kubernetes --namespace {namespace} --context {CONTEXT} {name}"
    cancelled = pasted(cancel, elsewhere, tmp_path)
    assert cancelled.returncode == 0 and name not in pods(), cancelled

    # a job: `submit`'s follow-up, and `top`'s hint for a job without pods
    submitted = pasted(
        shlex.join(
            [
                "hpctrain",
                "submit",
                "--no-check",
                *where(namespace),
                "--image",
                IMAGE,
                "--job-name",
                "paste-1",
                "--",
                sys.executable,
                "-c",
                "pass",
            ]
        ),
        elsewhere,
        tmp_path,
    )
    assert submitted.returncode == 0, submitted.stderr
    follow = re.search(r"follow it with `([^`]*)`", submitted.stderr)[1]
    assert pasted(follow, elsewhere, tmp_path).stdout.startswith("paste-1: PENDING")
    top = pasted(shlex.join(["hpctrain", "top", "paste-1", *where(namespace)]), elsewhere, tmp_path)
    hint = re.search(r"`(hpctrain status [^`]*)` says where it is", top.stderr)
    assert top.returncode != 0 and hint, top
    assert pasted(hint[1], elsewhere, tmp_path).stdout.startswith("paste-1: PENDING")


def test_an_ended_job_is_deleted_by_the_cancel_that_submit_suggests(
    k8s_cluster: LocalK8s, namespace: str, tmp_path: Path
) -> None:
    """A job that ended still has its object (and on a cluster its pods): `submit` of its name is refused with a
    `cancel` command, and that command deletes it rather than saying there is nothing to cancel. The Failed
    condition is set here as Kubeflow's controller would (no controller runs on this server)."""
    from kubernetes import client

    assert submit(namespace, "ended-1", cwd=tmp_path).returncode == 0
    custom = client.CustomObjectsApi(k8s_cluster.api_client())
    condition = {
        "type": "Failed",
        "status": "True",
        "reason": "PyTorchJobFailed",
        "message": "worker-0 failed",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    custom.patch_namespaced_custom_object_status(
        "kubeflow.org", "v1", namespace, "pytorchjobs", "ended-1", {"status": {"conditions": [condition]}}
    )
    assert hpctrain("status", "ended-1", *where(namespace), cwd=tmp_path).stdout.startswith("ended-1: FAILED")
    again = submit(namespace, "ended-1", cwd=tmp_path)
    assert again.returncode == 2, again
    cancel = re.search(r"cancel the old one \(`(hpctrain cancel [^`]*)`\), or pass --replace", again.stderr)
    assert (
        cancel
        and cancel[1] == f"hpctrain cancel --scheduler kubernetes --namespace {namespace} --context {CONTEXT} ended-1"
    )
    proc = hpctrain(*shlex.split(cancel[1])[1:], "--wait", "0", cwd=tmp_path)  # this server never finishes a deletion
    assert proc.returncode == 0, proc
    assert proc.stdout.startswith("job ended-1: deletion requested (no pods stopping"), proc.stdout
    obj = custom.get_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", "ended-1")
    assert obj["metadata"].get("deletionTimestamp"), obj["metadata"]
