"""Fallbacks for features the oldest supported torch/torchvision lack (hpctrain.compat): each is detected in the
running process, the fallback gives the same result, and one line says what is lost. Run with today's torch they
exercise the fallback by turning the detection off; under the floor environment (scripts/test.sh runs the
floor-marked tests with it) the real old torch and torchvision take these paths."""

from __future__ import annotations

import inspect
import logging
from pathlib import Path

import pytest
import torch
from image_fixtures import photo_folders  # noqa: F401

from hpctrain import compat
from hpctrain.data.backends import choose_backend, make_loader
from hpctrain.data.imagefolder import find_image_folders
from hpctrain.data.loader import LoaderConfig
from hpctrain.data.sampler import EpochPlan
from hpctrain.data.transforms import CenterCrop, RandomResizedCrop
from hpctrain.distributed import process_group

pytestmark = pytest.mark.floor

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fresh_notices(monkeypatch):
    monkeypatch.setattr(compat, "_said", set())
    monkeypatch.delenv("RANK", raising=False)


def test_version_tuple() -> None:
    assert compat.version_tuple("2.2.2+cu121") == (2, 2) and compat.version_tuple("0.19.0a0") == (0, 19)
    assert compat.version_tuple("weird") == (0, 0)


@pytest.fixture(autouse=True)
def _hear_the_channel(caplog):
    """compat says its notes through hpctrain's channel (logging; the CLI prints them): heard here at every level."""
    caplog.set_level(logging.DEBUG, logger="hpctrain")


def test_fused_sgd_is_said_exactly_where_this_torch_has_it(caplog) -> None:
    """The capability comes from SGD's signature and torch's version; the truth is whether this torch's SGD takes
    fused=True for a CPU parameter and steps (torch 2.2 refuses the keyword with a TypeError, 2.3 the CPU with a
    RuntimeError: the fast recipe, catching only the latter, died at start on the floor torch)."""
    param = torch.nn.Parameter(torch.ones(3))
    param.grad = torch.ones(3)
    try:
        torch.optim.SGD([param], lr=0.1, momentum=0.9, nesterov=True, fused=True).step()
        works = True
    except (TypeError, RuntimeError):
        works = False
    assert compat.fused_sgd("cpu") is works

    from hpctrain.recipes.mnist import FastRecipe

    model = torch.nn.Linear(3, 2)
    optimizer = FastRecipe().build_optimization(model, 0.1, 1, 4).optimizer
    assert optimizer.defaults.get("fused") is (True if works else None)
    said = caplog.text  # said through hpctrain's channel (logging), which the CLI prints
    assert ("no fused SGD on cpu" in said) is not works, said


def test_device_id_is_passed_only_where_torch_takes_it(monkeypatch, caplog) -> None:
    import torch.distributed as dist

    assert compat.init_takes_device_id() == ("device_id" in inspect.signature(dist.init_process_group).parameters)
    gpu = torch.device("cuda", 1)
    assert process_group._device_id_argument(CPU) == {}  # gloo: never (torch 2.2 has no such keyword at all)
    monkeypatch.setattr(compat, "init_takes_device_id", lambda: True)
    assert process_group._device_id_argument(gpu) == {"device_id": gpu}
    monkeypatch.setattr(compat, "init_takes_device_id", lambda: False)
    assert process_group._device_id_argument(gpu) == {} and process_group._device_id_argument(gpu) == {}
    err = caplog.text
    assert err.count("has no init_process_group(device_id=) (torch >= 2.3)") == 1, err  # once
    assert "NCCL starts at the first collective" in err


def test_only_the_first_rank_says_it(monkeypatch, caplog) -> None:
    monkeypatch.setenv("RANK", "3")
    compat.say_once("x", "something")
    assert caplog.text == ""


def _first_batch(data: Path):
    found = find_image_folders(data)
    source = make_loader(
        choose_backend("nvjpeg", "cpu"),
        found.train,
        found.val,
        LoaderConfig(),
        3,
        RandomResizedCrop(size=(64, 64)),
        CenterCrop(size=(56, 56), resize=64),
        CPU,
    )
    plan = EpochPlan(len(found.train), 16, 1, 3)
    batch = next(iter(source.train_batches(plan, 1, 0, 0)))
    return batch.images.clone(), batch.labels.clone()


def test_nvjpeg_decodes_image_by_image_without_batched_decode_jpeg(photo_folders: Path, monkeypatch, caplog) -> None:
    """torchvision < 0.19 takes one JPEG per decode_jpeg call: same pixels, one image at a time, said once."""
    monkeypatch.setattr(compat, "batched_decode_jpeg", lambda: False)
    images, labels = _first_batch(photo_folders)
    again = _first_batch(photo_folders)
    err = caplog.text
    assert err.count("batched decode_jpeg needs torchvision >= 0.19") == 1, err
    if compat.version_tuple(__import__("torchvision").__version__) >= (0, 19):
        monkeypatch.setattr(compat, "batched_decode_jpeg", lambda: True)
        batched = _first_batch(photo_folders)
        assert torch.equal(batched[0], images) and torch.equal(batched[1], labels)
    assert torch.equal(again[0], images)


def test_numpy_mismatch_names_torch_before_2_3_beside_numpy_2() -> None:
    line = compat.numpy_mismatch("2.2.2+cu121", "2.2.6")
    assert line == (
        "torch 2.2.2+cu121 was built against NumPy 1.x but NumPy 2.2.6 is installed, so torch cannot use "
        "NumPy: pip install 'numpy<2' (or a torch >= 2.3)"
    )
    assert compat.numpy_mismatch("2.2.2", "1.26.4") is None and compat.numpy_mismatch("2.3.0", "2.0.1") is None
    assert compat.numpy_mismatch(None, "2.0.0") is None and compat.numpy_mismatch("weird", "2.0.0") is None


def test_env_and_check_name_a_numpy_2_beside_the_floor_torch(tmp_path: Path) -> None:
    """The real mismatch: the floor environment's torch 2.2 with a real NumPy 2 in front of its NumPy 1.x (what a
    plain `pip install` did to NGC 24.01's environment). `hpctrain env` and `hpctrain check` say it in one line."""
    import importlib.metadata
    import os
    import subprocess
    import sys

    if compat.version_tuple(torch.__version__) >= (2, 3):
        pytest.skip(f"needs a torch before 2.3 (the floor environment); this is {torch.__version__}")
    numpy2 = tmp_path / "numpy2"
    got = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(numpy2), "numpy>=2,<2.3"],
        capture_output=True,
        text=True,
    )
    assert got.returncode == 0, got.stderr
    src = Path(__file__).resolve().parents[1] / "src"
    installed = importlib.metadata.version("torch")
    env = {**os.environ, "PYTHONPATH": f"{numpy2}{os.pathsep}{src}"}
    shown = subprocess.run([sys.executable, "-m", "hpctrain", "env"], env=env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    line = next(line for line in shown.stdout.splitlines() if line.startswith("NumPy:"))
    assert (
        line.startswith("NumPy:        2.")
        and (f"(problem: torch {installed} was built against NumPy 1.x but NumPy 2.") in line
    ), line
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpctrain",
            "check",
            "--scheduler",
            "kubernetes",
            "--image",
            "img",
            "--context",
            "hpctrain-absent",
            "--",
            "python",
            "-c",
            "pass",
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert (
        f"hpctrain check: warning: here, torch {installed} was built against NumPy 1.x but NumPy 2." in checked.stderr
    ), checked.stderr
