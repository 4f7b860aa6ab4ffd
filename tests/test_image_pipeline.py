"""The streaming image pipeline on real files: decoding, crops as pure functions, workers, resume, eval split."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from image_fixtures import fashion_folders, photo_folders  # noqa: F401

from hpctrain.data.decode import BadImageError, _decode, decode_crop, read_image_file
from hpctrain.data.imagefolder import find_image_folders
from hpctrain.data.loader import (
    IGNORE_LABEL,
    ImageFolderSource,
    LoaderConfig,
    SyntheticSource,
    check_shared_memory,
    eval_requests,
    eval_shard,
    to_device,
)
from hpctrain.data.sampler import EpochPlan
from hpctrain.data.transforms import CenterCrop, Crop, RandomResizedCrop, center_box, random_resized_box
from hpctrain.errors import UserError

SMALL = RandomResizedCrop(size=(64, 64))
SMALL_EVAL = CenterCrop(size=(56, 56), resize=64)


def load_crop(path: str, spec, seed: int, epoch: int, index: int, out: np.ndarray) -> None:
    """A file decoded and cropped the way the loader's workers do it (read_image_file, then decode_crop)."""
    decode_crop(read_image_file(path), path, spec, seed, epoch, index, out)


def _source(data: Path, workers: int = 0, skip: bool = False, seed: int = 3) -> ImageFolderSource:
    found = find_image_folders(data)
    return ImageFolderSource(
        found.train,
        found.val,
        LoaderConfig(workers=workers, skip_bad_images=skip),
        seed,
        train_crop=SMALL,
        eval_crop=SMALL_EVAL,
    )


def _epoch(source: ImageFolderSource, plan: EpochPlan, epoch: int, start: int, rank: int) -> list:
    return [(b.images.clone(), b.labels.clone()) for b in source.train_batches(plan, epoch, start, rank)]


# --- decoding -----------------------------------------------------------------------------------------------


def test_every_format_decodes_to_rgb(photo_folders: Path) -> None:
    odd = photo_folders / "train" / "n0004_odd"
    out = {}
    for name in ("cmyk.JPEG", "gray.JPEG", "png_named.png"):
        out[name] = np.zeros((56, 56, 3), np.uint8)
        load_crop(str(odd / name), SMALL_EVAL, 0, 0, 0, out[name])
    reference = np.zeros((56, 56, 3), np.uint8)
    load_crop(str(odd / "png_named.png"), SMALL_EVAL, 0, 0, 0, reference)
    gray = out["gray.JPEG"]
    assert (gray[..., 0] == gray[..., 1]).all() and (gray[..., 1] == gray[..., 2]).all()
    assert gray.std() > 10  # a picture, not a blank
    # CMYK (Adobe-inverted as Pillow writes it) must come out as the same picture, not a negative
    assert np.abs(out["cmyk.JPEG"].astype(int) - reference).mean() < 8
    assert np.abs((255 - out["cmyk.JPEG"]).astype(int) - reference).mean() > 40


def test_reduced_size_decoding_is_used_and_matches_full_decoding(photo_folders: Path) -> None:
    from PIL import Image

    path = sorted((photo_folders / "train" / "n0001_color").iterdir())[0]
    spec = CenterCrop(size=(56, 56), resize=64)  # a 375-pixel side shown at 64: 1/4 scale suffices
    image, crop, scale = _decode(path.read_bytes(), spec, 0, 0, 0)
    assert scale[0] < 0.3 and scale[1] < 0.3 and image.shape[0] < 120
    assert crop.height * scale[0] >= 55 and crop.width * scale[1] >= 55  # still covers the output's pixels
    differences = []
    for path in sorted((photo_folders / "train").glob("n000[12]*/*")):
        for spec in (CenterCrop(), RandomResizedCrop()):
            reduced = np.zeros((224, 224, 3), np.uint8)
            load_crop(str(path), spec, 0, 0, 0, reduced)
            crop = spec.crop(*Image.open(path).size[::-1], 0, 0, 0)
            box = (crop.left, crop.top, crop.left + crop.width, crop.top + crop.height)
            full = np.asarray(Image.open(path).convert("RGB").crop(box).resize((224, 224), Image.BILINEAR))
            differences.append(np.abs(reduced.astype(int) - (full[:, ::-1] if crop.flip else full)).mean())
    assert np.mean(differences) < 3 and max(differences) < 8  # out of 255: resampling noise, same picture


