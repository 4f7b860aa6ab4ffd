"""The floating-point type of the fast recipes (hpctrain.training.precision): one rule from the device's capability,
tested here on tables of GPU generations and CPUs (no GPU in CI: `torch.cuda.get_device_capability` is replaced
where a recipe asks it; tests/test_gpu.py checks the real one), and the float16 path of the loop (gradient scaler,
its state in checkpoints, exact resume) run for real on the CPU with float16 forced by a start-up hook."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from hpctrain.training.precision import Precision, cpu_precision, cpu_vendor, cuda_precision, grad_scaler
from training_helpers import QUICK, assert_bitwise_equal, final_weights, hpctrain, ok, signal_after

# (compute capability, GPUs, the type, scaled)
GPU_GENERATIONS = [
    ((6, 0), "P100", None, False),
    ((6, 1), "P40, GTX 1080", None, False),
    ((7, 0), "V100", torch.float16, True),
    ((7, 5), "T4, RTX 2080", torch.float16, True),
    ((8, 0), "A100", torch.bfloat16, False),
    ((8, 6), "A10, RTX 3090", torch.bfloat16, False),
    ((8, 9), "L4, L40S", torch.bfloat16, False),
    ((9, 0), "H100, H200", torch.bfloat16, False),
    ((10, 0), "B200", torch.bfloat16, False),
]


@pytest.mark.parametrize(("capability", "gpus", "dtype", "scaled"), GPU_GENERATIONS)
def test_each_gpu_generation_computes_in_its_native_type(capability, gpus, dtype, scaled) -> None:
    precision = cuda_precision(capability)
    assert precision.dtype == dtype, gpus
    assert precision.scaled is scaled
    assert f"sm{capability[0]}{capability[1]}" in precision.why


INTEL, AMD = "GenuineIntel", "AuthenticAMD"


@pytest.mark.parametrize(
    ("vendor", "amx", "avx512_bf16", "cap", "dtype"),
    [
        (INTEL, True, True, "ALL", torch.bfloat16),  # Sapphire Rapids and later
        (INTEL, True, True, "avx512_core_amx", torch.bfloat16),
        (INTEL, True, True, "AVX512_CORE_BF16", None),  # capped below AMX: the Intel no-AMX case
        (INTEL, False, True, "ALL", None),  # AVX512-BF16 without AMX: fp32 measured 1.3-1.5x faster (issue 33)
        (AMD, False, True, "ALL", torch.bfloat16),  # Zen 4/5: bf16 measured faster (docs/benchmarks.md)
        (AMD, False, True, "AVX2", None),  # capped below bf16 instructions
        (AMD, False, False, "ALL", None),  # Zen 2/3: no bf16 instructions
        (INTEL, False, False, "ALL", None),
        ("", False, True, "ALL", None),  # vendor unknown: the Intel rule, float32
    ],
)
def test_a_cpu_computes_in_the_type_measured_faster_on_its_kind(vendor, amx, avx512_bf16, cap, dtype) -> None:
    precision = cpu_precision(vendor, amx, avx512_bf16, cap)
    assert precision.dtype == dtype, precision.why
    assert not precision.scaled


def test_the_vendor_comes_from_cpuinfo(tmp_path) -> None:
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n")
    assert cpu_vendor(str(tmp_path / "cpuinfo")) == AMD
    assert cpu_vendor(str(tmp_path / "missing")) == ""


@pytest.mark.parametrize(
    ("workload", "capability", "dtype"),
    [
        ("imagenet", (7, 0), torch.float16),
        ("imagenet", (8, 0), torch.bfloat16),
        ("imagenet", (6, 0), None),
        ("mnist", (7, 5), torch.float16),
        ("mnist", (9, 0), torch.bfloat16),
        ("mnist", (6, 1), None),
    ],
)
def test_both_fast_recipes_take_the_gpus_type_from_one_rule(monkeypatch, workload, capability, dtype) -> None:
    """The ImageNet fast recipe forced bf16 on any CUDA GPU (torch 2.2 raises on a V100, later torch emulates it);
    now both fast recipes ask the device, and the loop gets a gradient scaler exactly where float16 needs one."""
    from hpctrain.recipes import get_recipe

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    cuda = torch.device("cuda", 0)
    recipe = get_recipe(workload, "fast")
    assert recipe.precision(cuda).dtype == dtype
    assert (grad_scaler(recipe.precision(cuda), torch.device("cpu")) is not None) is (dtype == torch.float16)
    assert get_recipe(workload, "classic").precision(cuda).dtype is None  # the tutorials' float32


def test_the_mnist_model_autocasts_to_the_recipes_type(monkeypatch) -> None:
    """FastNet autocasts inside forward (DataParallel replicas do too) to the type the recipe reports."""
    from hpctrain.recipes import mnist

    seen = []
    monkeypatch.setattr(mnist, "precision_for", lambda device: Precision(torch.bfloat16, "test"))
    model = mnist.FastNet((8, 24, 64))
    model.head.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    assert model(torch.randn(2, 1, 28, 28)).dtype == torch.float32  # float32 logits out
    assert seen == [torch.bfloat16]


# A start-up file (Python imports `sitecustomize` first): every hpctrain process computes the fast recipe in float16
# on the CPU, so that the loop's float16 path (scaler, its checkpointed state) runs here; no V100 in CI.
FP16_HOOK = """
import torch
import hpctrain.training.precision as precision

precision.precision_for = lambda device: precision.Precision(torch.float16, "fp16 with gradient scaling (test hook)")
"""


def fp16_env(tmp_path: Path) -> dict[str, str]:
    hook = tmp_path / "fp16_hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FP16_HOOK)
    return {"PYTHONPATH": os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])}


@pytest.mark.skipif(not hasattr(torch.amp, "GradScaler"), reason="torch < 2.3 has no gradient scaler for the CPU")
def test_float16_training_scales_gradients_and_resumes_exactly(fashion_data_dir, tmp_path) -> None:
    env = fp16_env(tmp_path)
    common = ["train", "mnist", *QUICK, "--epochs", "2", "--data-dir", str(fashion_data_dir)]
    whole = ok(hpctrain(*common, "--run-dir", str(tmp_path / "whole"), env=env))
    assert "fp16 with gradient scaling (test hook)" in whole.stdout, whole.stdout
    status, output = signal_after(
        [*common, "--run-dir", str(tmp_path / "cut")], "epoch 1/2 step 2/", signal.SIGUSR1, env=env
    )
    assert status == 75, output
    ok(hpctrain(*common, "--run-dir", str(tmp_path / "cut"), "--resume", env=env))
    assert_bitwise_equal(final_weights(tmp_path / "whole"), final_weights(tmp_path / "cut"))
    from hpctrain import checkpoint
    from hpctrain.training.rundir import checkpoint_dir

    state = checkpoint.load(checkpoint.find_latest(checkpoint_dir(tmp_path / "whole")).path)
    assert state["scaler"]["scale"] > 0  # the loss scale travels with the checkpoint
