"""`hpctrain env`: run as users run it (a subprocess), text and JSON, with real launcher variables."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from importlib import metadata

import pytest
import torch
from training_helpers import run_hpctrain

LAUNCHER_VARS = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
}


def hpctrain_env(*args: str, **variables: str) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in LAUNCHER_VARS and not k.startswith(("SLURM_", "PET_", "TORCHELASTIC_", "HPCTRAIN_LAUNCHER"))
    }
    env.update(variables)
    return run_hpctrain("env", *args, env=env, timeout=120)


def slurm_client_version() -> str | None:
    if shutil.which("sinfo") is None:
        return None
    return subprocess.run(["sinfo", "--version"], capture_output=True, text=True, timeout=10).stdout.strip()


def test_text_report_has_what_a_bug_report_needs() -> None:
    proc = hpctrain_env()
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"Python:       {platform.python_version()}" in out
    assert f"torch:        {torch.__version__}" in out
    assert f"CUDA (build): {torch.version.cuda or 'not available'}" in out
    assert "cuDNN:" in out and "NCCL:" in out
    assert f"torchvision:  {metadata.version('torchvision')}" in out
    slurm = slurm_client_version()
    assert f"Slurm client: {slurm or 'not available'}" in out
    assert f"GPUs visible: {torch.cuda.device_count() if torch.cuda.is_available() else 0}" in out
    assert "distributed:  single process (launcher none)" in out


def test_json_report_shows_the_detected_torchrun_worker() -> None:
    proc = hpctrain_env(
        "--json",
        RANK="1",
        WORLD_SIZE="2",
        LOCAL_RANK="1",
        LOCAL_WORLD_SIZE="2",
        MASTER_ADDR="head",
        MASTER_PORT="29400",
    )
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["torch"] == torch.__version__
    assert info["torch_cuda_build"] == torch.version.cuda
    assert info["torchvision"] == metadata.version("torchvision")
    assert info["slurm"] == slurm_client_version()
    assert info["cuda_available"] == torch.cuda.is_available()
    assert len(info["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if torch.cuda.is_available():
        assert info["cudnn"] is not None and info["nccl"] is not None
    dist = info["distributed"]
    assert (dist["launcher"], dist["rank"], dist["world_size"], dist["master_addr"], dist["master_port"]) == (
        "torchrun",
        1,
        2,
        "head",
        29400,
    )
    assert info["launcher_variables"]["MASTER_PORT"] == "29400"


@pytest.mark.parametrize(
    ("args", "variables", "message"),
    [
        ((), {"RANK": "3"}, "RANK=3 is set but WORLD_SIZE is not"),
        (("--dist-init-method", "slurm"), {}, "not started by srun"),
    ],
)
def test_inconsistent_environment_is_reported_not_raised(args, variables, message) -> None:
    proc = hpctrain_env(*args, **variables)
    assert proc.returncode == 0, proc.stderr
    error_line = next(line for line in proc.stdout.splitlines() if line.startswith("distributed:  error: "))
    assert message in error_line
    assert "torch:" in proc.stdout  # the rest of the report is still there


def test_provenance_records_the_versions_env_shows() -> None:
    """One function for both: provenance.json once held `nccl: null` and cuDNN as a raw number like 92400."""
    from hpctrain.training.provenance import versions

    info = json.loads(hpctrain_env("--json").stdout)
    recorded = versions()
    assert (recorded["cudnn"], recorded["nccl"], recorded["cuda"], recorded["torchvision"]) == (
        info["cudnn"],
        info["nccl"],
        info["torch_cuda_build"],
        info["torchvision"],
    )
    if torch.backends.cudnn.is_available():
        assert recorded["cudnn"].count(".") == 2, recorded["cudnn"]
    if torch.distributed.is_nccl_available():  # the build carries NCCL even where no GPU is visible
        assert recorded["nccl"] is not None
