"""What happens around a Kubernetes job, through the CLI against the real local API server (scripts/local-k8s.sh):
where the submission is recorded (only where the run dir is visible here, owner-only), the commands hpctrain
suggests (they carry the flags that find the job), `cancel` of a job whose object stays (this server has no garbage
collector: a foreground deletion never ends, as on a cluster whose kube-controller-manager is down), a namespace
that does not exist, and the API server's own reason for a refused object. No stand-in runs here: no pod exists.
"""

from __future__ import annotations

import re
import shlex
import stat
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
    return hpctrain("submit", "--no-check", *where(namespace), "--image", IMAGE, "--job-name", name, *flags,
                    "--", sys.executable, "-c", "pass", cwd=cwd)


def test_the_record_goes_where_the_run_dir_is_visible_and_is_private(namespace: str, tmp_path: Path) -> None:
    nas = tmp_path / "nas"
    nas.mkdir()
    pod_mount = f"/hpct-pod-{uuid.uuid4().hex[:8]}"  # a path only the pods have
    proc = submit(namespace, "rec-1", "--volume", f"host:{nas}:{pod_mount}", "--run-dir", f"{pod_mount}/runs/%j",
                  "--setenv", "HTTPS_PROXY=http://user:s3cret@proxy.example:3128", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    record = nas / "runs" / "rec-1"
    assert f"manifest and job description in {record}/ (the pods' {pod_mount}/runs/rec-1)" in proc.stderr
    assert not Path(pod_mount).exists()
    for name in ("pytorchjob.yaml", "job.yaml"):  # they hold the --setenv values
        assert stat.S_IMODE((record / name).stat().st_mode) == 0o600, name
        assert "s3cret" in (record / name).read_text()

    missing = f"/hpct-absent-{uuid.uuid4().hex[:8]}"
    proc = submit(namespace, "rec-2", "--volume", f"host:{missing}:{pod_mount}", "--run-dir", f"{pod_mount}/runs/%j",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"not recorded here (the host path {missing} of its --volume is not on this machine)" in proc.stderr
    assert f"kubectl get pytorchjob -n {namespace} rec-2 -o yaml" in proc.stderr
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
    assert proc.stdout.startswith("job stuck-1: still terminating after 2 s: it has no pods left, but the object remains")
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
