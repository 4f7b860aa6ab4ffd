"""`hpctrain image pull|build|list` with STAND-IN apptainer and enroot executables (tests/standins.py: they cannot
be installed here); references, mirrors and magic bytes are tested directly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from around_helpers import cli_env, hpctrain
from hpctrain.errors import UserError
from hpctrain.images import docker_pull_hint, image_format, parse_ref, with_mirror
from standins import calls, install


@pytest.fixture
def tools(tmp_path: Path) -> dict:
    bin_dir = install(tmp_path / "bin")
    log = tmp_path / "calls.jsonl"
    return {"env": cli_env(tmp_path / "home", path_prefix=bin_dir, STANDIN_LOG=str(log)), "log": log, "bin": bin_dir}


def only(env: dict, tool: str, bin_dir: Path) -> dict:
    """PATH with the stand-ins but without `tool`."""
    other = bin_dir.parent / f"without-{tool}"
    other.mkdir(exist_ok=True)
    for f in bin_dir.iterdir():
        if f.name != tool and not (other / f.name).exists():
            os.symlink(f, other / f.name)
    return {**env, "PATH": env["PATH"].replace(str(bin_dir), str(other), 1)}


def test_references_enroot_form_and_mirror() -> None:
    ngc = parse_ref("docker://nvcr.io/nvidia/pytorch:24.04-py3")
    assert (ngc.registry, ngc.repository, ngc.tag) == ("nvcr.io", "nvidia/pytorch", "24.04-py3")
    assert ngc.enroot_uri() == "docker://nvcr.io#nvidia/pytorch:24.04-py3"
    assert ngc.filename("sqsh") == "pytorch_24.04-py3.sqsh"
    assert parse_ref("docker://nvcr.io#nvidia/pytorch:24.04-py3") == ngc
    hub = parse_ref("docker://ubuntu:22.04")
    assert (
        with_mirror(hub, "mirror.example.org:5000").docker_uri()
        == "docker://mirror.example.org:5000/library/ubuntu:22.04"
    )
    with pytest.raises(UserError, match="mirrors Docker Hub"):
        with_mirror(ngc, "mirror.example.org")
    for bad in ("nvcr.io/x:1", "docker://Upper/case", "docker://x:bad tag"):
        with pytest.raises(UserError):
            parse_ref(bad)
    assert "hpctrain image pull docker://pytorch/pytorch:2.3.0" in docker_pull_hint("docker://pytorch/pytorch:2.3.0")
    assert docker_pull_hint("/images/pytorch.sif") is None


def test_pull_sif_then_skip(tools: dict, tmp_path: Path) -> None:
    result = hpctrain(
        "image", "pull", "docker://nvcr.io/nvidia/pytorch:24.04-py3", "--to", str(tmp_path / "img"), env=tools["env"]
    )
    assert result.returncode == 0, result.stderr
    image = tmp_path / "img" / "pytorch_24.04-py3.sif"
    assert image_format(image) == "sif" and f"pulled {image}" in result.stdout and "KiB" in result.stdout
    [call] = calls(tools["log"])
    assert call[:2] == ["apptainer", "pull"] and call[3] == "docker://nvcr.io/nvidia/pytorch:24.04-py3"
    assert Path(call[2]).parent == image.parent and Path(call[2]).name.startswith(".partial-")
    again = hpctrain(
        "image", "pull", "docker://nvcr.io/nvidia/pytorch:24.04-py3", "--to", str(tmp_path / "img"), env=tools["env"]
    )
    assert again.returncode == 0 and "already there and valid" in again.stdout
    assert len(calls(tools["log"])) == 1  # not pulled again
    listed = hpctrain("image", "list", str(tmp_path / "img"), env=tools["env"])
    assert "pytorch_24.04-py3.sif" in listed.stdout and listed.stdout.rstrip().endswith("sif")


def test_pull_sqsh_with_enroot_and_mirror(tools: dict, tmp_path: Path) -> None:
    env = only(tools["env"], "apptainer", tools["bin"])
    result = hpctrain(
        "image",
        "pull",
        "docker://pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
        "--to",
        str(tmp_path),
        "--registry-mirror",
        "mirror.example.org",
        env=env,
    )
    assert result.returncode == 0, result.stderr
    [call] = calls(tools["log"])
    assert call[:3] == ["enroot", "import", "--output"]
    assert call[4] == "docker://mirror.example.org#pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime"
    assert image_format(tmp_path / "pytorch_2.3.0-cuda12.1-cudnn8-runtime.sqsh") == "sqsh"


def test_failed_pull_leaves_nothing(tools: dict, tmp_path: Path) -> None:
    env = {**tools["env"], "STANDIN_FAIL": "1"}
    result = hpctrain(
        "image", "pull", "docker://ubuntu:22.04", "--to", str(tmp_path / "img"), "--format", "sif", env=env
    )
    assert result.returncode == 2 and "failed" in result.stderr and "Traceback" not in result.stderr
    assert list((tmp_path / "img").iterdir()) == []


def test_refuses_inside_an_allocation_and_without_tools(tools: dict, tmp_path: Path) -> None:
    inside = {**tools["env"], "SLURM_JOB_ID": "42"}
    result = hpctrain("image", "pull", "docker://ubuntu:22.04", "--to", str(tmp_path), env=inside)
    assert result.returncode == 2 and "inside Slurm job 42" in result.stderr and "--force" in result.stderr
    assert calls(tools["log"]) == []
    assert (
        hpctrain("image", "pull", "docker://ubuntu:22.04", "--to", str(tmp_path), "--force", env=inside).returncode == 0
    )
    bare = {**tools["env"], "PATH": "/usr/bin:/bin"}
    result = hpctrain("image", "pull", "docker://ubuntu:22.04", "--to", str(tmp_path), env=bare)
    assert result.returncode == 2 and "neither apptainer nor enroot" in result.stderr


def test_build_and_an_invalid_file(tools: dict, tmp_path: Path) -> None:
    definition = tmp_path / "train.def"
    definition.write_text("Bootstrap: docker\nFrom: ubuntu:22.04\n")
    out = tmp_path / "img" / "train.sif"
    result = hpctrain("image", "build", str(definition), "--output", str(out), "--fakeroot", env=tools["env"])
    assert result.returncode == 0, result.stderr
    assert calls(tools["log"])[0][:3] == ["apptainer", "build", "--fakeroot"] and image_format(out) == "sif"
    (tmp_path / "img" / "broken.sif").write_bytes(b"not an image")
    listed = hpctrain("image", "list", str(tmp_path / "img"), env=tools["env"])
    assert "broken.sif" in listed.stdout and "NOT A VALID IMAGE" in listed.stdout
    (tmp_path / "img" / "ubuntu_22.04.sif").write_bytes(b"")
    result = hpctrain("image", "pull", "docker://ubuntu:22.04", "--to", str(tmp_path / "img"), env=tools["env"])
    assert result.returncode == 2 and "not a valid .sif image" in result.stderr


def test_a_definition_file_named_like_an_option_reaches_apptainer_as_a_file(tools: dict, tmp_path: Path) -> None:
    """Guards issue 17: `image build --output x.sif -- --force` ran `apptainer build ... --force`, the file's name
    read as an option. Paths now reach the tool as `./NAME` (the same file, never an option)."""
    (tmp_path / "--force").write_text("Bootstrap: docker\nFrom: ubuntu:22.04\n")
    result = hpctrain("image", "build", "--output", "x.sif", "--", "--force", env=tools["env"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [call] = calls(tools["log"])
    assert call[-1] == "./--force" and not any(arg.startswith("-") for arg in call[2:])
    assert image_format(tmp_path / "x.sif") == "sif"


def test_pull_of_an_image_whose_file_name_is_too_long_is_a_clear_error(tools: dict, tmp_path: Path) -> None:
    """Guards issue 17: `image pull docker://<300-character name>` died with OSError 'File name too long'."""
    result = hpctrain("image", "pull", f"docker://{'a' * 300}", "--to", str(tmp_path / "img"), env=tools["env"])
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "more than the 255 this file system allows" in result.stderr and "--output FILE" in result.stderr
    assert not tools["log"].exists() or not calls(tools["log"])
