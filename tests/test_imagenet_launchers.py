"""`hpctrain train imagenet` runs unchanged under every launcher: torchrun --standalone, multi-node torchrun (a c10d
rendezvous, two agents on this host), srun with --dist-init-method slurm on the local Slurm
cluster, and `hpctrain submit --nodes 2 --nproc-per-node 2`, interrupted by Slurm's time-limit warning once and
requeued.

Each run is the same small computation (image_fixtures.TINY_ARCH at 32 pixels on the Fashion-MNIST JPEG folders, one
torch thread and one data worker per process, gloo): whatever starts its processes, it must end with the weights,
bitwise, of the same run started by `--nproc` (two processes) or by a local torchrun (four), and its metrics must
record the world size. Also: the checks a resume makes for image runs (--arch, --image-size, --val-size), and `-b`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.training.metrics import read_metrics
from image_fixtures import TINY_ARCH, fashion_folders  # noqa: F401
from slurm_fixtures import Job, attempts, shared_run
from training_helpers import assert_bitwise_equal, clean_environ, final_weights, hpctrain, ok, run_torchrun, torchrun

# 128 training images, global batch 16: 8 steps an epoch; 40 validation images.
TINY = [
    "-a",
    TINY_ARCH,
    "--image-size",
    "32",
    "--val-size",
    "32",
    "--threads",
    "1",
    "--log-interval",
    "0",
    "-b",
    "16",
    "-j",
    "1",
    "--train-limit",
    "128",
    "--test-limit",
    "40",
]
STEPS_PER_EPOCH = 128 // 16
# The 2 x 2 Slurm job: two epochs of 160 images (10 steps each), so that the warning lands inside the run.
JOB_TRAIN = [*TINY[:-4], "--train-limit", "160", "--test-limit", "40", "--epochs", "2"]
JOB_STEPS_PER_EPOCH = 160 // 16


def train_args(data: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["train", "imagenet", str(data), *TINY, "--run-dir", str(run_dir), *extra]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolved(run_dir: Path) -> dict:
    import yaml

    return yaml.safe_load((run_dir / "config.yaml").read_text())["resolved"]


def epoch_records(run_dir: Path) -> list[dict]:
    return [record for record in read_metrics(run_dir) if "test_loss" in record]


def assert_two_process_run(run_dir: Path, launcher: str, reference: Path) -> None:
    """One epoch by two DDP processes that `launcher` started: the same weights as `--nproc 2`."""
    assert [(r["epoch"], r["step"], r["world_size"]) for r in epoch_records(run_dir)] == [(1, STEPS_PER_EPOCH, 2)]
    assert (resolved(run_dir)["launcher"], resolved(run_dir)["world_size"]) == (launcher, 2)
    provenance = json.loads((run_dir / "provenance.json").read_text())["attempts"]
    assert [(a["launcher"], a["world_size"]) for a in provenance] == [(launcher, 2)]
    assert_bitwise_equal(final_weights(run_dir), final_weights(reference))


@pytest.fixture(scope="session")
def nproc2_reference(tmp_path_factory, fashion_folders: Path) -> Path:
    """One epoch with `--nproc 2`, made once per session (shared by the xdist workers): what every two-process
    launcher below must end with."""
    return shared_run(
        tmp_path_factory,
        "imagenet-nproc2-reference",
        lambda run_dir: ok(hpctrain(*train_args(fashion_folders, run_dir, "--epochs", "1", "--nproc", "2"))),
    )


@pytest.mark.slow
def test_torchrun_standalone_two_processes_equals_nproc_two(fashion_folders, nproc2_reference, tmp_path):
    """The seed script's first form (README): torchrun --standalone, --resume --checkpoints-path DIR, DIR new."""
    run_dir = tmp_path / "checkpoints"
    args = ["train", "imagenet", str(fashion_folders), *TINY, "--epochs", "1", "--resume", "--checkpoints-path"]
    options = ["--standalone", "--nnodes", "1", "--nproc-per-node", "2"]
    result = ok(run_torchrun(options, ["-m", "hpctrain"], [*args, str(run_dir)], timeout=300))
    assert "global batch 16 = 2 process(es) x 8" in result.stdout, result.stdout
    assert_two_process_run(run_dir, "torchrun", nproc2_reference)


