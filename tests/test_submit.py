"""`hpctrain submit` / `hpctrain check` without a cluster: flags and job files -> JobSpec, --dry-run output, and
bad input that must stop before sbatch. sbatch here is a stand-in on PATH that records whether it was called;
the real sbatch runs in test_submit_slurm.py."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpctrain.cli import main


@pytest.fixture
def fake_sbatch(tmp_path: Path, monkeypatch):
    """A recording sbatch on PATH; returns the path of its call log (absent: never called)."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch-calls"
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncat > /dev/null\necho "$*" >> {shlex.quote(str(log))}\necho 777\n')
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    return log


def test_dry_run_prints_command_and_script(fake_sbatch: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "train.py").write_text("")
    code = main(
        [
            "submit",
            "--dry-run",
            "--nodes",
            "2",
            "--nproc-per-node",
            "2",
            "--job-name",
            "my job",
            "--time",
            "10",
            "--",
            "python",
            "train.py",
            "--lr",
            "0.1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("# sbatch --parsable <<'EOF'\n#!/bin/bash\n")
    assert '#SBATCH --job-name="my job"' in out and "#SBATCH --time=00:10:00" in out
    assert "--no-python python train.py --lr 0.1 &" in out
    assert 'runs/my_job-"${SLURM_JOB_ID}"' in out
    assert not fake_sbatch.exists()
    # the printed script is exactly what would be submitted: bash accepts it
    script = out.split("<<'EOF'\n", 1)[1].rsplit("EOF\n", 1)[0]
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_recipe_dry_run_uses_the_recipe_run_dir(fake_sbatch: Path, fashion_data_dir: Path, capsys) -> None:
    code = main(
        [
            "submit",
            "--dry-run",
            "--launcher",
            "srun",
            "--nodes",
            "2",
            "--nproc-per-node",
            "2",
            "train",
            "mnist",
            "--recipe",
            "classic",
            "--dataset",
            "fashion-mnist",
            "--epochs",
            "1",
            "--data-dir",
            str(fashion_data_dir),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert 'run_dir=runs/mnist-fashion-mnist-classic-"${SLURM_JOB_ID}"' in out
    assert "#SBATCH --job-name=mnist-fashion-mnist\n" in out
    python = shlex.quote(os.path.abspath(sys.executable))
    assert (
        "srun --ntasks-per-node=2 --cpus-per-task=1 --kill-on-bad-exit=1 --quiet "
        f"{python} -m hpctrain train mnist --recipe classic "
        f'--dataset fashion-mnist --epochs 1 --data-dir {shlex.quote(str(fashion_data_dir))} --run-dir "$run_dir" &'
    ) in out


def test_flags_override_the_job_file(fake_sbatch: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "job.yaml").write_text(
        "name: fromfile\nnodes: 2\nnproc_per_node: 2\ntime: 30:00\ncommand: [python, a.py]\n"
    )
    (tmp_path / "a.py").write_text("")
    code = main(["submit", "--dry-run", "--job-file", "job.yaml", "--nodes", "1", "--job-name", "flag"])
    out = capsys.readouterr().out
    assert code == 0
    assert "#SBATCH --job-name=flag" in out and "#SBATCH --nodes=1" in out and "#SBATCH --time=00:30:00" in out
    assert "python a.py &" in out


@pytest.mark.parametrize(
    "job_file,message",
    [
        ("nodez: 2\ncommand: [x]\n", "unknown key(s) nodez; valid keys:"),
        ("nodes: two\ncommand: [x]\n", "is neither a node count nor MIN:MAX"),
        ("nodes: -2\ncommand: [x]\n", "--nodes must be at least 1"),
        ("time: 1h\ncommand: [x]\n", "is not a time"),
        (
            "command: [x]\nenvironment: {kind: apptainer, image: missing.sif}\n",
            "apptainer image missing.sif does not exist",
        ),
        (
            "command: [x]\nslurm: {partitio: gpu}\n",
            "job file job.yaml: unknown slurm key(s) partitio; valid keys: account,",
        ),
        ("command: [x]\nslurm: {max_requeues: many}\n", "job file job.yaml: max_requeues must be a whole number (got"),
        ("command: [x]\npartition: 5\n", "job file job.yaml: partition must be a string (got 5, a int)"),
        (
            "command: [x]\nslurm: {launcher: mpirun}\n",
            "--launcher 'mpirun' is unknown: use one of torchrun, srun, single",
        ),
        ("command: [x]\nslurm: [gpu]\n", "job file job.yaml: slurm must be a mapping of options (partition,"),
    ],
)
def test_bad_job_files_exit_2_and_submit_nothing(
    fake_sbatch: Path, tmp_path: Path, capsys, job_file: str, message: str
) -> None:
    (tmp_path / "job.yaml").write_text(job_file)
    code = main(["submit", "--no-check", "--job-file", "job.yaml"])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert not fake_sbatch.exists()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--gpus-per-node", "2", "--nproc-per-node", "1", "--", "x"], "set --nproc-per-node 2"),
        (["--gres", "tpu:2", "--", "x"], "use gpu:N, gpu:TYPE:N or shard:N"),
        (["--job-name", "a\nb", "--", "x"], "control characters"),
        (["python", "x.py"], "put your own command after `--`"),
        ([], "no command"),
        (["train", "mnist", "--epochs", "0"], "--epochs must be at least 1"),
        (["train", "mnist", "--nproc", "2"], "use --nproc-per-node"),
        (["train", "mnist", "--recipe", "nosuch"], "unknown --recipe 'nosuch'"),
        (["--image", "x.img", "--", "x"], "--env-kind apptainer or --env-kind pyxis"),
        (["--run-dir", "r", "train", "mnist"], "goes after the recipe"),
        (["--sbatch", "--comment --output=/x", "--", "x"], "holds 2 options"),
        (["--sbatch", "--comment=x\n#SBATCH --output=/x", "--", "x"], "control characters"),
    ],
)
def test_bad_flags_exit_2_and_submit_nothing(fake_sbatch: Path, capsys, argv: list[str], message: str) -> None:
    code = main(["submit", "--no-check", *argv])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not fake_sbatch.exists()


def test_recipe_without_its_dataset_is_refused(fake_sbatch: Path, tmp_path: Path, capsys) -> None:
    code = main(
        [
            "submit",
            "--no-check",
            "train",
            "mnist",
            "--recipe",
            "classic",
            "--dataset",
            "fashion-mnist",
            "--data-dir",
            str(tmp_path / "empty"),
        ]
    )
    assert code == 2
    assert "hpctrain download fashion-mnist" in capsys.readouterr().err
    assert not fake_sbatch.exists()


def test_submit_records_script_and_description(
    fake_sbatch: Path, tmp_path: Path, fashion_data_dir: Path, capsys
) -> None:
    code = main(
        [
            "submit",
            "--no-check",
            "--nodes",
            "2",
            "--nproc-per-node",
            "2",
            "train",
            "mnist",
            "--recipe",
            "classic",
            "--dataset",
            "fashion-mnist",
            "--data-dir",
            str(fashion_data_dir),
            "--epochs",
            "1",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out == "777\n"
    run_dir = tmp_path / "runs" / "mnist-fashion-mnist-classic-777"
    assert (run_dir / "job.sbatch").read_text().startswith("#!/bin/bash\n")
    assert fake_sbatch.read_text() == "--parsable\n"
    # the recorded description resubmits the same job
    capsys.readouterr()
    assert main(["submit", "--dry-run", "--job-file", str(run_dir / "job.yaml")]) == 0
    assert capsys.readouterr().out.split("\n", 1)[1] == (run_dir / "job.sbatch").read_text() + "EOF\n"


SLURM_KEYS = {
    "partition": "debug",
    "account": "team",
    "output": "logs/o-%j.out",
    "launcher": "srun",
    "sbatch_extra": ["--exclusive"],
    "max_requeues": 1,
}


@pytest.mark.parametrize("layout", ["top level", "slurm section"])
def test_slurm_options_in_a_job_file_and_in_job_yaml(fake_sbatch: Path, tmp_path: Path, capsys, layout: str) -> None:
    """Slurm's options (SlurmOptions) stand at a job file's top level, as they always did, or in its `slurm:`
    section; the job.yaml that submit records keeps them in that section and resubmits the same script."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "train.py").write_text("")
    job = {"name": "opts", "command": ["python", "train.py"], "nodes": 2, "time": "10"}
    job.update(SLURM_KEYS if layout == "top level" else {"slurm": SLURM_KEYS})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    assert main(["submit", "--no-check", "--job-file", "job.yaml"]) == 0, capsys.readouterr().err
    script = (tmp_path / "runs" / "opts-777" / "job.sbatch").read_text()
    for line in (
        "#SBATCH --partition=debug",
        "#SBATCH --account=team",
        "#SBATCH --output=logs/o-%j.out",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --exclusive",
        'own_requeues" -lt 1 ]',
    ):
        assert line in script, line
    recorded = yaml.safe_load((tmp_path / "runs" / "opts-777" / "job.yaml").read_text())
    # Slurm's section also holds what Slurm alone reads of every job: its environment and interpreter
    own = {"environment": "none", "python": os.path.abspath(sys.executable)}
    assert recorded["scheduler"] == "slurm" and recorded["slurm"] == {**SLURM_KEYS, **own}
    assert not (set(SLURM_KEYS) | set(own)) & set(recorded)
    capsys.readouterr()
    assert main(["submit", "--dry-run", "--job-file", str(tmp_path / "runs" / "opts-777" / "job.yaml")]) == 0
    assert capsys.readouterr().out.split("\n", 1)[1] == script + "EOF\n"


def test_cli_entry_point_exit_status(fake_sbatch: Path, tmp_path: Path) -> None:
    """The installed command, as users run it: bad input exits 2 with the message on stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "hpctrain", "submit", "--nodes", "-1", "--", "x"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "hpctrain submit: error: --nodes must be at least 1 (got -1)" in proc.stderr
    assert not fake_sbatch.exists()


# ---- --dry-run runs every check that needs no cluster ---------------------------------------------------------

SKIPPED = "--dry-run skipped the checks that need the live cluster"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", "mnist", "--dataset", "fashion-mnist", "--data-dir", "nodata"], "hpctrain download fashion-mnist"),
        (
            ["train", "mnist", "--dataset", "fashion-mnist", "--data-dir", "{data}", "--device", "cuda"],
            "train --device cuda, but the job asks for no GPUs",
        ),
        (["--", "python", "missing.py"], "missing.py: not found"),
        (["--", "./missing-tool"], "./missing-tool: not found"),
    ],
)
def test_dry_run_refuses_what_a_real_submit_refuses(
    fake_sbatch: Path, fashion_data_dir: Path, capsys, argv: list[str], message: str
) -> None:
    argv = [a.replace("{data}", str(fashion_data_dir)) for a in argv]
    code = main(["submit", "--dry-run", *argv])
    captured = capsys.readouterr()
    assert code == 2
    assert message in captured.err and "a real submit would refuse this job" in captured.err
    assert SKIPPED in captured.err
    assert captured.out.startswith("# sbatch --parsable")  # the script is still shown, for reading
    assert main(["submit", "--no-check", *argv]) == 2  # the same verdict as a real submit
    assert message in capsys.readouterr().err
    assert not fake_sbatch.exists()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--venv", "novenv", "--", "python", "x.py"], "venv novenv has no bin/activate"),
        (["--image", "none.sif", "--", "python", "x.py"], "apptainer image none.sif does not exist"),
    ],
)
def test_dry_run_notes_an_image_or_venv_not_made_yet_which_a_real_submit_refuses(
    fake_sbatch: Path, capsys, tmp_path: Path, monkeypatch, argv: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("print('hi')\n")
    assert main(["submit", "--dry-run", *argv]) == 0
    captured = capsys.readouterr()
    assert f"note: {message}" in captured.err and "a real submit refuses until then" in captured.err
    assert "a real submit would refuse this job" not in captured.err
    assert captured.out.startswith("# sbatch --parsable")
    assert main(["submit", "--no-check", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not fake_sbatch.exists()


def test_dry_run_says_which_checks_it_skipped(fake_sbatch: Path, fashion_data_dir: Path, capsys) -> None:
    code = main(
        [
            "submit",
            "--dry-run",
            "--gpus-per-node",
            "2",
            "--nproc-per-node",
            "2",
            "train",
            "mnist",
            "--dataset",
            "fashion-mnist",
            "--data-dir",
            str(fashion_data_dir),
            "--device",
            "cuda",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.startswith("# sbatch --parsable")
    assert [line for line in captured.err.splitlines()] == [
        "hpctrain submit: note: time limit: the run gets SIGUSR1 120 s before it, checkpoints and stops, and the job "
        "requeues itself (at most 3 times, --max-requeues)",
        f"hpctrain submit: {SKIPPED} (partition, time limit, nodes and their GPUs, CPUs and memory); `hpctrain check` "
        "with the same options runs them",
    ]


@pytest.mark.parametrize("mem,refused", [("16", True), ("512", True), ("4000", False), ("16G", False), ("0", False)])
def test_mem_without_a_unit_below_a_gigabyte_is_refused(fake_sbatch: Path, capsys, mem: str, refused: bool) -> None:
    """sbatch reads a bare number as megabytes: --mem 16 is surely meant as 16G; it used to be a warning only."""
    assert main(["submit", "--dry-run", "--mem", mem, "--", "true"]) == (2 if refused else 0)
    err = capsys.readouterr().err
    if refused:
        assert err.splitlines() == [
            f"hpctrain submit: error: --mem {mem} has no unit, which reads as "
            f"{mem} MB, too little for any training job: write --mem {mem}G for {mem} GB "
            f"(or --mem {mem}M if you do mean megabytes)"
        ]
        assert not fake_sbatch.exists()
    else:
        assert "--mem" not in err


def test_synthetic_on_cpus_says_how_long_an_epoch_takes(fake_sbatch: Path, capsys) -> None:
    assert (
        main(
            ["submit", "--dry-run", "--nproc-per-node", "4", "--cpus-per-task", "4", "train", "imagenet", "--synthetic"]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert (
        "hpctrain submit: warning: --synthetic on the CPU: an epoch is 1,281,167 images of resnet50 at 224 px, "
        "about 5.5 h on 16 core(s) (estimated at 50 GFLOP/s a core); cap it with --train-limit N (about 5 "
        "minutes: --train-limit 19512), or train on GPUs"
    ) in err
    assert (
        main(
            ["submit", "--dry-run", "--gpus-per-node", "1", "--nproc-per-node", "1", "train", "imagenet", "--synthetic"]
        )
        == 0
    )
    assert "--synthetic on the CPU" not in capsys.readouterr().err
    assert main(["submit", "--dry-run", "train", "imagenet", "--synthetic", "--train-limit", "1000"]) == 0
    assert "--synthetic on the CPU" not in capsys.readouterr().err


def test_bad_training_options_are_named_without_an_exit_status(fake_sbatch: Path, capsys) -> None:
    assert main(["submit", "--dry-run", "train", "mnist", "--epochz", "2"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "hpctrain submit: error: bad training options: unrecognized arguments: --epochz 2 "
        "(did you mean --epochs?); see `hpctrain train --help`"
    ]


# ---- the job finds its tools ------------------------------------------------------------------------------------


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_submit_records_its_own_interpreter_for_kind_none(fake_sbatch: Path, capsys) -> None:
    from hpctrain.engine.job_options import submission_from_args
    from hpctrain.cli.submit import add_arguments

    parser = __import__("argparse").ArgumentParser()
    add_arguments(parser)
    options = submission_from_args(parser.parse_args(["--scheduler", "slurm", "--", "true"]), dry_run=False).options
    assert options["python"] == os.path.abspath(sys.executable)  # Slurm's option: the job shares this machine's files
    venv = submission_from_args(parser.parse_args(["--scheduler", "slurm", "--venv", "v", "--", "true"]), dry_run=False)
    assert "python" not in venv.options


def test_check_names_a_program_the_job_will_not_find(tmp_path: Path) -> None:
    from hpctrain.schedulers.slurm.checks.login_node import program_problems
    from hpctrain.schedulers.slurm.batch.options import SlurmOptions
    from hpctrain.jobs.spec import JobSpec
    from hpctrain.schedulers.slurm.batch.options import EnvironmentSpec

    tools = tmp_path / "tools"
    _executable(tools / "mytool")
    bare = {"PATH": "/nonexistent-bin"}
    here = SlurmOptions(python=sys.executable)
    job = JobSpec(command=("mytool", "--x"))
    [problem] = program_problems(job, bare, here)
    assert problem.startswith("`mytool` is not on the PATH the job will have") and "execve(): mytool" in problem
    assert program_problems(job, {"PATH": f"/nonexistent-bin:{tools}"}, here) == []
    assert program_problems(job.replace(env=(("PATH", str(tools)),)), bare, here) == []  # --setenv PATH counts
    # kind none: torchrun and hpctrain come from the submitting interpreter, whatever the PATH
    assert program_problems(JobSpec(command=("hpctrain", "train", "mnist")), bare, here) == []
    # a venv without torchrun and hpctrain: both named
    venv = tmp_path / "venv"
    _executable(venv / "bin" / "activate")
    in_venv = JobSpec(command=("hpctrain", "train", "mnist"))
    venv_env = EnvironmentSpec(kind="venv", venv=str(venv))
    torchrun = SlurmOptions(launcher="torchrun", environment=venv_env)
    assert [p.split("`")[1] for p in program_problems(in_venv, bare, torchrun)] == ["torchrun", "hpctrain"]
    one = SlurmOptions(environment=venv_env)
    assert [p.split("`")[1] for p in program_problems(in_venv, bare, one)] == ["hpctrain"]  # one process: no torchrun
    _executable(venv / "bin" / "torchrun")
    _executable(venv / "bin" / "hpctrain")
    assert program_problems(in_venv, bare, one) == []
    # python by name, not on the PATH: the fix names this interpreter
    [problem] = program_problems(
        JobSpec(command=("python", "x.py")), bare, SlurmOptions(launcher="srun", python=sys.executable)
    )
    assert f"-- {sys.executable} ..." in problem
    # modules and containers bring their own PATH: nothing is claimed
    for env in (EnvironmentSpec(kind="modules", modules=("x",)), EnvironmentSpec(kind="pyxis", image="repo#img")):
        assert program_problems(JobSpec(command=("mytool",)), bare, SlurmOptions(environment=env)) == []
    # an interpreter that is not there (an old job file from another machine)
    gone = SlurmOptions(python=str(tmp_path / "gone" / "python"))
    [problem] = program_problems(JobSpec(command=("hpctrain",)), bare, gone)
    assert "is not an executable here" in problem


def test_a_job_file_interpreter_with_another_environment_is_refused(fake_sbatch: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "job.yaml").write_text("command: [x]\npython: /usr/bin/python3\nenvironment: {kind: venv, venv: v}\n")
    assert main(["submit", "--dry-run", "--job-file", "job.yaml"]) == 2
    assert "a venv environment brings its own hpctrain and torchrun" in capsys.readouterr().err


def test_a_docker_image_reference_gets_the_pull_command_instead_of_failing_on_the_node(
    fake_sbatch: Path, capsys
) -> None:
    assert (
        main(["submit", "--dry-run", "--image", "docker://nvcr.io/nvidia/pytorch:24.04-py3", "--", "python", "x.py"])
        == 2
    )
    err = capsys.readouterr().err
    assert "hpctrain image pull docker://nvcr.io/nvidia/pytorch:24.04-py3 --to DIR" in err
    assert len(err.splitlines()) == 1


def test_train_synthetic_on_the_cpu_says_how_long_an_epoch_takes(capsys, monkeypatch) -> None:
    from hpctrain.cli.train import config_from_argv
    from hpctrain.cli.train_start import _warn_synthetic_on_cpu

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("SLURM_LOCALID", raising=False)
    _warn_synthetic_on_cpu(config_from_argv(["imagenet", "--synthetic", "--device", "cpu"]), None)
    err = capsys.readouterr().err
    assert err.startswith(
        "hpctrain: warning: --synthetic on the CPU: an epoch is 1,281,167 images of resnet50 at 224 px, about "
    ), err
    _warn_synthetic_on_cpu(
        config_from_argv(["imagenet", "--synthetic", "--device", "cpu", "--train-limit", "256"]), None
    )
    assert capsys.readouterr().err == ""
