"""Help texts say what each command and workload really does: `train W --help` shows W's own recipe defaults,
--resume leaves imagenet's DATA alone, --scheduler's help fits its command, and the TrainJob runtime has a flag."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.cli.train import config_from_argv
from hpctrain.recipes import CATALOG


def help_of(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def option_help(text: str, flag: str) -> str:
    """The help of option `flag` in argparse's output, on one line (its wrapped lines joined)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"\s+(-\w [^,]+, )?{re.escape(flag)}\b", line))
    entry = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.strip() or re.match(r"\s{1,4}-", line) or not line.startswith(" "):
            break
        entry.append(line)
    words = " ".join(" ".join(entry).split())
    return words.split(" ", 2 if re.match(r"\S+ [A-Z]", words) else 1)[-1]


def shown_defaults(text: str, flag: str) -> dict[str, str]:
    """{recipe: value} from a help like `passes over the training set (fast: 1, classic: 14)`."""
    return dict(re.findall(r"\b(\w+): ([\d.]+)\b", option_help(text, flag)))


@pytest.mark.parametrize("workload", list(CATALOG))
def test_train_workload_help_shows_that_workloads_defaults(capsys, workload: str) -> None:
    text = help_of(capsys, "train", workload)
    recipes = CATALOG[workload].recipes
    for flag, field in (
        ("--epochs", "epochs"),
        ("--batch-size", "batch_size"),
        ("--lr", "lr"),
        ("--test-batch-size", "test_batch_size"),
    ):
        expected = {name: getattr(info.defaults, field) for name, info in recipes.items()}
        shown = shown_defaults(text, flag)
        assert {name: float(shown[name]) for name in expected} == expected, (flag, option_help(text, flag))
    recipe_help = option_help(text, "--recipe")
    for name, info in recipes.items():  # argparse may break a line after a hyphen: compare without spaces
        assert f"{name} (" in recipe_help and info.description.replace(" ", "") in recipe_help.replace(" ", "")
    dataset_help = option_help(text, "--dataset")
    assert all(d in dataset_help for d in CATALOG[workload].datasets)
    others = {d for w, info in CATALOG.items() if w != workload for d in info.datasets} - set(
        CATALOG[workload].datasets
    )
    assert not [d for d in others if re.search(rf"\b{d}\b", dataset_help)], dataset_help


def test_imagenet_help_is_not_mnists(capsys) -> None:
    text = help_of(capsys, "train", "imagenet")
    assert shown_defaults(text, "--epochs") == {"fast": "16", "classic": "90"}
    assert "fashion-mnist" not in option_help(text, "--dataset") and "MNIST" not in option_help(text, "--recipe")
    assert "per 256 images" in option_help(text, "--lr")


def test_train_help_without_a_workload_shows_every_workloads_defaults(capsys) -> None:
    epochs = option_help(help_of(capsys, "train"), "--epochs")
    for workload, info in CATALOG.items():
        listed = ", ".join(
            f"{name}: {r.defaults.epochs}"
            for name, r in sorted(info.recipes.items(), key=lambda item: item[0] != "fast")
        )
        assert f"{workload} {listed}" in epochs, epochs


