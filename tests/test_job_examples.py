"""The example job files in examples/jobs/ stay valid: each loads, renders with --dry-run, and passes shellcheck."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.jobs import load_job_file
from hpctrain.schedulers.slurm.flags import complete_job
from hpctrain.schedulers.slurm.batch.options import FILE_KEYS, SlurmOptions, read_file_section

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


def _options(path: Path) -> SlurmOptions:
    """The example's Slurm options (launcher, environment): at the top level, as job files may keep them."""
    data = load_job_file(path)
    options = read_file_section(str(path), {k: v for k, v in data.items() if k in FILE_KEYS})
    return SlurmOptions(**complete_job({}, options, {})[1])


def test_every_environment_kind_has_an_example() -> None:
    kinds = {_options(p).environment.kind for p in EXAMPLES}
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
    kind = _options(path).environment.kind
    assert SIGNATURE[kind] in script
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed: apt-get install shellcheck")
    (tmp_path / "job.sbatch").write_text(script)
    proc = subprocess.run(["shellcheck", str(tmp_path / "job.sbatch")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
