"""A checkpoint's recorded settings are the defaults of --resume and --evaluate: no model flag needs repeating, and
only a flag given that contradicts the checkpoint is refused (issue 17, section 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hpctrain.training.metrics import read_metrics
from image_fixtures import TINY, TINY_ARCH, fashion_folders, train  # noqa: F401
from training_helpers import hpctrain, ok


def test_imagenet_resume_and_evaluate_need_no_model_flags(fashion_folders: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    train(fashion_folders, run_dir, "--epochs", "1", "--train-limit", "96", "--test-limit", "40", "-j", "0")
    best = run_dir / "checkpoints" / "checkpoint_best.pt"
    assert best.is_file()

    # Only where the run is and how far it should go: arch, image sizes, batch, limits come from the checkpoint.
    resumed = ok(
        hpctrain(
            "train",
            "imagenet",
            str(fashion_folders),
            "--run-dir",
            str(run_dir),
            "--resume",
            "--epochs",
            "2",
            "--threads",
            "1",
            "-j",
            "0",
            "--log-interval",
            "0",
            cwd=tmp_path,
        )
    )
    assert "resumed at epoch 2" in resumed.stdout, resumed.stdout
    assert TINY_ARCH in resumed.stdout and "global batch 32" in resumed.stdout, resumed.stdout
    assert [(r["epoch"], r["step"]) for r in read_metrics(run_dir)] == [(1, 3), (2, 6)]

    evaluated = ok(
        hpctrain(
            "train",
            "imagenet",
            str(fashion_folders),
            "--evaluate",
            "--resume",
            str(best),
            "--threads",
            "1",
            "-j",
            "0",
            cwd=tmp_path,
        )
    )
    assert f"evaluated {best} on 40 images" in evaluated.stdout, evaluated.stdout

    # A flag given that contradicts the checkpoint is still refused, naming its value.
    refused = hpctrain(
        "train",
        "imagenet",
        str(fashion_folders),
        "--run-dir",
        str(run_dir),
        "--resume",
        "--epochs",
        "3",
        "-a",
        "resnet34",
        "--threads",
        "1",
        cwd=tmp_path,
    )
    assert refused.returncode == 2 and f"(--arch {TINY_ARCH})" in refused.stderr, refused.stderr


def test_mnist_resume_takes_the_dataset_recipe_and_limits_from_the_checkpoint(fashion_data_dir, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ok(
        hpctrain(
            "train",
            "mnist",
            "--dataset",
            "fashion-mnist",
            "--data-dir",
            str(fashion_data_dir),
            "--recipe",
            "classic",
            "--train-limit",
            "128",
            "--test-limit",
            "100",
            "--epochs",
            "1",
            "--threads",
            "1",
            "--run-dir",
            str(run_dir),
        )
    )
    # Without --dataset the default would be mnist (not in that data dir), without --recipe fast.
    ok(
        hpctrain(
            "train",
            "mnist",
            "--data-dir",
            str(fashion_data_dir),
            "--run-dir",
            str(run_dir),
            "--resume",
            "--epochs",
            "2",
            "--threads",
            "1",
        )
    )
    assert [(r["epoch"], r["step"]) for r in read_metrics(run_dir)] == [(1, 2), (2, 4)]


# ---- a checkpoint's recorded settings and state are checked like the command line's (issue 29, A3)


def _crafted(tmp_path: Path, state_changes: dict[str, Any], config_changes: dict[str, Any]) -> Path:
    """A checkpoint as `hpctrain train` writes one (format, counters, per-rank states, config), passing its checksum,
    with some recorded values replaced."""
    from hpctrain import checkpoint
    from hpctrain.config import TrainConfig
    from hpctrain.training import rng
    from hpctrain.training.loop_state import CHECKPOINT_FORMAT

    config = {**TrainConfig(dataset="fashion-mnist", epochs=2, train_limit=128, threads=1).to_dict(), **config_changes}
    state = {
        "format": CHECKPOINT_FORMAT,
        "model": {},
        "optimizer": {},
        "scheduler": {},
        "epoch": 1,
        "step": 2,
        "step_in_epoch": 0,
        "epoch_train_seconds": 0.0,
        "best_accuracy": 0.5,
        "world_size": 1,
        "ranks": [{"rng": rng.capture(), "loss_sum": 0.0, "threads": 1}],
        "config": config,
        **state_changes,
    }
    return checkpoint.save(state, tmp_path / "run" / "checkpoints", "checkpoint_epoch_1.pt", epoch=1, step=2)


def _rank(**changes: Any) -> dict[str, Any]:
    """One saved process's state as `save` gathers it, with `changes`."""
    from hpctrain.training import rng

    return {"rng": rng.capture(), "loss_sum": 0.0, "threads": 1, **changes}