def test_raw_pixels_are_cropped_in_place_with_the_geometry_of_decoded_ones(photo_folders: Path) -> None:
    """A binary PPM (`prepare --format raw`) is viewed, not decoded, and gives exactly the crops (random-resized,
    flipped, centre) that the same pixels give when decoded from a lossless PNG; a malformed one goes to Pillow,
    which names what is wrong."""
    import io

    from PIL import Image

    from hpctrain.data.decode import decode_crop

    path = sorted((photo_folders / "train" / "n0001_color").glob("*"))[0]
    with Image.open(path) as img:
        pixels = img.convert("RGB")
    encoded = {}
    for kind in ("PPM", "PNG"):
        buffer = io.BytesIO()
        pixels.save(buffer, kind)
        encoded[kind] = buffer.getvalue()
    image, _, scale = _decode(encoded["PPM"], RandomResizedCrop((32, 32)), 0, 0, 0)
    assert scale == (1.0, 1.0) and not image.flags.writeable and np.array_equal(image, np.asarray(pixels))
    for spec in (RandomResizedCrop((48, 40)), CenterCrop((56, 56), 64)):
        for index in range(8):  # flips and boxes of every size
            outs = {kind: np.zeros((*spec.size, 3), np.uint8) for kind in encoded}
            for kind, data in encoded.items():
                decode_crop(data, kind, spec, 5, 1, index, outs[kind])
            assert np.array_equal(outs["PPM"], outs["PNG"]) and outs["PPM"].std() > 10
    with pytest.raises(BadImageError, match="truncated.ppm"):
        decode_crop(encoded["PPM"][:-7], "truncated.ppm", CenterCrop((8, 8), 8), 0, 0, 0, np.zeros((8, 8, 3), np.uint8))


def test_validation_crop_matches_torchvision_resize_center_crop(photo_folders: Path) -> None:
    import torchvision.transforms as T
    from PIL import Image

    classic = T.Compose([T.Resize(256), T.CenterCrop(224)])
    differences = []
    for path in sorted((photo_folders / "val").glob("*/*")):  # RGB, grayscale, CMYK JPEGs and a PNG
        ours = np.zeros((224, 224, 3), np.uint8)
        load_crop(str(path), CenterCrop(), 0, 0, 0, ours)
        theirs = np.asarray(classic(Image.open(path).convert("RGB")))
        differences.append(np.abs(ours.astype(int) - theirs).mean())
    assert np.mean(differences) < 5 and max(differences) < 12  # out of 255: resampling noise, same picture


def test_corrupt_image_error_names_the_file(photo_folders: Path, tmp_path: Path) -> None:
    bad = tmp_path / "truncated.JPEG"
    bad.write_bytes((photo_folders / "train" / "n0004_odd" / "gray.JPEG").read_bytes()[:1500])
    with pytest.raises(BadImageError, match=rf"{bad}: cannot decode this image .*--skip-bad-images"):
        load_crop(str(bad), SMALL, 0, 0, 0, np.zeros((64, 64, 3), np.uint8))
    text = tmp_path / "not_an_image.jpg"
    text.write_text("hello")
    with pytest.raises(BadImageError, match=rf"{text}: cannot decode this image"):
        load_crop(str(text), SMALL, 0, 0, 0, np.zeros((64, 64, 3), np.uint8))


# --- crop parameters ----------------------------------------------------------------------------------------


def test_random_resized_crop_bounds_and_torchvision_fallback() -> None:
    rng = np.random.default_rng(0)
    fractions = []
    for _ in range(2000):
        top, left, h, w = random_resized_box(375, 500, (0.08, 1.0), (3 / 4, 4 / 3), rng)
        assert 0 <= top and top + h <= 375 and 0 <= left and left + w <= 500
        if (h, w) != (375, 500):
            assert 3 / 4 - 0.02 < w / h < 4 / 3 + 0.02
            fractions.append(h * w / (375 * 500))
    assert min(fractions) < 0.12 and max(fractions) > 0.9  # the whole scale range is used
    import torchvision.transforms as T

    cases = [
        (10, 1000, (0.08, 1.0), (3 / 4, 4 / 3)),
        (1000, 10, (0.08, 1.0), (3 / 4, 4 / 3)),
        (20, 20, (0.9, 1.0), (5.0, 6.0)),
        (30, 40, (1.5, 2.0), (3 / 4, 4 / 3)),
    ]
    for height, width, scale, ratio in cases:  # no try can succeed: torchvision's deterministic fallback
        expected = T.RandomResizedCrop.get_params(torch.zeros(1, height, width), list(scale), list(ratio))
        assert random_resized_box(height, width, scale, ratio, np.random.default_rng(1)) == tuple(expected)


def test_center_box_is_resize_then_center_crop() -> None:
    assert center_box(375, 500, 256, (224, 224)) == Crop(23, 86, 328, 328)  # 224 * 375/256 = 328, centred
    assert center_box(256, 256, 256, (224, 224)) == Crop(16, 16, 224, 224)