def test_top_level_help_names_every_workload_and_dev_service(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"train a built-in workload ({', '.join(CATALOG)})" in text
    assert "JupyterLab, sshd or VS Code tunnel" in text


# ---------------------------------------------------------------- --resume and DATA


def image_folder(root: Path) -> Path:
    (root / "train" / "cat").mkdir(parents=True)
    (root / "val" / "cat").mkdir(parents=True)
    return root


def test_resume_followed_by_data_keeps_data_as_data(tmp_path: Path) -> None:
    data = image_folder(tmp_path / "imagenet")
    for argv in (
        ["imagenet", "--resume", str(data)],
        ["imagenet", "--resume", str(data), "--epochs", "2"],
        ["imagenet", "--epochs", "2", "--resume", str(data)],
    ):
        cfg = config_from_argv(argv)
        assert (cfg.data_dir, cfg.resume) == (str(data), "latest"), argv


def test_resume_still_takes_a_checkpoint_path_before_or_after_data(tmp_path: Path) -> None:
    data = image_folder(tmp_path / "imagenet")
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    checkpoint = tmp_path / "elsewhere" / "checkpoint_epoch_3.pt"  # not there (yet): still a checkpoint's name
    for argv, resume in (
        (["imagenet", "--resume", str(run_dir), str(data)], run_dir),
        (["imagenet", str(data), "--resume", str(run_dir)], run_dir),
        (["imagenet", "--resume", str(checkpoint), str(data)], checkpoint),
        (["imagenet", str(data), "--resume", str(tmp_path / "typo")], tmp_path / "typo"),
    ):
        cfg = config_from_argv(argv)
        assert (cfg.data_dir, cfg.resume) == (str(data), str(resume)), argv
    synthetic = config_from_argv(["imagenet", "--synthetic", "--resume", str(tmp_path / "typo")])
    assert synthetic.resume == str(tmp_path / "typo")
    assert config_from_argv(["mnist", "--resume", str(data)]).resume == str(data)  # mnist takes no DATA


# ---------------------------------------------------------------- --scheduler, --runtime, env


@pytest.mark.parametrize(
    "argv,job_file",
    [
        (["submit"], True),
        (["check"], True),
        (["status"], False),
        (["top"], False),
        (["tensorboard"], False),
        (["dev", "start"], False),
        (["dev", "list"], False),
        (["dev", "stop"], False),
    ],
)
def test_scheduler_help_mentions_a_job_file_only_where_one_is_read(capsys, argv: list[str], job_file: bool) -> None:
    text = option_help(help_of(capsys, *argv), "--scheduler")
    assert ("job file" in text) == job_file, text


def test_dev_list_shows_only_the_chosen_schedulers_sessions(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    from hpctrain.servers.sessions import state_root

    session = state_root("dev") / "nb"
    session.mkdir(parents=True)
    (session / "connection.json").write_text(json.dumps({"scheduler": "kubernetes", "name": "nb"}))
    assert main(["dev", "list", "--scheduler", "slurm"]) == 0
    assert capsys.readouterr().out.startswith("no dev sessions on slurm")
    assert main(["dev", "stop", "nb", "--scheduler", "slurm"]) == 2
    assert "runs on kubernetes, not slurm" in capsys.readouterr().err


def test_trainjob_runtime_has_a_flag(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    common = [
        "submit",
        "--scheduler",
        "kubernetes",
        "--dry-run",
        "--image",
        "registry.example/pytorch:1",
        "--runtime",
        "torch-gpu",
    ]
    assert main([*common, "--k8s-api", "trainjob", "--", "python3", "x.py"]) == 0
    assert "kind: ClusterTrainingRuntime\n    name: torch-gpu\n" in capsys.readouterr().out
    assert main([*common, "--", "python3", "x.py"]) == 2  # a PyTorchJob has no runtime
    assert "use --k8s-api trainjob" in capsys.readouterr().err
    assert main(["submit", "--scheduler", "slurm", "--dry-run", "--runtime", "x", "--", "true"]) == 2
    assert "--runtime is a Kubernetes option" in capsys.readouterr().err


def test_env_reports_each_scheduler_clients_version(capsys) -> None:
    from hpctrain.schedulers import SCHEDULERS, backend_info

    assert main(["env", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert {name: info[name] for name in SCHEDULERS} == {
        name: backend_info(name).client_version() for name in SCHEDULERS
    }


def test_the_names_resume_recognizes_are_the_run_directorys_own():
    """recipes/train_options.py repeats two names so that parsing needs no torch; they must stay the loop's and the
    checkpoint's."""
    from hpctrain import checkpoint
    from hpctrain.recipes import train_options as train
    from hpctrain.training.rundir import CHECKPOINT_DIR

    assert (train._CHECKPOINT_DIR, train._LATEST_POINTER) == (CHECKPOINT_DIR, checkpoint.LATEST_POINTER)
