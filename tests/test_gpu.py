"""Every CUDA path once, on a real GPU: skipped where torch sees none (CI has none; run them with
`bash benchmarks/gpu_check.sh` on a GPU machine). Each test is a real `hpctrain` command, as a user runs it.

What each covers: NCCL process-group init (device_id) and the stop vote on an NCCL default group (the library
example under torchrun); DDP and DataParallel on GPUs; bf16 autocast and channels_last (the fast recipes); the
dataset held on the GPU (mnist); pinned copies in the asynchronous checkpointer and CUDA RNG state in checkpoints
(every resume test); `hpctrain env`; imagenet's transfers with each data backend (cpu workers, nvjpeg's GPU
decode_jpeg, dali's mixed decoder with spawn workers). Issue 33 added the last five: the GPU's native autocast type
and fp16 with a gradient scaler, auto's proven backend, nvjpeg on its own stream against the CPU decoder, the
forward clock under DataParallel and NCCL collectives keeping no tensors.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from image_fixtures import TINY, photo_folders  # noqa: F401
from training_helpers import QUICK, assert_bitwise_equal, clean_environ, final_weights, hpctrain, ok, signal_after

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

EXAMPLE = Path(__file__).parents[1] / "examples" / "ddp_user_script.py"
GPU_QUICK = [*QUICK, "--threads", "4"]  # the last --threads counts: the GPU run's input side is not the test


def gpus() -> int:
    return torch.cuda.device_count()


def resolved(run_dir: Path) -> dict:
    import yaml

    return yaml.safe_load((run_dir / "config.yaml").read_text())["resolved"]


def worst_difference(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].is_floating_point())


@pytest.mark.parametrize("recipe", ["fast", "classic"])
def test_mnist_recipes_train_on_one_gpu(fashion_data_dir, tmp_path, recipe):
    run = tmp_path / "run"
    result = ok(
        hpctrain(
            "train",
            "mnist",
            *GPU_QUICK,
            "--recipe",
            recipe,
            "--epochs",
            "1",
            "--device",
            "cuda",
            "--data-dir",
            str(fashion_data_dir),
            "--run-dir",
            str(run),
        )
    )
    assert resolved(run)["device"].startswith("cuda")
    assert "replayed as CUDA graphs" in result.stdout + result.stderr  # issue 43: one launch per step
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    # It learned, on the GPU: 8 steps on 512 images reach about 40-55% (chance: 10%; the CPU gives 53.6%, an H200
    # gave 41% for the classic recipe).
    assert record["test_accuracy"] > 0.25


@pytest.mark.parametrize(
    "signum, recipe", [(signal.SIGUSR1, "fast"), (signal.SIGTERM, "fast"), (signal.SIGUSR1, "classic")]
)
def test_exact_resume_on_one_gpu(fashion_data_dir, tmp_path, signum, recipe):
    """The GPU contract: with a fixed seed, a run stopped mid-epoch and resumed ends with the weights of an
    uninterrupted one, bitwise (the fast recipe's kernels on these sizes are deterministic; if this fails, the
    difference printed says by how much, and the README's contract must say so). Both MNIST recipes train from
    CUDA graphs here (issue 43): captured again after the resume, dropout's random offsets (classic) continuing
    from the checkpoint's CUDA random state, Adadelta's state put back from it."""
    common = ["train", "mnist", *GPU_QUICK, "--recipe", recipe, "--epochs", "2", "--device", "cuda"]
    common += ["--data-dir", str(fashion_data_dir)]
    ok(hpctrain(*common, "--run-dir", str(tmp_path / "whole")))
    status, output = signal_after([*common, "--run-dir", str(tmp_path / "cut")], "epoch 1/2 step 2/", signum)
    assert status in (75, 143), output
    ok(hpctrain(*common, "--run-dir", str(tmp_path / "cut"), "--resume"))
    whole, cut = final_weights(tmp_path / "whole"), final_weights(tmp_path / "cut")
    worst = worst_difference(whole, cut)
    if recipe == "classic":
        # cuDNN may sum the classic model's larger weight gradients in a varying order (README: GPUs), so the
        # contract is the README's: as close as two uninterrupted runs. Dropout masks drawn from the wrong random
        # offsets after the resume would put it far outside that.
        ok(hpctrain(*common, "--run-dir", str(tmp_path / "again")))
        baseline = worst_difference(whole, final_weights(tmp_path / "again"))
        assert worst <= max(10 * baseline, 1e-6), f"resumed: up to {worst:g} apart; two whole runs: {baseline:g}"
        return
    assert worst == 0.0, f"resumed weights differ by up to {worst:g}"  # an H200 (2026-11-26): 0.0, both signals
    assert_bitwise_equal(whole, cut)


@pytest.mark.parametrize("name", ["fast", "classic"])
def test_graphed_step_and_evaluation_compute_what_the_eager_ones_do(name):
    """Issue 43: the MNIST step captured as a CUDA graph and replayed trains the same weights as the eager step
    (the fast recipe: same kernels, no randomness), falls back to the eager step for a short batch, leaves the
    learning rate schedule's floats in the optimizer; the evaluation graph gives the eager logits."""
    from hpctrain.recipes.mnist import RECIPES
    from hpctrain.training.graphed import EvalGraph, StepGraph

    cuda = torch.device("cuda", 0)
    recipe = RECIPES[name]
    batch = 112 if name == "fast" else 64
    generator = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(batch, 1, 28, 28, generator=generator), torch.randint(0, 10, (batch,), generator=generator))
        for _ in range(6)
    ]
    batches.insert(0, (batches[0][0][:40], batches[0][1][:40]))  # a short batch first: eager, not captured
    batches.append((batches[1][0][:40], batches[1][1][:40]))  # and after the capture: the eager step
    batches.append(batches[1])
    runs = {}
    for graphed in (False, True):
        torch.manual_seed(0)
        model = recipe.build_model().to(cuda).train()
        optimization = recipe.build_optimization(model, 0.1 if name == "fast" else 1.0, 1, len(batches))
        graph = (
            StepGraph(model, optimization, recipe.loss, lambda: recipe.autocast(cuda), cuda, batch) if graphed else None
        )
        losses = []
        for images, labels in batches:
            images = images.to(cuda).contiguous(memory_format=torch.channels_last)
            labels = labels.to(cuda)
            loss = graph.step(images, labels) if graph is not None else None
            if loss is None:
                with recipe.autocast(cuda):
                    loss = recipe.loss(model(images), labels)
                optimization.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimization.optimizer.step()
            losses.append(float(loss))
            optimization.scheduler.step()
        assert all(isinstance(g["lr"], float) for g in optimization.optimizer.param_groups)
        if graph is not None:  # captured at the first full batch, not at the short one before it
            assert graph.graph is not None and graph.images.shape[0] == batch
        runs[graphed] = (model, losses)
    (eager, eager_losses), (replayed, graph_losses) = runs[False], runs[True]
    assert all(torch.isfinite(torch.tensor(graph_losses))), graph_losses
    if name == "fast":  # no dropout: the same arithmetic
        worst = max(
            (a - b).abs().max().item()
            for a, b in zip(eager.state_dict().values(), replayed.state_dict().values())
            if a.is_floating_point()
        )
        assert worst <= 1e-5, f"graphed weights differ from eager ones by up to {worst:g}; losses {graph_losses}"
        assert graph_losses == pytest.approx(eager_losses, rel=1e-5), (graph_losses, eager_losses)
    replayed.eval()
    test = torch.randn(500, 1, 28, 28, device=cuda).contiguous(memory_format=torch.channels_last)

    def predict(images):
        with recipe.autocast(cuda):
            return recipe.predict(replayed, images)

    evaluation = EvalGraph(predict, cuda)
    with torch.inference_mode():
        logits = evaluation(test).clone()
        assert torch.allclose(logits, predict(test), atol=1e-5)
        assert evaluation(test[:100]) is None  # another shape: the caller predicts eagerly


