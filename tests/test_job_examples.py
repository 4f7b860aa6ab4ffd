"""The example job files in examples/jobs/ stay valid: each loads, renders with --dry-run, and passes shellcheck."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.jobs import JobSpec, from_mapping, load_job_file
from hpctrain.schedulers.slurm.options import FILE_KEYS

EXAMPLES = sorted((Path(__file__).parent.parent / "examples" / "jobs").glob("*.[yt]*ml"))
SIGNATURE = {
    "conda": "conda activate hpctrain",
    "venv": 'source "$HOME"/venvs/hpctrain/bin/activate',
    "apptainer": (
        "apptainer exec --nv --bind /scratch:/scratch,/project/data:/data:ro --pwd /workspace pytorch.sif python"
    ),
    "pyxis": (
        "--container-image='registry.example.com#team/pytorch:24.01-py3' --container-mounts=/lustre/project:/project"
    ),
    "modules": "module load python/3.11 pytorch/2.4",
}


def _job(path: Path) -> JobSpec:
    """The example's neutral job: its Slurm options (launcher) stand at the top level, as job files may keep them."""
    return from_mapping({k: v for k, v in load_job_file(path).items() if k not in FILE_KEYS})


def test_every_environment_kind_has_an_example() -> None:
    kinds = {_job(p).environment.kind for p in EXAMPLES}
    assert kinds == set(SIGNATURE)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_renders(path: Path, capsys, tmp_path: Path, fashion_data_dir: Path, monkeypatch) -> None:
    # Where a fresh clone stands after the quick start: Fashion-MNIST in ./data. The examples' image and venv are
    # placeholders made once before a first submit: --dry-run notes them (a real submit refuses) and passes.
    (tmp_path / "clone").mkdir()
    (tmp_path / "clone" / "data").symlink_to(fashion_data_dir)
    monkeypatch.chdir(tmp_path / "clone")
    code = main(["submit", "--dry-run", "--job-file", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert all(
        line.startswith(("hpctrain submit: note: ", "hpctrain submit: --dry-run skipped")) for line in err.splitlines()
    ), err
    script = out.split("<<'EOF'\n", 1)[1].rsplit("EOF\n", 1)[0]
    kind = _job(path).environment.kind
    assert SIGNATURE[kind] in script
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed: apt-get install shellcheck")
    (tmp_path / "job.sbatch").write_text(script)
    proc = subprocess.run(["shellcheck", str(tmp_path / "job.sbatch")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