def test_crop_is_a_pure_function_of_seed_epoch_index() -> None:
    spec = RandomResizedCrop()
    assert spec.crop(375, 500, 1, 2, 3) == spec.crop(375, 500, 1, 2, 3)
    crops = {spec.crop(375, 500, 1, epoch, index) for epoch in range(3) for index in range(50)}
    assert len(crops) == 150
    assert {c.flip for c in crops} == {True, False}


# --- the loader ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_batches_identical_with_0_1_2_workers_and_from_mid_epoch(photo_folders: Path) -> None:
    plan = EpochPlan(num_samples=len(find_image_folders(photo_folders).train), global_batch=8, world_size=2, seed=3)
    for rank in range(2):
        reference = _epoch(_source(photo_folders, workers=0), plan, 1, 0, rank)
        assert len(reference) == plan.steps_per_epoch
        for workers in (1, 2):
            assert _same(_epoch(_source(photo_folders, workers=workers), plan, 1, 0, rank), reference)
        resumed = _epoch(_source(photo_folders, workers=2), plan, 1, 2, rank)  # restart at step 2 of epoch 1
        assert _same(resumed, reference[2:])
    other_epoch = _epoch(_source(photo_folders, workers=0), plan, 2, 0, 0)
    assert not torch.equal(other_epoch[0][0], _epoch(_source(photo_folders), plan, 1, 0, 0)[0][0])


def test_batch_content_matches_the_plan_and_crops(photo_folders: Path) -> None:
    found = find_image_folders(photo_folders)
    plan = EpochPlan(len(found.train), global_batch=6, world_size=3, seed=3)
    order = plan.order(0)
    batches = list(_source(photo_folders, seed=3).train_batches(plan, 0, 1, 2))
    indices = plan.rank_indices(order, 1, 2).tolist()
    assert batches[0].images.shape == (2, 64, 64, 3) and batches[0].images.dtype == torch.uint8
    assert batches[0].labels.tolist() == found.train.labels[indices].tolist()
    expected = np.zeros((64, 64, 3), np.uint8)
    load_crop(str(found.train.paths[indices[1]]), SMALL, 3, 0, indices[1], expected)
    assert (batches[0].images[1].numpy() == expected).all()


@pytest.mark.parametrize("workers", [0, 1])
def test_corrupt_image_stops_the_epoch_naming_it_or_is_skipped(
    photo_folders: Path, tmp_path: Path, workers: int
) -> None:
    data = tmp_path / "data"
    shutil.copytree(photo_folders / "train", data / "train")
    bad = data / "train" / "n0002_color" / "broken.JPEG"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    found = find_image_folders(data)
    plan = EpochPlan(len(found.train), global_batch=4, world_size=1, seed=0)
    with pytest.raises(UserError, match=rf"{bad}: cannot decode this image .*--skip-bad-images"):
        list(_source(data, workers=workers).train_batches(plan, 0, 0, 0))
    batches = _source(data, workers=workers, skip=True).train_batches(plan, 0, 0, 0)
    seen = [(b.images, b.labels) for b in batches]
    assert batches.bad_images == [str(bad)]
    bad_index = list(found.train.paths).index(str(bad))
    order = plan.order(0).tolist()
    step, slot = divmod(order.index(bad_index), 4)
    assert seen[step][1][slot] == IGNORE_LABEL and seen[step][0][slot].max() == 0
    assert sum((labels == IGNORE_LABEL).sum().item() for _, labels in seen) == 1


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_validation_scores_every_image_once(fashion_folders: Path, world_size: int) -> None:
    source = _source(fashion_folders, workers=1)
    assert source.val is not None and len(source.val) == 100
    labels, images = [], []
    for rank in range(world_size):
        batches = list(source.eval_batches(world_size, rank, batch_size=16))
        assert sum(len(b.labels) for b in batches) == len(eval_shard(100, world_size, rank))
        labels.append(torch.cat([b.labels for b in batches]))
        images.append(torch.cat([b.images for b in batches]))
    # interleave back: rank r held samples r, r + W, ...; together they must be the dataset, each once
    merged = torch.empty(100, dtype=torch.int64)
    merged_images = torch.empty(100, 56, 56, 3, dtype=torch.uint8)
    for rank in range(world_size):
        merged[rank::world_size] = labels[rank]
        merged_images[rank::world_size] = images[rank]
    assert merged.tolist() == source.val.labels.tolist()
    single = torch.cat([b.images for b in _source(fashion_folders).eval_batches(1, 0, 100)])
    assert torch.equal(merged_images, single)


def test_eval_split_arithmetic() -> None:
    for n in (0, 1, 7, 100):
        for world in (1, 2, 3, 5):
            shards = [list(eval_shard(n, world, r)) for r in range(world)]
            assert sorted(i for s in shards for i in s) == list(range(n))
            requests = [r for rank in range(world) for r in eval_requests(n, world, rank, 4)]
            assert sorted(i for r in requests for i in r.indices) == list(range(n))
            assert all(0 < len(r.indices) <= 4 for r in requests)