def test_dataparallel_over_the_gpus(fashion_data_dir, tmp_path):
    """DataParallel over every GPU of the machine; with one GPU, the refusal that names --strategy single."""
    run = tmp_path / "run"
    if gpus() < 2:
        result = hpctrain(
            "train",
            "mnist",
            *GPU_QUICK,
            "--epochs",
            "1",
            "--device",
            "cuda",
            "--strategy",
            "dp",
            "--data-dir",
            str(fashion_data_dir),
            "--run-dir",
            str(run),
        )
        assert result.returncode == 2 and "on one GPU use --strategy single" in result.stderr, result.stderr
        pytest.skip("DataParallel needs two GPUs; one GPU gave the refusal that names --strategy single")
    ok(
        hpctrain(
            "train",
            "mnist",
            *GPU_QUICK,
            "--epochs",
            "1",
            "--device",
            "cuda",
            "--strategy",
            "dp",
            "--data-dir",
            str(fashion_data_dir),
            "--run-dir",
            str(run),
        )
    )
    assert resolved(run)["strategy"] == "dp"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs one GPU per rank (it refuses two ranks on one)")
def test_ddp_over_two_gpus_with_nccl_resumes_exactly(fashion_data_dir, tmp_path):
    common = [
        "train",
        "mnist",
        *GPU_QUICK,
        "--epochs",
        "2",
        "--nproc",
        "2",
        "--device",
        "cuda",
        "--data-dir",
        str(fashion_data_dir),
    ]
    ok(hpctrain(*common, "--run-dir", str(tmp_path / "whole")))
    status, output = signal_after([*common, "--run-dir", str(tmp_path / "cut")], "epoch 1/2 step 2/", signal.SIGUSR1)
    assert status == 75, output
    ok(hpctrain(*common, "--run-dir", str(tmp_path / "cut"), "--resume"))
    assert_bitwise_equal(final_weights(tmp_path / "whole"), final_weights(tmp_path / "cut"))