@pytest.mark.slow
def test_two_node_torchrun_with_c10d_rendezvous_equals_nproc_two(
    fashion_folders,
    nproc2_reference,
    tmp_path,
):
    """Two torchrun agents meeting at a c10d rendezvous, one per "node" (both on this host), one worker each: a
    world of 2 over 2 nodes. (c10d ranks the agents itself: it ignores --node-rank.)"""
    run_dir, port = tmp_path / "run", free_port()
    agents = []
    for _ in range(2):
        options = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
        options += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", tmp_path.name]
        agents.append(torchrun(options, ["-m", "hpctrain"], train_args(fashion_folders, run_dir, "--epochs", "1")))
    try:
        outputs = [agent.communicate(timeout=300)[0] for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    assert [agent.returncode for agent in agents] == [0, 0], outputs
    assert sum("global batch 16 = 2 process(es) x 8" in out for out in outputs) == 1, outputs  # rank 0 says it
    assert_two_process_run(run_dir, "torchrun", nproc2_reference)


@pytest.mark.slow
@pytest.mark.slurm
def test_srun_two_nodes_with_dist_init_method_slurm_equals_nproc_two(
    slurm_cluster,
    fashion_folders,
    nproc2_reference,
    tmp_path,
):
    """The seed script's srun form (README): one task per node, each finding its rank in Slurm's variables; --val-path,
    --checkpoints-path DIR --resume with DIR new. (No GPUs here: a task owning several is tested in
    test_slurm_gpu_fanout.py.)"""
    run_dir = tmp_path / "checkpoints"
    command = [
        "srun",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--time=5",
        "--job-name=hpctrain-test",
        sys.executable,
        "-m",
        "hpctrain",
        "train",
        "imagenet",
        str(fashion_folders),
        "--val-path",
        str(fashion_folders / "val"),
        "--dist-init-method",
        "slurm",
        "--checkpoints-path",
        str(run_dir),
        *TINY,
        "--epochs",
        "1",
        "--resume",
    ]
    result = ok(subprocess.run(command, cwd=tmp_path, env=clean_environ(), capture_output=True, text=True, timeout=600))
    assert result.stdout.count("global batch 16 = 2 process(es) x 8") == 1, result.stdout
    provenance = json.loads((run_dir / "provenance.json").read_text())["attempts"]
    assert provenance[0]["slurm"]["SLURM_JOB_NODELIST"] == "node[1-2]", provenance
    assert_two_process_run(run_dir, "slurm", nproc2_reference)


@pytest.mark.slow
@pytest.mark.slurm
def test_submit_2x2_imagenet_job_trains_with_four_processes(slurm_cluster, fashion_folders, tmp_path) -> None:
    """`hpctrain submit --nodes 2 --nproc-per-node 2 ... train imagenet DATA`: torchrun on both nodes, one group of
    four. (Requeue and exact resume through Slurm are tested with MNIST, test_preemption_slurm.py, on the same
    engine; imagenet's own exact resume in test_imagenet.py.)"""
    result = ok(
        hpctrain(
            "submit",
            "--output",
            "job-%j.out",
            "--launcher",
            "torchrun",
            "--nodes",
            "2",
            "--nproc-per-node",
            "2",
            "--time",
            "30",
            "train",
            "imagenet",
            str(fashion_folders),
            *JOB_TRAIN[:-1],
            "1",
            cwd=tmp_path,
        )
    )
    job_id = result.stdout.strip()
    assert job_id.isdigit(), result.stdout
    job = Job(job_id, tmp_path, tmp_path / "runs" / f"imagenet-{fashion_folders.name}-{job_id}")
    job.follow()
    [part] = attempts(job.log)
    assert "step finished with exit status 0" in part, job.log
    records = epoch_records(job.run_dir)
    assert [(r["epoch"], r["step"], r["world_size"]) for r in records] == [(1, JOB_STEPS_PER_EPOCH, 4)], records
    assert 0.0 <= records[0]["test_accuracy"] <= 1.0 and "test_top5" in records[0], records
    provenance = json.loads((job.run_dir / "provenance.json").read_text())["attempts"]
    assert [(a["launcher"], a["world_size"]) for a in provenance] == [("torchrun", 4)], provenance
    assert provenance[0]["slurm"]["SLURM_JOB_NODELIST"] == "node[1-2]", provenance


def test_submit_checks_the_image_folder_before_queueing(fashion_folders, tmp_path):
    """`submit ... train imagenet DATA` checks DATA/train as the job will read it (not a downloaded dataset)."""
    submit = ["submit", "--dry-run", "--nodes", "2", "--nproc-per-node", "2", "--time", "10", "train", "imagenet"]
    good = ok(hpctrain(*submit, str(fashion_folders), *JOB_TRAIN, cwd=tmp_path))
    assert "train imagenet" in good.stdout and "refuse" not in good.stderr, good.stderr
    missing = hpctrain(*submit, str(tmp_path / "nowhere"), *JOB_TRAIN, cwd=tmp_path)
    assert missing.returncode == 2 and "nowhere has no train/ folder" in missing.stderr, missing.stderr
    assert "Traceback" not in missing.stderr


# ---------------------------------------------------------------- what a resumed image run must keep

SYNTHETIC = ["--synthetic", "--train-limit", "32", "--test-limit", "16", "--threads", "1", "-b", "16", "-j", "0"]
SHAPE = {"-a": "resnet18", "--image-size": "32", "--val-size": "32"}


def shaped(**changes: str | None) -> list[str]:
    """SHAPE's options with some changed (None: left out, the recipe's default)."""
    values = {**SHAPE, **{f"--{k.replace('_', '-')}" if k != "a" else "-a": v for k, v in changes.items()}}
    return [word for flag, value in values.items() if value is not None for word in (flag, value)]


def test_resume_refuses_another_arch_or_image_size_naming_the_checkpoints_values(tmp_path):
    from hpctrain.cli.train import config_from_argv
    from hpctrain.distributed import detect
    from hpctrain.errors import UserError
    from hpctrain.recipes import get_recipe
    from hpctrain.training.resume import check_resume_point
    from hpctrain.training.setup import resolve_config
    from training_helpers import tree_digest

    run_dir = tmp_path / "run"
    ok(hpctrain("train", "imagenet", *SYNTHETIC, *shaped(), "--epochs", "1", "--run-dir", str(run_dir)))
    before = tree_digest(run_dir)
    for options, difference, fix in [
        (shaped(a="resnet34"), "--arch: checkpoint resnet18, now resnet34", "(--arch resnet18)"),
        (shaped(image_size="64"), "--image-size: checkpoint 32, now 64", "(--image-size 32)"),
    ]:  # the command line: exit status 2, one line, nothing changed
        result = hpctrain(
            "train", "imagenet", *SYNTHETIC, *options, "--epochs", "2", "--resume", "--run-dir", str(run_dir)
        )
        assert result.returncode == 2, (options, result.stdout, result.stderr)
        assert difference in result.stderr and fix in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and "state_dict" not in result.stderr, result.stderr
        assert tree_digest(run_dir) == before, options
    for options, difference in [  # the same check, in this process
        (shaped(image_size=None), "--image-size: checkpoint 32, now unset (the recipe's default)"),
        (shaped(val_size="48"), "--val-size: checkpoint 32, now 48"),
        (shaped(a=None), "--arch: checkpoint resnet18, now resnet50"),
    ]:
        cfg = config_from_argv(["imagenet", *SYNTHETIC, *options, "--resume", "--run-dir", str(run_dir)])
        with pytest.raises(UserError, match=difference.replace("(", r"\(").replace(")", r"\)")):
            recipe = get_recipe("imagenet", "fast").for_config(cfg)
            check_resume_point(resolve_config(cfg, recipe), recipe, detect())
    # --evaluate does not resume a run, but a checkpoint of another model is refused the same way.
    result = hpctrain(
        "train",
        "imagenet",
        *SYNTHETIC,
        *shaped(a="resnet34"),
        "--evaluate",
        "--resume",
        str(run_dir),
        "--run-dir",
        str(tmp_path / "unused"),
    )
    assert result.returncode == 2 and "use the options it was made with (--arch resnet18)" in result.stderr, (
        result.stderr
    )
    # The same options resume.
    resumed = ok(
        hpctrain("train", "imagenet", *SYNTHETIC, *shaped(), "--epochs", "2", "--resume", "--run-dir", str(run_dir))
    )
    assert "resumed at epoch 2" in resumed.stdout


@pytest.mark.parametrize("recipe,image_size", [("classic", 224), ("fast", None)])
def test_the_run_config_records_the_arch_and_sizes_the_recipe_chose(recipe, image_size):
    """Left unset, --arch and the crop sides are written out as used: a resume with `-a resnet50` (the default,
    named) continues a run that did not name it. The fast recipe's progressive resizing has no one image size."""
    from hpctrain.config import TrainConfig
    from hpctrain.recipes import get_recipe
    from hpctrain.training.setup import resolve_config

    cfg = TrainConfig(workload="imagenet", dataset="imagenet", recipe=recipe, synthetic=True)
    resolved = resolve_config(cfg, get_recipe("imagenet", recipe).for_config(cfg))
    assert (resolved.arch, resolved.image_size, resolved.val_size) == ("resnet50", image_size, 224)
    named = cfg.replace(arch="resnet50", val_size=224)
    assert resolve_config(named, get_recipe("imagenet", recipe).for_config(named)) == resolved


@pytest.mark.parametrize("workload", ["imagenet", "mnist"])
def test_b_is_the_global_batch_size(workload):
    from hpctrain.cli.train import config_from_argv

    extra = ["--synthetic"] if workload == "imagenet" else []
    assert config_from_argv([workload, "-b", "64", *extra]).batch_size == 64
    help_text = ok(hpctrain("train", "--help")).stdout
    assert "-b N, --batch-size N" in help_text and "GLOBAL batch" in help_text
