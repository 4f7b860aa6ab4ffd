"""Checks on the submit host for Kubernetes jobs (hpctrain.schedulers.kubernetes.checks.submit_host), through
`hpctrain submit --dry-run --scheduler kubernetes` (no cluster needed): the recipe's dataset and the run dir are
checked where a --volume is visible on this machine, and every check that cannot run here is named as skipped."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from training_helpers import run_hpctrain

NOTE_PATH = "note: skipped the check for programs on PATH: the pods run image img, which has its own PATH"


def dry_run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_hpctrain("submit", "--dry-run", "--scheduler", "kubernetes", "--image", "img", *args, cwd=cwd)


def recipe(data_dir: str, run_dir: str) -> list[str]:
    return [
        "--",
        "hpctrain",
        "train",
        "mnist",
        "--dataset",
        "fashion-mnist",
        "--data-dir",
        data_dir,
        "--run-dir",
        run_dir,
    ]


@pytest.fixture
def nas(tmp_path: Path, fashion_mnist_source: Path) -> Path:
    """A directory of this machine that stands in for a NAS mounted on every node at the same host path."""
    nas = tmp_path / "nas"
    (nas / "data" / "fashion-mnist").mkdir(parents=True)
    for f in fashion_mnist_source.iterdir():
        shutil.copy(f, nas / "data" / "fashion-mnist" / f.name)
    return nas


def test_dataset_and_run_dir_on_a_host_volume_visible_here_are_checked_there(tmp_path: Path, nas: Path) -> None:
    ok = dry_run(tmp_path, "--volume", f"host:{nas}:/mnt/nas", *recipe("/mnt/nas/data", "/mnt/nas/runs/r1"))
    assert ok.returncode == 0, ok.stderr
    assert NOTE_PATH in ok.stderr and "dataset" not in ok.stderr and "run dir" not in ok.stderr, ok.stderr

    missing = dry_run(tmp_path, "--volume", f"host:{nas}:/mnt/nas", *recipe("/mnt/nas/nothing", "/mnt/nas/runs/r1"))
    assert missing.returncode == 2, missing.stderr
    assert (
        f"hpctrain submit: the pods will not find dataset fashion-mnist in --data-dir /mnt/nas/nothing (seen here "
        f"as {nas}/nothing): dataset fashion-mnist not found"
    ) in missing.stderr, missing.stderr
    assert "a real submit would refuse this job (exit status 2)" in missing.stderr
    assert missing.stdout.startswith("apiVersion: kubeflow.org/v1")  # the manifest is still shown


def test_a_run_dir_that_cannot_be_a_directory_is_a_problem(tmp_path: Path, nas: Path) -> None:
    (nas / "runs").write_text("a file, not a directory")
    proc = dry_run(tmp_path, "--volume", f"host:{nas}:/mnt/nas", *recipe("/mnt/nas/data", "/mnt/nas/runs/r1"))
    assert proc.returncode == 2, proc.stderr
    assert f"--run-dir /mnt/nas/runs/r1: {nas}/runs (here) is not a writable directory" in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "volume,data_dir,why",
    [
        (None, "/data", "--data-dir /data is on no --volume, so it is inside the image"),
        (
            "host:/nonexistent-hpctrain-nas:/mnt/nas",
            "/mnt/nas/data",
            "--data-dir the host path /nonexistent-hpctrain-nas of its --volume is not on this machine",
        ),
        (
            "nfs:nas.example:/export:/mnt/nas",
            "/mnt/nas/data",
            "--data-dir its nfs --volume at /mnt/nas is not mounted on this machine",
        ),
        (
            "pvc:shared:/mnt/nas",
            "/mnt/nas/data",
            "--data-dir its pvc --volume at /mnt/nas is not mounted on this machine",
        ),
    ],
)
def test_checks_that_cannot_run_here_are_named_as_skipped(
    tmp_path: Path, volume: str | None, data_dir: str, why: str
) -> None:
    volumes = ["--volume", volume] if volume else []
    proc = dry_run(tmp_path, *volumes, *recipe(data_dir, "runs/r1"))
    assert proc.returncode == 0, proc.stderr
    assert NOTE_PATH in proc.stderr
    assert f"note: skipped the check for dataset fashion-mnist: {why}" in proc.stderr, proc.stderr
    assert (
        "note: skipped the check that the run dir is writable: runs/r1 is relative to the pod's working "
        "directory, inside the image"
    ) in proc.stderr, proc.stderr


def test_an_nfs_volume_mounted_here_is_checked_at_its_mount_path(tmp_path: Path) -> None:
    """/proc is a real mount point of this machine; it stands in for a NAS share mounted at the same path everywhere."""
    proc = dry_run(tmp_path, "--volume", "nfs:nas.example:/export:/proc", *recipe("/proc/no-such-data", "runs/r1"))
    assert proc.returncode == 2, proc.stderr
    assert "the pods will not find dataset fashion-mnist in --data-dir /proc/no-such-data: dataset" in proc.stderr


@pytest.mark.k8s
def test_submit_refuses_a_missing_dataset_before_the_cluster_is_asked(k8s_cluster, tmp_path: Path, nas: Path) -> None:
    """Against the real local API server: the local problem stops `submit` (and `check` reports it), nothing is
    created."""
    from kubernetes import client

    from k8s_fixtures import CONTEXT
    from kubeflow_standin import create_namespace, delete_namespace

    api = k8s_cluster.api_client()
    namespace = create_namespace(api, prefix="hpct-local")
    try:
        args = [
            "--context",
            CONTEXT,
            "--namespace",
            namespace,
            "--job-name",
            "no-data",
            "--volume",
            f"host:{nas}:/mnt/nas",
            *recipe("/mnt/nas/nothing", "/mnt/nas/runs/r1"),
        ]
        base = [sys.executable, "-m", "hpctrain"]
        sched = ["--scheduler", "kubernetes", "--image", "img"]
        checked = subprocess.run(
            [*base, "check", *sched, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert checked.returncode == 2 and "the pods will not find dataset fashion-mnist" in checked.stderr, checked
        assert NOTE_PATH in checked.stderr
        submitted = subprocess.run(
            [*base, "submit", *sched, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert submitted.returncode == 2, submitted
        assert (
            "the pods will not find dataset fashion-mnist" in submitted.stderr
            and "nothing was submitted" in submitted.stderr
        )
        jobs = client.CustomObjectsApi(api).list_namespaced_custom_object(
            "kubeflow.org", "v1", namespace, "pytorchjobs"
        )
        assert jobs["items"] == [] and not (nas / "runs").exists()
    finally:
        delete_namespace(api, namespace)


def test_an_image_folder_on_a_host_volume_is_checked_by_the_image_recipe(tmp_path: Path) -> None:
    """train imagenet DATA: the recipe's own data check (DATA/train class folders), not a dataset download's."""
    nas = tmp_path / "nas"
    (nas / "imagenet" / "train" / "n01440764").mkdir(parents=True)
    train = ["--", "hpctrain", "train", "imagenet", "--run-dir", "/mnt/nas/runs/r1"]
    ok = dry_run(tmp_path, "--volume", f"host:{nas}:/mnt/nas", *train, "/mnt/nas/imagenet")
    assert ok.returncode == 0, ok.stderr
    missing = dry_run(tmp_path, "--volume", f"host:{nas}:/mnt/nas", *train, "/mnt/nas/other")
    assert missing.returncode == 2, missing.stderr
    assert "the pods will not find dataset imagenet in --data-dir /mnt/nas/other" in missing.stderr, missing.stderr
    assert "has no train/ folder" in missing.stderr, missing.stderr