def test_library_example_under_torchrun_on_nccl(tmp_path):
    """NCCL init with device_id and the stop vote (agree) on an NCCL default group: a SIGUSR1 mid-run stops every
    rank after a checkpoint, and the relaunch finishes."""
    nproc = str(min(gpus(), 2))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        nproc,
        str(EXAMPLE),
        "--run-dir",
        str(tmp_path / "run"),
        "--device",
        "cuda",
    ]
    env = {**clean_environ(), "PYTHONUNBUFFERED": "1"}
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "No backend type associated" not in first.stderr


def test_env_names_the_gpu():
    result = ok(hpctrain("env"))
    assert torch.cuda.get_device_name(0) in result.stdout


@pytest.mark.parametrize("backend", ["cpu", "nvjpeg", "dali"])
def test_imagenet_backends_on_the_gpu_resume_exactly(photo_folders, tmp_path, backend):
    """The GPU contract for imagenet (README, "Checkpoints and exact resume"): the resumed attempt continues the
    exact state, but cuDNN's kernels are not bitwise reproducible, so its weights are as close to an uninterrupted
    run's as two uninterrupted runs are to each other, not closer. On an H200 (2026-11-26) the bitwise assertion
    this test had failed: nvjpeg 7e-5; the cpu backend 98 with the fast recipe's peak rate, which made the tiny run
    diverge and amplified every difference. Hence the classic recipe at a low rate here, and the comparison with a
    second uninterrupted run. This form has not run on a GPU yet."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    common = [
        "train",
        "imagenet",
        str(photo_folders),
        *TINY,
        "--batch-size",
        "4",
        "--epochs",
        "2",
        "--device",
        "cuda",
        "--data-backend",
        backend,
        "-j",
        "2",
        "--recipe",
        "classic",
        "--lr",
        "0.01",
    ]
    for whole in ("whole", "again"):
        ok(hpctrain(*common, "--run-dir", str(tmp_path / whole), timeout=600))
    status, output = signal_after([*common, "--run-dir", str(tmp_path / "cut")], "epoch 1/2 step 2/", signal.SIGUSR1)
    assert status == 75, output
    ok(hpctrain(*common, "--run-dir", str(tmp_path / "cut"), "--resume", timeout=600))
    whole, again, cut = (final_weights(tmp_path / name) for name in ("whole", "again", "cut"))
    run_to_run, resumed = worst_difference(whole, again), worst_difference(whole, cut)
    assert resumed <= max(10 * run_to_run, 1e-6), (
        f"{backend}: resumed weights differ by up to {resumed:g}; two uninterrupted runs by {run_to_run:g}"
    )


def test_health_cuda_paths_time_the_forward_pass_and_dump_the_flight_recorder(tmp_path, monkeypatch):
    """The health package's CUDA paths, in this process: the forward-pass clock's CUDA events, the preflight's bf16
    GEMM, and NCCL's flight recorder (switched on by the variables hpctrain sets for GPU runs) dumped as the hang
    watchdog dumps it. One GPU: a world of one rank (NCCL refuses two ranks on one GPU)."""
    import pickle

    import torch.distributed as dist

    from hpctrain.training.preflight_measure import gemm_gflops
    from hpctrain.training.watch import FLIGHT_RECORDER_ENV, ForwardClock, dump_flight_recorder

    for name, value in FLIGHT_RECORDER_ENV:
        monkeypatch.setenv(name, value)
    model = torch.nn.Linear(4096, 4096).cuda()
    clock = ForwardClock(model, torch.device("cuda"))
    model(torch.randn(512, 4096, device="cuda"))
    torch.cuda.synchronize()
    assert clock.read() > 0.0
    assert gemm_gflops(torch.device("cuda"), seconds=0.5) > 1000  # any data-centre GPU: tens of TFLOP/s in bf16
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda:0"))
    try:
        tensor = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        assert dump_flight_recorder(tmp_path / "nccl-trace-rank-0")
        trace = pickle.loads((tmp_path / "nccl-trace-rank-0").read_bytes())  # torch's own dump
        assert "all_reduce" in str(trace).lower().replace("allreduce", "all_reduce"), str(trace)[:2000]
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------------- issue 33


def test_the_fast_recipes_compute_in_the_gpus_native_type(fashion_data_dir, tmp_path):
    """bf16 from sm80, fp16 with a gradient scaler on sm70/75, fp32 below (hpctrain.training.precision), said in the
    start-up line; the mnist fast recipe trains in it."""
    from hpctrain.recipes import get_recipe
    from hpctrain.training.precision import cuda_precision

    expected = cuda_precision(torch.cuda.get_device_capability(0))
    cuda = torch.device("cuda", 0)
    assert get_recipe("imagenet", "fast").precision(cuda) == expected
    assert get_recipe("mnist", "fast").precision(cuda) == expected
    result = ok(
        hpctrain(
            "train",
            "mnist",
            *GPU_QUICK,
            "--epochs",
            "1",
            "--device",
            "cuda",
            "--data-dir",
            str(fashion_data_dir),
            "--run-dir",
            str(tmp_path / "run"),
        )
    )
    assert f"cuda ({expected.why})" in result.stdout, result.stdout


def test_float16_steps_with_a_gradient_scaler_on_the_gpu():
    """The V100/T4 path on whatever GPU this is: FastNet in fp16 autocast, scaled gradients, finite losses."""
    from hpctrain.recipes.mnist import FastNet
    from hpctrain.training.precision import Precision, grad_scaler

    cuda = torch.device("cuda", 0)
    fp16 = Precision(torch.float16, "test")
    model = FastNet((8, 24, 64)).to(cuda, memory_format=torch.channels_last)
    model._precision[cuda] = fp16
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = grad_scaler(fp16, cuda)
    images, labels = torch.randn(112, 1, 28, 28, device=cuda), torch.randint(0, 10, (112,), device=cuda)
    losses = []
    for _ in range(20):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0], losses
    assert scaler.get_scale() > 0


def test_auto_picks_a_backend_proven_on_this_gpu():
    """The proof decodes test JPEGs on this GPU; auto takes dali (DALI >= 2.0 installed) or nvjpeg, never one
    that failed it."""
    from hpctrain.compat import version_tuple
    from hpctrain.data.backends import MIN_DALI, choose_backend, dali_version
    from hpctrain.data.backends.proof import prove

    cuda = torch.device("cuda", 0)
    assert prove("nvjpeg", cuda) is None
    choice = choose_backend("auto", "cuda")
    version = dali_version()
    if version is not None and version_tuple(version) >= MIN_DALI:
        assert prove("dali", cuda) is None
        assert choice.name == "dali", choice.why
    else:
        assert choice.name == "nvjpeg", choice.why
    print(choice.describe())


def test_nvjpeg_on_its_own_stream_gives_the_cpu_decoders_batches(photo_folders):
    """Decoding on a stream of its own, ordered by events with the training stream (data/backends/streams.py),
    while a training-sized matmul keeps the training stream busy: every batch matches the CPU variant's pixels
    (libjpeg-turbo) within a few levels, epoch after epoch."""
    from hpctrain.data.backends import choose_backend, make_loader
    from hpctrain.data.imagefolder import find_image_folders
    from hpctrain.data.loader import LoaderConfig
    from hpctrain.data.sampler import EpochPlan
    from hpctrain.data.transforms import CenterCrop, RandomResizedCrop

    found = find_image_folders(photo_folders)
    crops = RandomResizedCrop(size=(64, 64)), CenterCrop(size=(56, 56), resize=64)

    def batches(device):
        source = make_loader(
            choose_backend("nvjpeg", device.type), found.train, found.val, LoaderConfig(workers=2), 3, *crops, device
        )
        plan = EpochPlan(len(found.train), 4, 1, 3)
        busy = torch.randn(2048, 2048, device="cuda")
        out = []
        for epoch in range(2):
            for batch in source.train_batches(plan, epoch, 0, 0):
                busy = busy @ busy.T / 2048  # the step's kernels, queued on the training stream
                out.append(batch[0].float().cpu())
        torch.cuda.synchronize()
        return out

    gpu, cpu = batches(torch.device("cuda", 0)), batches(torch.device("cpu"))
    assert len(gpu) == len(cpu) > 0
    worst = max(float((a - b).abs().mean()) for a, b in zip(gpu, cpu))
    assert worst < 4.0, f"the GPU's batches differ from the CPU's by {worst:.2f} levels on average"


def test_forward_clock_under_dataparallel_and_no_tensors_kept_on_nccl():
    """DataParallel over every GPU (replica threads when there are two or more) times its forward pass; an NCCL
    group's collectives keep no tensors (hpctrain.distributed.collectives keeps them only for gloo on old torch)."""
    import torch.distributed as dist

    from hpctrain.distributed import all_reduce
    from hpctrain.distributed import collectives
    from hpctrain.training.watch import ForwardClock

    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
    clock = ForwardClock(model, torch.device("cuda", 0))
    wrapped = torch.nn.DataParallel(model)
    for _ in range(3):
        wrapped(torch.randn(256 * max(gpus(), 1), 1024, device="cuda"))
    torch.cuda.synchronize()
    assert clock.read() > 0.0
    clock.remove()
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=torch.device("cuda:0"))
    try:
        before = len(collectives._held)
        all_reduce(torch.ones(1 << 20, device="cuda"))
        torch.cuda.synchronize()
        assert len(collectives._held) == before
    finally:
        dist.destroy_process_group()
