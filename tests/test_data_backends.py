"""The GPU-decode data backends (``--data-backend dali|nvjpeg``) and the choice between backends, on real JPEGs.

No GPU here: the backends run their CPU variants (DALI's ``device="cpu"`` decoder in a real DALI pipeline with its
real parallel Python workers; torchvision's decode_jpeg on the CPU device), which share every line with the GPU
variants except the decoder's device. What only a GPU can show (nvJPEG/mixed decoding, speed) is measured by
benchmarks/imagenet_gpu.py when a GPU is lent.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from image_fixtures import fashion_folders, interrupt, photo_folders, train  # noqa: F401
from training_helpers import assert_bitwise_equal, clean_environ, final_weights

from hpctrain.data.backends import choose_backend, make_loader
from hpctrain.data.imagefolder import find_image_folders
from hpctrain.data.loader import IGNORE_LABEL, ImageFolderSource, LoaderConfig, to_device
from hpctrain.data.sampler import EpochPlan
from hpctrain.data.transforms import CenterCrop, RandomResizedCrop
from hpctrain.errors import UserError

GPU_BACKENDS = ("dali", "nvjpeg")
TRAIN_CROP = RandomResizedCrop(size=(64, 64))
EVAL_CROP = CenterCrop(size=(56, 56), resize=64)
CPU = torch.device("cpu")


def _loader(backend: str, data: Path, workers: int = 0, skip: bool = False):
    found = find_image_folders(data)
    config = LoaderConfig(workers=workers, skip_bad_images=skip)
    return make_loader(choose_backend(backend, "cpu"), found.train, found.val, config, 3, TRAIN_CROP, EVAL_CROP, CPU)


def _images(batches) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(b.images.clone(), b.labels.clone()) for b in batches]


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_first_batches_match_the_cpu_backend(photo_folders: Path, backend: str) -> None:
    """Same samples, same crops, same flips, same normalization; pixels close but not equal, because the decoders
    differ: the cpu backend decodes JPEGs at a reduced DCT scale (1/2 to 1/8) and resizes with OpenCV, DALI and
    nvJPEG decode the crop at full size and resize with their own antialiased linear filters. Measured: 1-8 levels
    mean absolute difference per image (the photo folders include CMYK, grayscale and PNG files); a wrong crop or
    a wrong flip gives several tens."""
    plan = EpochPlan(len(find_image_folders(photo_folders).train), 16, 1, 3)
    reference, other = _loader("cpu", photo_folders), _loader(backend, photo_folders)
    assert type(reference) is ImageFolderSource and type(other) is not ImageFolderSource
    pairs = [
        (next(iter(source.train_batches(plan, 1, 0, 0))), next(iter(source.eval_batches(1, 0, 16))))
        for source in (other, reference)
    ]
    for ours, theirs in zip(*pairs):
        assert ours.images.dtype == torch.uint8 and ours.images.shape == theirs.images.shape
        assert torch.equal(ours.labels, theirs.labels)
        ours_f, theirs_f = ours.images.float(), theirs.images.float()
        difference = (ours_f - theirs_f).abs().mean(dim=(1, 2, 3))
        mirrored = (ours_f - theirs_f.flip(2)).abs().mean(dim=(1, 2, 3))
        assert difference.max() < 12 and difference.mean() < 5, difference
        asymmetric = (theirs_f - theirs_f.flip(2)).abs().mean(dim=(1, 2, 3)) > 15
        assert asymmetric.sum() >= 4 and (difference[asymmetric] < mirrored[asymmetric]).all(), "flips differ"
        x, y = to_device(ours.images, CPU), to_device(theirs.images, CPU)
        assert x.shape == (len(ours.labels), 3, *ours.images.shape[1:3]) and x.dtype == torch.float32
        assert x.is_contiguous(memory_format=torch.channels_last)
        assert (x - y).abs().mean() < 5 / 255 / 0.224 and abs(x.mean() - y.mean()) < 0.05


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_resumed_pass_reads_the_same_batches_bitwise_with_two_workers(fashion_folders: Path, backend: str) -> None:
    """A pass started at step 4 with 2 worker processes yields exactly steps 4.. of an uninterrupted pass made
    without workers, on both ranks of 2: the batches depend on (seed, epoch, step, rank) only."""
    plan = EpochPlan(300, 32, 2, 3)
    whole = {rank: _images(_loader(backend, fashion_folders).train_batches(plan, 1, 0, rank)) for rank in (0, 1)}
    for rank in (0, 1):
        resumed = _images(_loader(backend, fashion_folders, workers=2).train_batches(plan, 1, 4, rank))
        assert len(resumed) == plan.steps_per_epoch - 4 == len(whole[rank]) - 4
        for (images, labels), (expected_images, expected_labels) in zip(resumed, whole[rank][4:]):
            assert torch.equal(images, expected_images) and torch.equal(labels, expected_labels)
    assert not torch.equal(whole[0][4][0], whole[1][4][0])  # the ranks read different samples


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_validation_scores_every_image_once_on_one_and_two_ranks(fashion_folders: Path, backend: str) -> None:
    """100 validation images, batches of 16: on 2 ranks (50 each, the last batch short) the images and labels are
    exactly the 1-rank pass's, rank r holding images r, r + 2, ..."""
    val = find_image_folders(fashion_folders).val
    alone = _images(_loader(backend, fashion_folders).eval_batches(1, 0, 16))
    images = torch.cat([b[0] for b in alone])
    labels = torch.cat([b[1] for b in alone])
    assert len(labels) == 100 and torch.equal(labels, torch.from_numpy(val.labels))
    for rank in (0, 1):
        shard = _images(_loader(backend, fashion_folders, workers=1).eval_batches(2, rank, 16))
        assert [len(b[1]) for b in shard] == [16, 16, 16, 2]
        assert torch.equal(torch.cat([b[0] for b in shard]), images[rank::2])
        assert torch.equal(torch.cat([b[1] for b in shard]), labels[rank::2])


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_unreadable_image_is_named_or_skipped(photo_folders: Path, tmp_path: Path, backend: str) -> None:
    data = tmp_path / "data"
    subprocess.run(["cp", "-r", str(photo_folders), str(data)], check=True)
    bad = data / "val" / "n0002_color" / "broken.JPEG"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(UserError, match=rf"{bad}: cannot decode this image .*--skip-bad-images"):
        list(_loader(backend, data).eval_batches(1, 0, 8))
    batches = _loader(backend, data, skip=True).eval_batches(1, 0, 8)
    found = list(batches)
    assert batches.bad_images == [str(bad)]
    slot = list(find_image_folders(data).val.paths).index(str(bad))
    batch = found[slot // 8]
    assert batch.labels[slot % 8] == IGNORE_LABEL and not batch.images[slot % 8].any()
    assert sum(int((b.labels != IGNORE_LABEL).sum()) for b in found) == len(find_image_folders(data).val) - 1


def test_backend_choice() -> None:
    """auto picks cpu without a CUDA device; dali/nvjpeg asked for there run their CPU variants and say so. The
    CUDA rows are the pure decision only (no GPU here); DALI is installed in this environment."""
    assert choose_backend("auto", "cpu").name == "cpu"
    assert "training runs on cpu" in choose_backend("auto", "cpu").why
    for backend in GPU_BACKENDS:
        choice = choose_backend(backend, "cpu")
        assert choice.name == backend and "meant for CUDA GPUs" in choice.why
    assert choose_backend("auto", "cuda", prove=lambda name: None).name == "dali"
    assert choose_backend("nvjpeg", "cuda").why == "as asked: JPEGs are decoded on the GPU"
    with pytest.raises(UserError, match="choose one of auto, cpu, dali, nvjpeg"):
        choose_backend("opencv", "cpu")


def test_dali_training_resumes_mid_epoch_bitwise_and_auto_says_cpu(fashion_folders: Path, tmp_path: Path) -> None:
    """The whole loop on the dali backend (CPU decoder, 2 DALI worker processes): stopped by a signal inside epoch 1
    and resumed, the final weights equal an uninterrupted run's; and the startup line names the backend."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    options = ["-j", "2", "--data-backend", "dali", "--train-limit", "192", "--test-limit", "20"]  # 6 steps/epoch
    first = train(fashion_folders, whole, "--epochs", "2", *options)
    assert "data backend dali (as asked, but decoding on the CPU: this backend is meant for CUDA GPUs" in first.stdout
    status, output = interrupt(fashion_folders, parts, *options)
    assert status == 75, output
    [checkpoint] = (parts / "checkpoints").glob("checkpoint_step_*.pt")
    assert 3 <= int(checkpoint.stem.rsplit("_", 1)[1]) < 6, "stopped inside the first epoch"
    train(fashion_folders, parts, "--epochs", "2", "--resume", *options)
    assert_bitwise_equal(final_weights(whole), final_weights(parts))
    auto = train(
        fashion_folders, tmp_path / "auto", "--epochs", "1", "-j", "0", "--train-limit", "32", "--test-limit", "10"
    )
    assert "hpctrain: data backend cpu (auto: training runs on cpu" in auto.stdout


def test_missing_dali_names_the_pip_command_and_help_never_imports_it(fashion_folders: Path, tmp_path: Path) -> None:
    """DALI made unimportable in a child process (sys.modules entry None, as for a package that is not installed)."""
    major = (torch.version.cuda or "12").split(".")[0]
    run_dir = tmp_path / "run"
    code = (
        "import sys; sys.modules['nvidia.dali'] = None; from hpctrain.cli import main; "
        f"sys.exit(main(['train', 'imagenet', {str(fashion_folders)!r}, '--data-backend', 'dali', "
        f"'--run-dir', {str(run_dir)!r}]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=clean_environ(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr
    assert f"pip install nvidia-dali-cuda{major}0" in result.stderr and "Traceback" not in result.stderr
    assert not run_dir.exists()
    code = (
        "import sys; from hpctrain.cli import main\ntry: main(['train', '--help'])\nexcept SystemExit: pass\n"
        "assert 'nvidia.dali' not in sys.modules and 'hpctrain.data.backends.dali' not in sys.modules"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=clean_environ(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "--data-backend" in result.stdout, result.stderr


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_jpeg_with_a_good_header_and_truncated_data(photo_folders: Path, tmp_path: Path, backend: str) -> None:
    """The header parses, the data stops early. nvjpeg hands the sample to the CPU decoder, so --skip-bad-images
    skips it as the cpu backend does; DALI cannot skip a sample inside its batch, so the pass stops with an error
    naming the file (found by the CPU decoder) and the way around."""
    data = tmp_path / "data"
    subprocess.run(["cp", "-r", str(photo_folders), str(data)], check=True)
    folder = data / "val" / "n0002_color"
    bad = folder / "truncated.JPEG"
    bad.write_bytes(sorted(folder.iterdir())[0].read_bytes()[:3000])
    if backend == "dali":
        with pytest.raises(UserError, match=rf"{bad}: NVIDIA DALI cannot decode this image.*--data-backend cpu"):
            list(_loader(backend, data, skip=True).eval_batches(1, 0, 8))
        return
    with pytest.raises(UserError, match=rf"{bad}: cannot decode this image"):
        list(_loader(backend, data).eval_batches(1, 0, 8))
    batches = _loader(backend, data, skip=True).eval_batches(1, 0, 8)
    list(batches)
    assert batches.bad_images == [str(bad)]


def test_what_dali_pickles_to_each_spawned_worker_grows_with_the_paths_bytes_not_the_longest_path() -> None:
    """DALI starts its Python workers with spawn on a GPU and pickles the feed (the whole image list with it) to each
    of them, once per pass. Synthetic ImageNet-like listing, one long path among them: what is pickled must be about
    the paths' UTF-8 bytes plus a few 8-byte numbers per sample (offset, label, this pass's index), whereas a
    fixed-width unicode array costs 4 bytes x the longest path for every sample (here ~25 times more)."""
    import pickle

    import numpy as np

    from hpctrain.data.backends.dali import DaliFeed
    from hpctrain.data.backends.encoded import RequestTable
    from hpctrain.data.imagefolder import ImageSet
    from hpctrain.data.packed import PackedStrings

    n = 20_000
    paths = [f"/datasets/imagenet/train/n{i % 1000:08d}/n{i % 1000:08d}_{i}.JPEG" for i in range(n)]
    paths[n // 2] = "/datasets/imagenet/train/" + "deep/" * 60 + "long.JPEG"
    images = ImageSet(
        "/datasets/imagenet/train",
        PackedStrings.of(paths),
        np.arange(n, dtype=np.int64) % 1000,
        tuple(f"n{c:08d}" for c in range(1000)),
    )
    table = RequestTable.of(1, [tuple(range(start, min(start + 256, n))) for start in range(0, n, 256)])
    feed = DaliFeed(images, TRAIN_CROP, 3, table)
    path_bytes = sum(len(p.encode()) for p in paths)
    pickled = len(pickle.dumps(feed))
    assert pickled <= path_bytes + 32 * n + 64 * 1024, (pickled, path_bytes)
    clone = pickle.loads(pickle.dumps(feed))
    assert clone.images.name(n // 2) == paths[n // 2] and clone.images.name(7) == paths[7]


def _old_crop_resize(picture: torch.Tensor, box: list[int], size: tuple[int, int]) -> torch.Tensor:
    """The nvjpeg backend's former per-image path (a dozen tensor operations per image), the reference."""
    top, left, height, width, flip = box
    patch = picture[:, top : top + height, left : left + width].unsqueeze(0).float()
    resized = torch.nn.functional.interpolate(patch, size=size, mode="bilinear", antialias=True, align_corners=False)[0]
    if flip:
        resized = resized.flip(-1)
    return resized.permute(1, 2, 0).round_().clamp_(0, 255).to(torch.uint8)