BAD_RECORDS = {
    "epochs as a string": (
        {},
        {"epochs": "3"},
        "setting epochs is a string ('3'), not a whole number; it cannot be "
        "resumed as it is: give --epochs on the command line",
    ),
    "a float seed": ({}, {"seed": 1.5}, "setting seed is a number (1.5), not a whole number"),
    "a negative epoch count": ({}, {"epochs": -3}, "--epochs must be at least 1 (got -3)"),
    "a negative thread count": ({"ranks": [_rank(threads=-2)]}, {}, "ranks[0].threads is -2, not a thread count"),
    "a non-numeric thread count": ({}, {"threads": "many"}, "setting threads is 'many', not a thread count"),
    "an empty per-rank list": ({"ranks": []}, {}, "ranks is [], not a list of the saved processes' states"),
    "a dict for the per-rank list": ({"ranks": {"0": {}}}, {}, "ranks is {'0': {}}, not a list"),
    "a 3-byte RNG state": (
        {"ranks": [_rank(rng={**_rank()["rng"], "torch": torch.zeros(3, dtype=torch.uint8)})]},
        {},
        "ranks[0].rng has a torch generator state of shape (3,)",
    ),
    "a non-numeric loss sum": ({"ranks": [_rank(loss_sum="low")]}, {}, "ranks[0].loss_sum is 'low', not a number"),
    "a string step": ({"step": "2"}, {}, "its recorded step is '2', not a whole number of at least 0"),
    "parts outside the folder": (
        {"ranks": {"parts": "../elsewhere.ranks", "world_size": 2, "loss_sum_mean": 0.0}},
        {},
        "ranks.parts is '../elsewhere.ranks', not the name of a folder of ranks' parts",
    ),
    "parts of no ranks": (
        {"ranks": {"parts": "checkpoint_step_2.pt.ranks", "world_size": 0, "loss_sum_mean": 0.0}},
        {},
        "ranks.world_size is 0, not a number of processes",
    ),
}


@pytest.mark.parametrize("how", list(BAD_RECORDS))
def test_recorded_settings_of_the_wrong_type_or_value_are_refused_naming_checkpoint_and_field(
    tmp_path: Path, how: str
) -> None:
    from hpctrain.config import TrainConfig
    from hpctrain.errors import UserError
    from hpctrain.training.resume import RECORDED_DEFAULTS, with_recorded_settings

    state_changes, config_changes, expected = BAD_RECORDS[how]
    path = _crafted(tmp_path, state_changes, config_changes)
    cfg = TrainConfig(dataset="fashion-mnist", resume=str(path), threads=1)
    with pytest.raises(UserError) as refused:
        with_recorded_settings(cfg, set(RECORDED_DEFAULTS))
    message = str(refused.value)
    assert message.startswith(f"{path}: its recorded ") and expected in message and "\n" not in message, message


def test_a_sound_crafted_checkpoint_passes_and_a_flag_replaces_a_bad_overridable_setting(tmp_path: Path) -> None:
    from hpctrain.config import TrainConfig
    from hpctrain.training.resume import RECORDED_DEFAULTS, with_recorded_settings

    path = _crafted(tmp_path, {}, {})
    cfg = with_recorded_settings(TrainConfig(resume=str(path)), set(RECORDED_DEFAULTS))
    assert (cfg.epochs, cfg.dataset, cfg.train_limit) == (2, "fashion-mnist", 128)
    path = _crafted(tmp_path, {}, {"epochs": "3"})
    given = with_recorded_settings(TrainConfig(resume=str(path), epochs=4), set(RECORDED_DEFAULTS) - {"epochs"})
    assert given.epochs == 4  # --epochs given: the recorded one is not used, so not in the way


