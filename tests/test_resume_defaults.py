"""A checkpoint's recorded settings are the defaults of --resume and --evaluate: no model flag needs repeating, and
only a flag given that contradicts the checkpoint is refused (issue 17, section 2)."""

from __future__ import annotations

from pathlib import Path

from hpctrain.training.metrics import read_metrics
from image_fixtures import TINY, TINY_ARCH, fashion_folders, train  # noqa: F401
from training_helpers import hpctrain, ok


def test_imagenet_resume_and_evaluate_need_no_model_flags(fashion_folders: Path, tmp_path: Path) -> None:  # noqa: F811
    run_dir = tmp_path / "run"
    train(fashion_folders, run_dir, "--epochs", "1", "--train-limit", "96", "--test-limit", "40", "-j", "0")
    best = run_dir / "checkpoints" / "checkpoint_best.pt"
    assert best.is_file()

    # Only where the run is and how far it should go: arch, image sizes, batch, limits come from the checkpoint.
    resumed = ok(hpctrain("train", "imagenet", str(fashion_folders), "--run-dir", str(run_dir), "--resume",
                          "--epochs", "2", "--threads", "1", "-j", "0", "--log-interval", "0", cwd=tmp_path))
    assert "resumed at epoch 2" in resumed.stdout, resumed.stdout
    assert TINY_ARCH in resumed.stdout and "global batch 32" in resumed.stdout, resumed.stdout
    assert [(r["epoch"], r["step"]) for r in read_metrics(run_dir)] == [(1, 3), (2, 6)]

    evaluated = ok(hpctrain("train", "imagenet", str(fashion_folders), "--evaluate", "--resume", str(best),
                            "--threads", "1", "-j", "0", cwd=tmp_path))
    assert f"evaluated {best} on 40 images" in evaluated.stdout, evaluated.stdout

    # A flag given that contradicts the checkpoint is still refused, naming its value.
    refused = hpctrain("train", "imagenet", str(fashion_folders), "--run-dir", str(run_dir), "--resume",
                       "--epochs", "3", "-a", "resnet34", "--threads", "1", cwd=tmp_path)
    assert refused.returncode == 2 and f"(--arch {TINY_ARCH})" in refused.stderr, refused.stderr


def test_mnist_resume_takes_the_dataset_recipe_and_limits_from_the_checkpoint(fashion_data_dir, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ok(hpctrain("train", "mnist", "--dataset", "fashion-mnist", "--data-dir", str(fashion_data_dir), "--recipe",
                "classic", "--train-limit", "128", "--test-limit", "100", "--epochs", "1", "--threads", "1",
                "--run-dir", str(run_dir)))
    # Without --dataset the default would be mnist (not in that data dir), without --recipe fast.
    ok(hpctrain("train", "mnist", "--data-dir", str(fashion_data_dir), "--run-dir", str(run_dir), "--resume",
                "--epochs", "2", "--threads", "1"))
    assert [(r["epoch"], r["step"]) for r in read_metrics(run_dir)] == [(1, 2), (2, 4)]