def _random_crops(count: int, seed: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Images of assorted sizes (smooth, like photographs, plus noise) and crop boxes, shrinking and enlarging."""
    gen = torch.Generator().manual_seed(seed)
    pictures, boxes = [], []
    for _ in range(count):
        h, w = (int(v) for v in torch.randint(20, 160, (2,), generator=gen))
        smooth = torch.nn.functional.interpolate(
            torch.rand(1, 3, 6, 6, generator=gen) * 255, size=(h, w), mode="bicubic", align_corners=False
        )[0]
        pictures.append((smooth + torch.randn(3, h, w, generator=gen) * 20).round().clamp(0, 255).to(torch.uint8))
        ch, cw = (int(torch.randint(1, side + 1, (1,), generator=gen)) for side in (h, w))
        top, left = (
            int(torch.randint(0, h - ch + 1, (1,), generator=gen)),
            int(torch.randint(0, w - cw + 1, (1,), generator=gen)),
        )
        boxes.append((top, left, ch, cw, int(torch.randint(0, 2, (1,), generator=gen))))
    return pictures, torch.tensor(boxes, dtype=torch.int64)


def test_nvjpeg_batched_crop_resize_equals_the_per_image_path() -> None:
    """The batched resize (two matrix products with torch's antialiasing weights) against the former per-image
    F.interpolate path: the same pixels, except a value on a rounding tie (x.5) may land one level apart (the sums
    run in another order)."""
    from hpctrain.data.backends import nvjpeg

    pictures, boxes = _random_crops(40, seed=5)
    size = (32, 48)
    batched = nvjpeg.crop_resize_batch(pictures, boxes, size)
    reference = torch.stack([_old_crop_resize(p, b, size) for p, b in zip(pictures, boxes.tolist())])
    difference = (batched.int() - reference.int()).abs()
    assert difference.max() <= 1
    assert (difference == 0).float().mean() > 0.999


def test_nvjpeg_batched_crop_resize_groups_images_to_bound_the_padding(monkeypatch: pytest.MonkeyPatch) -> None:
    from hpctrain.data.backends import nvjpeg

    pictures, boxes = _random_crops(12, seed=6)
    whole = nvjpeg.crop_resize_batch(pictures, boxes, (24, 24))
    monkeypatch.setattr(nvjpeg, "PADDED_BYTES", 160 * 160 * 3 * 4 * 2)  # two of the largest images per group
    shapes = [tuple(p.shape[1:]) for p in pictures]
    groups = nvjpeg._size_groups(shapes)
    assert len(groups) > 1 and sorted(i for g in groups for i in g) == list(range(12))
    for group in groups:
        assert (
            len(group) * max(shapes[i][0] for i in group) * max(shapes[i][1] for i in group) * 12 <= nvjpeg.PADDED_BYTES
        )
    assert torch.equal(nvjpeg.crop_resize_batch(pictures, boxes, (24, 24)), whole)


def test_nvjpeg_crop_resize_makes_as_many_torch_calls_for_64_images_as_for_4() -> None:
    """The training thread's work per batch must not grow with the batch size in Python: counted here as the torch
    functions called from Python (each a kernel launch or more on a GPU), for 4 and for 64 images. Reading a
    tensor's attributes (`.shape`: each image's size, once per image) launches nothing and is not counted."""
    from torch.overrides import TorchFunctionMode

    from hpctrain.data.backends import nvjpeg

    class CountCalls(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") != "__get__":
                CountCalls.calls += 1
            return func(*args, **(kwargs or {}))

    counts = []
    for count in (4, 64):
        pictures, boxes = _random_crops(count, seed=count)
        CountCalls.calls = 0
        with CountCalls():
            nvjpeg.crop_resize_batch(pictures, boxes, (32, 32))
        counts.append(CountCalls.calls)
    assert counts[0] == counts[1]


def proven_except(*failing: str):
    """A stand-in for the GPU proof (no GPU here): the backends named fail their test decode."""
    tried = []

    def prove(name: str) -> str | None:
        tried.append(name)
        return "its test decode failed: CUDA error: no kernel image is available" if name in failing else None

    return prove, tried


@pytest.mark.parametrize(
    ("version", "failing", "chosen", "tried", "said"),
    [
        ("2.4.0", (), "dali", ["dali"], "auto: NVIDIA DALI 2.4.0 decoded its test JPEGs right on this GPU"),
        # NGC PyTorch 24.05 ships DALI 1.37: its fn.decoders.image_slice has no adjust_orientation argument
        (
            "1.37.0",
            (),
            "nvjpeg",
            ["nvjpeg"],
            "auto: NVIDIA DALI 1.37.0 is older than 2.0, whose decoder arguments the "
            "dali backend uses; nvjpeg decoded its test JPEGs right on this GPU",
        ),
        (
            "2.4.0",
            ("dali",),
            "nvjpeg",
            ["dali", "nvjpeg"],
            "auto: dali on this GPU: its test decode failed: CUDA error: no kernel image is available; nvjpeg decoded",
        ),
        ("2.4.0", ("dali", "nvjpeg"), "cpu", ["dali", "nvjpeg"], "; data worker processes decode on the CPU"),
        (None, (), "nvjpeg", ["nvjpeg"], "auto: NVIDIA DALI is not installed (pip install nvidia-dali-cuda"),
    ],
)
def test_auto_picks_only_a_checked_dali_and_a_backend_proven_on_the_gpu(
    monkeypatch, version, failing, chosen, tried, said
) -> None:
    """auto took DALI whenever it imported on a CUDA device, whatever its version, and never checked a GPU decode."""
    from hpctrain.data import backends

    monkeypatch.setattr(backends, "dali_version", lambda: version)
    prove, seen = proven_except(*failing)
    choice = choose_backend("auto", "cuda", prove=prove)
    assert (choice.name, seen) == (chosen, tried)
    assert said in choice.why, choice.why
    assert "\n" not in choice.describe()


def test_an_old_dali_asked_for_is_refused_with_the_upgrade(monkeypatch) -> None:
    from hpctrain.data import backends

    monkeypatch.setattr(backends, "dali_version", lambda: "1.37.0")
    with pytest.raises(
        UserError,
        match=r"needs NVIDIA DALI >= 2.0 \(its decoder arguments\), and 1.37.0 is "
        r"installed: pip install -U nvidia-dali-cuda",
    ):
        choose_backend("dali", "cuda")


@pytest.mark.parametrize("backend", ["nvjpeg", "dali"])
def test_the_gpu_proof_passes_on_the_cpu_variants_and_catches_a_wrong_decode(monkeypatch, backend) -> None:
    """The proof's own decoders, run on the CPU (torchvision's CPU decode_jpeg; DALI's CPU pipeline with the dali
    backend's decoder arguments): right pixels pass; a decoder that returns another image fails, in one phrase."""
    import torch

    from hpctrain.data.backends import proof

    assert proof.prove(backend, torch.device("cpu")) is None
    real = proof.DECODERS[backend]
    monkeypatch.setitem(proof.DECODERS, backend, lambda jpegs, device: [255 - p for p in real(jpegs, device)])
    assert "differs from Pillow's by" in proof.prove(backend, torch.device("cpu"))
    monkeypatch.setitem(proof.DECODERS, backend, lambda jpegs, device: 1 / 0)
    assert proof.prove(backend, torch.device("cpu")) == "its test decode failed: division by zero"
