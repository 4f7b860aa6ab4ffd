"""Batches at the edges of an epoch and of readability (issue 17 §3), run for real: `hpctrain train` on real JPEG
folders (tests/image_fixtures.py) and on Fashion-MNIST, one thread, a small torchvision model at 32 pixels."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hpctrain.data.imagefolder import find_image_folders
from hpctrain.data.sampler import EpochPlan
from hpctrain.training.metrics import read_metrics
from image_fixtures import fashion_folders, train  # noqa: F401
from training_helpers import QUICK, hpctrain, ok


@pytest.mark.parametrize("num_samples,batch,world", [(13, 4, 1), (9, 4, 1), (10, 4, 2), (26, 8, 2), (5, 4, 1)])
def test_a_last_batch_of_one_sample_per_process_joins_the_batch_before(num_samples, batch, world):
    """Guards issue 17: whenever the image count modulo the per-process batch was 1 (13 images, -b 4), the last
    step gave BatchNorm one sample ("Expected more than 1 value per channel when training"), every time, resume
    after resume. That batch is now folded into the one before; every sample still comes once per epoch."""
    plan = EpochPlan(num_samples, batch, world, seed=3)
    order = plan.order(0)
    per_step = [
        [plan.rank_indices(order, step, rank).tolist() for rank in range(world)] for step in range(plan.steps_per_epoch)
    ]
    assert all(len(part) >= 2 for step in per_step for part in step)
    taken = sorted(i for step in per_step for part in step for i in part)
    assert taken == sorted(order.tolist())
    assert plan.largest_rank_batch == max(len(part) for step in per_step for part in step)


def test_imagenet_with_a_remainder_of_one_image_completes(fashion_folders, tmp_path):
    """The issue's case end to end: 13 training images, -b 4, a BatchNorm model (TINY_ARCH; its last BatchNorm sees
    1x1 maps, where one sample is an error): the run completes."""
    src = tmp_path / "data"
    for split, counts in (("train", {"bag": 7, "boot": 6}), ("val", {"bag": 2, "boot": 2})):
        for cls, count in counts.items():
            (src / split / cls).mkdir(parents=True)
            for path in sorted((fashion_folders / split / cls).iterdir())[:count]:
                shutil.copy(path, src / split / cls / path.name)
    result = train(src, tmp_path / "run", "--epochs", "1", "-b", "4", "-j", "0")
    assert "completed 1 epoch(s), global step 3" in result.stdout


def test_mnist_fast_recipe_with_a_remainder_of_one_image_completes(fashion_data_dir, tmp_path):
    """The same for the mnist fast recipe (its conv blocks have BatchNorm): 13 images, --batch-size 4."""
    result = ok(
        hpctrain(
            "train",
            "mnist",
            "--recipe",
            "fast",
            "--data-dir",
            str(fashion_data_dir),
            *QUICK,
            "--train-limit",
            "13",
            "--batch-size",
            "4",
            "--epochs",
            "1",
            "--run-dir",
            str(tmp_path / "run"),
        )
    )
    assert "completed 1 epoch(s), global step 3" in result.stdout


def test_a_batch_of_only_unreadable_images_is_skipped_not_divergence(fashion_folders, tmp_path):
    """Guards issue 17: with --skip-bad-images, a batch of only unreadable images gave a nan loss, reported as
    divergence (exit 3, "start again with a lower --lr"); and what was skipped was never said. The first batch of
    epoch 1 is made all unreadable here: the run completes, says how many it skipped and which, and metrics.jsonl
    counts them."""
    src = tmp_path / "data"
    for split in ("train", "val"):
        for cls in ("bag", "boot"):
            (src / split / cls).mkdir(parents=True)
            for path in sorted((fashion_folders / split / cls).iterdir())[:8]:
                shutil.copy(path, src / split / cls / path.name)
    paths = find_image_folders(src).train.paths
    plan = EpochPlan(len(paths), 4, 1, seed=5)
    first = plan.rank_indices(plan.order(0), 0, 0).tolist()
    for i in first:
        Path(paths[i]).write_bytes(b"not an image")
    result = train(src, tmp_path / "run", "--epochs", "1", "-b", "4", "-j", "0", "--seed", "5", "--skip-bad-images")
    assert "completed 1 epoch(s)" in result.stdout
    assert "skipped 4 unreadable image(s) this epoch" in result.stdout
    assert str(Path(paths[sorted(first)[0]])) in result.stdout or any(str(paths[i]) in result.stdout for i in first)
    [record] = read_metrics(tmp_path / "run")
    assert record["bad_images"] == 4