def test_resume_from_a_checkpoint_with_a_bad_setting_says_one_line_before_anything_starts(tmp_path: Path) -> None:
    path = _crafted(tmp_path, {}, {"epochs": "3"})
    refused = hpctrain("train", "mnist", "--resume", str(path), "--threads", "1", cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert str(path) in line and "setting epochs is a string ('3')" in line, line


# ---- a checkpoint's optimizer and scheduler state must fit the model before the first step (issue 39, item 7)


@pytest.fixture(scope="module")
def trained_fast(fashion_data_dir, tmp_path_factory) -> Path:
    """A run of the default MNIST recipe (fused SGD with momentum, a per-step LambdaLR): one epoch, one checkpoint."""
    run_dir = tmp_path_factory.mktemp("fast") / "run"
    ok(
        hpctrain(
            "train",
            "mnist",
            "--dataset",
            "fashion-mnist",
            "--data-dir",
            str(fashion_data_dir),
            "--train-limit",
            "256",
            "--test-limit",
            "100",
            "--epochs",
            "1",
            "--threads",
            "1",
            "--run-dir",
            str(run_dir),
        )
    )
    return run_dir / "checkpoints" / "checkpoint_epoch_1.pt"


def _momentum(state: dict[str, Any]) -> dict[str, Any]:
    """The state of the optimizer's second parameter (the first the model trains: the first layer is frozen)."""
    return state["optimizer"]["state"][1]


OPTIMIZATION_CASES = {
    "a momentum buffer of another shape": (
        lambda s: _momentum(s).update(momentum_buffer=torch.zeros(3)),
        "optimizer state state[1].momentum_buffer has the shape (3,)",
    ),
    "a momentum buffer declared 10^6 x 10^6 over one element": (
        lambda s: _momentum(s).update(momentum_buffer=torch.zeros(1).expand(10**6, 10**6)),
        "has the shape (1000000, 1000000)",
    ),
    "an expanded view of the parameter's shape": (
        lambda s: _momentum(s).update(momentum_buffer=torch.zeros(1).expand(*_momentum(s)["momentum_buffer"].shape)),
        "overlaps itself",
    ),
    "lr 'fast'": (
        lambda s: s["optimizer"]["param_groups"][0].update(lr="fast"),
        "optimizer state param_groups[0].lr is 'fast', not a number",
    ),
    "a scheduler counter as text": (
        lambda s: s["scheduler"].update(last_epoch="3"),
        "scheduler state last_epoch is '3', not a number",
    ),
    "a model that is not a dict": (lambda s: s.update(model=[1, 2]), "its recorded model is [1, 2], not a model's"),
}


@pytest.mark.parametrize("how", list(OPTIMIZATION_CASES))
def test_an_optimizer_state_that_does_not_fit_the_model_is_refused_before_the_first_step(
    trained_fast: Path, fashion_data_dir: Path, tmp_path: Path, how: str
) -> None:
    """A checkpoint that passes its checksum (written again with `checkpoint.save`) but whose optimizer, scheduler
    or model state does not fit: `hpctrain train --resume` says so in one line naming the checkpoint, exit 2.
    Before, the run started and died in its first step: SIGSEGV in the optimizer, or a traceback."""
    from hpctrain import checkpoint

    change, expected = OPTIMIZATION_CASES[how]
    state = checkpoint.load(trained_fast)
    change(state)
    path = checkpoint.save(
        state, tmp_path / "run" / "checkpoints", "checkpoint_epoch_1.pt", epoch=1, step=state["step"]
    )
    data = str(fashion_data_dir)
    result = hpctrain("train", "mnist", "--resume", str(path), "--data-dir", data, "--epochs", "2", "--threads", "1")
    assert result.returncode == 2 and "Traceback" not in result.stderr, (result.returncode, result.stderr[-2000:])
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"hpctrain train: error: {path}: its recorded ") and expected in line, line
    assert "resume from another checkpoint, or start a new --run-dir" in line


def test_a_parameters_state_must_be_a_dense_tensor_its_storage_backs() -> None:
    """What `torch.load` can hand over and the optimizer's kernels cannot take: a view over a storage smaller than it
    declares (the kernel would read and write past its end), a view whose elements overlap, a tensor of another
    dtype; the same shape with permuted strides (channels_last) is dense, and fits."""
    from hpctrain.training.state_fit import optimizer_problem

    weight = torch.nn.Parameter(torch.zeros(4, 6))
    optimizer = torch.optim.SGD([weight], lr=0.1, momentum=0.9)
    groups = optimizer.state_dict()["param_groups"]
    short = torch.zeros(24)
    view = short.view(4, 6)
    short.untyped_storage().resize_(40)  # 10 floats left under a view of 24

    def problem(buffer: torch.Tensor) -> str | None:
        return optimizer_problem({"state": {0: {"momentum_buffer": buffer}}, "param_groups": groups}, optimizer)

    assert problem(view) == "state[0].momentum_buffer declares 24 elements over a storage of 40 bytes"
    assert "overlaps itself" in (problem(torch.zeros(6).expand(4, 6)) or "")
    assert problem(torch.zeros(4, 6, dtype=torch.float64)) == (
        "state[0].momentum_buffer is of torch.float64, its parameter of torch.float32"
    )
    assert problem(torch.zeros(6, 4).t()) is None  # dense, strides permuted