def test_shared_memory_check(tmp_path: Path) -> None:
    stats = os.statvfs(tmp_path)
    available = stats.f_bavail * stats.f_frsize
    batch = int(available / (3 * 2.5))  # 2 workers' queues fit, 3 do not
    config = LoaderConfig(workers=3, prefetch_factor=2, shm_path=str(tmp_path))
    with pytest.raises(
        UserError,
        match=rf"{tmp_path} has [\d.]+ [KMGT]?i?B free, but 1 process\(es\) x 3 data workers x 3 "
        r"batches .* use fewer data workers \(--workers 2\), .*--shm-size",
    ):
        check_shared_memory(batch, config)
    check_shared_memory(batch, LoaderConfig(workers=2, prefetch_factor=2, shm_path=str(tmp_path)))
    check_shared_memory(10 * available, LoaderConfig(workers=0, shm_path=str(tmp_path)))  # no workers, no shm
    with pytest.raises(UserError, match=r"4 process\(es\) .* use a smaller per-process batch.*emptyDir"):
        check_shared_memory(available // 5, LoaderConfig(workers=1, processes_per_node=4, shm_path=str(tmp_path)))


def test_loader_refuses_to_start_workers_without_shared_memory(fashion_folders: Path, tmp_path: Path) -> None:
    found = find_image_folders(fashion_folders)
    available = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    side = int((available / 3 / 2) ** 0.5) + 1  # one 2-image batch of side x side x 3 overflows
    source = ImageFolderSource(
        found.train,
        found.val,
        LoaderConfig(workers=1, shm_path=str(tmp_path)),
        0,
        train_crop=RandomResizedCrop(size=(side, side)),
    )
    with pytest.raises(UserError, match="--shm-size"):
        source.train_batches(EpochPlan(len(found.train), 2, 1, 0), 0, 0, 0)


def test_synthetic_source() -> None:
    source = SyntheticSource(num_train=1000, num_val=10, num_classes=7, image_size=(32, 48), seed=1)
    plan = EpochPlan(1000, global_batch=64, world_size=2, seed=1)
    batches = source.train_batches(plan, 0, 3, 1)
    got = list(batches)
    assert len(got) == len(batches) == plan.steps_per_epoch - 3
    assert got[0].images.shape == (32, 32, 48, 3) and got[0].images.dtype == torch.uint8
    assert got[0].labels.dtype == torch.int64 and 0 <= got[0].labels.min() and got[0].labels.max() < 7
    again = next(iter(SyntheticSource(1000, 10, 7, (32, 48), seed=1).train_batches(plan, 0, 0, 1)))
    assert torch.equal(again.images, got[0].images)
    other_rank = next(iter(source.train_batches(plan, 0, 0, 0)))
    assert not torch.equal(other_rank.images, got[0].images)
    assert [len(b.labels) for r in range(3) for b in source.eval_batches(3, r, 3)] == [3, 1, 3, 3]


def test_to_device_normalizes_in_channels_last() -> None:
    images = torch.tensor([[[[0, 128, 255]] * 2] * 3], dtype=torch.uint8)  # (1, 3, 2, 3) NHWC
    x = to_device(images, torch.device("cpu"), mean=(0.0, 0.5, 1.0), std=(1.0, 0.5, 0.25))
    assert x.shape == (1, 3, 3, 2) and x.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(x[0, :, 0, 0], torch.tensor([0.0, (128 / 255 - 0.5) / 0.5, 0.0]))
    assert to_device(images, torch.device("cpu"), channels_last=False).is_contiguous()


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) for x, y in zip(a, b))


def test_progressive_resizing_keeps_the_crop_boxes(photo_folders: Path) -> None:
    found = find_image_folders(photo_folders)
    source = ImageFolderSource(
        found.train, None, LoaderConfig(workers=0), seed=4, train_crop=RandomResizedCrop(size=(96, 96))
    )
    plan = EpochPlan(source.num_train, global_batch=4, world_size=1, seed=4)
    large = next(iter(source.train_batches(plan, 0, 0, 0)))
    small = next(iter(source.train_batches(plan, 0, 0, 0, size=(48, 48))))
    assert small.images.shape == (4, 48, 48, 3) and large.images.shape == (4, 96, 96, 3)
    # the same box at half the size: 2x2 averages of the large output are close to the small one
    halved = large.images.float().reshape(4, 48, 2, 48, 2, 3).mean(dim=(2, 4))
    assert (halved - small.images.float()).abs().mean() < 8
    other_seed = ImageFolderSource(
        found.train, None, LoaderConfig(workers=0), seed=5, train_crop=RandomResizedCrop(size=(48, 48))
    )
    assert (next(iter(other_seed.train_batches(plan, 0, 0, 0))).images.float() - small.images.float()).abs().mean() > 8
