"""`hpctrain prepare imagenet SRC OUT` and training from its shards, on real JPEG folders (tests/image_fixtures.py).

The shards are read back by the `webdataset` library itself; training from shards made with --keep-size sees the
folders' exact batches, and resumes mid-epoch bitwise; a prepare killed with SIGKILL finishes, when rerun, with
the bytes of an uninterrupted one; verification names a corrupted shard and the fix.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch

from hpctrain.data.imagefolder import find_image_folders
from hpctrain.data.loader import ImageFolderSource, LoaderConfig
from hpctrain.data.sampler import EpochPlan
from hpctrain.data.shards import INDEX_NAME, open_prepared
from hpctrain.data.transforms import CenterCrop, RandomResizedCrop
from hpctrain.errors import UserError
from image_fixtures import fashion_folders, interrupt, photo_folders, train  # noqa: F401
from training_helpers import assert_bitwise_equal, final_weights, hpctrain, ok, start_hpctrain, tree_digest


def prepare(src, out, *extra, expect=0):
    result = hpctrain("prepare", "imagenet", str(src), str(out), "-j", "1", *extra)
    if expect == 0:
        return ok(result)
    assert result.returncode == expect, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return result


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def test_webdataset_reads_the_shards_as_the_folders_images_and_labels(photo_folders, tmp_path):
    """--keep-size: every member is the original file's bytes (CMYK and grayscale JPEGs, a PNG included) with its
    class index; the default --max-side 320 shrinks the ~500x375 photos to a shorter side of 320."""
    import webdataset as wds
    from PIL import Image

    found = find_image_folders(photo_folders)
    for option, out in ((["--keep-size"], tmp_path / "kept"), ([], tmp_path / "shrunk")):
        prepare(photo_folders, out, "--shard-size", "200KB", *option)
        for split, images in (("train", found.train), ("val", found.val)):
            urls = [str(p) for p in sorted(out.glob(f"{split}-*.tar"))]
            assert len(urls) > 1, "several shards"
            samples = list(wds.WebDataset(urls, shardshuffle=False))
            assert [int(s["__key__"]) for s in samples] == list(range(len(images)))
            for sample, path, label in zip(samples, images.paths, images.labels):
                [extension] = [k for k in sample if k in ("jpg", "png")]
                assert int(sample["cls"]) == label
                original = Path(path).read_bytes()
                if option:
                    assert sample[extension] == original
                else:
                    with Image.open(path) as before:
                        expected = min(min(before.size), 320)
                    with Image.open(io.BytesIO(sample[extension])) as after:
                        assert min(after.size) == expected, path
                    assert (sample[extension] == original) == (expected < 320), path


def first_batches(train_images, val_images, seed=3):
    source = ImageFolderSource(
        train_images,
        val_images,
        LoaderConfig(workers=0),
        seed,
        train_crop=RandomResizedCrop((64, 64)),
        eval_crop=CenterCrop((64, 64), 73),
    )
    plan = EpochPlan(len(train_images), 8, 1, seed)
    return next(iter(source.train_batches(plan, 1, 0, 0))), next(iter(source.eval_batches(1, 0, 8)))


def test_first_batches_from_keep_size_shards_equal_the_folders(photo_folders, tmp_path):
    out = tmp_path / "shards"
    prepare(photo_folders, out, "--keep-size", "--shard-size", "150KB")
    found, prepared = find_image_folders(photo_folders), open_prepared(out)
    assert prepared.classes == found.classes and len(prepared.train.shard_names) > 1
    folder_batches = first_batches(found.train, found.val)
    shard_batches = first_batches(prepared.train, prepared.val)
    for a, b in zip(folder_batches, shard_batches):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
        assert a.images.float().std() > 10, "real pictures, not blank images"


def test_training_from_shards_resumes_mid_epoch_bitwise_as_from_the_folders(fashion_folders, tmp_path):
    """An uninterrupted run from the folders and a run from --keep-size shards, stopped mid-epoch (2 data
    workers) and resumed, end with bitwise-equal weights: same batches, same crops, exact resume."""
    shards, whole, parts = tmp_path / "shards", tmp_path / "whole", tmp_path / "parts"
    prepare(fashion_folders, shards, "--keep-size", "--shard-size", "64KB")
    train(fashion_folders, whole, "--epochs", "2", "-j", "2")
    status, output = interrupt(shards, parts, "-j", "2")
    assert status == 75, output
    [step_checkpoint] = (parts / "checkpoints").glob("checkpoint_step_*.pt")
    stopped_at = int(step_checkpoint.stem.rsplit("_", 1)[1])
    resumed = train(shards, parts, "--epochs", "2", "--resume", "-j", "2")
    assert f"global step {stopped_at}" in resumed.stdout
    assert_bitwise_equal(final_weights(whole), final_weights(parts))


def test_a_rerun_removes_what_a_kill_left_half_written(fashion_folders, tmp_path):
    """A SIGKILL between write_atomic's temporary and its rename leaves the temporary (a CI run's kill landed there
    once, on the journal's): the rerun removes it with the partial shards, and the directory is the one a whole run
    makes."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    prepare(fashion_folders, whole, "--shard-size", "100")
    shutil.copytree(whole, parts)
    (parts / INDEX_NAME).unlink()
    left = [".hpctrain-prepare-shards.json", ".hpctrain-prepare.json", INDEX_NAME, "train-000001.tar"]
    for name in left:
        (parts / f".{name}.tmp-4242").write_bytes(b'{"train":{"train-00')
    result = prepare(fashion_folders, parts, "--shard-size", "100")
    assert "already in complete shards" in result.stderr
    assert files(parts) == files(whole)


def test_prepare_killed_midway_continues_to_the_same_bytes(fashion_folders, tmp_path):
    """One image per shard (--shard-size 1): 400 shards, killed with SIGKILL once the first two exist."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    prepare(fashion_folders, whole, "--shard-size", "1")
    process = start_hpctrain("prepare", "imagenet", str(fashion_folders), str(parts), "-j", "1", "--shard-size", "1")
    try:
        while not (parts / "train-000001.tar").exists() and process.poll() is None:
            time.sleep(0.005)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    kept = files(parts)
    assert INDEX_NAME not in kept, "killed before the end"
    assert all(data == (whole / name).read_bytes() for name, data in kept.items() if name.endswith(".tar"))
    result = prepare(fashion_folders, parts, "--shard-size", "1")
    assert "already in complete shards" in result.stderr
    assert files(parts) == files(whole)
    assert not list(parts.glob(".*.tmp-*"))


def test_verify_names_a_corrupted_shard_and_rerunning_prepare_repairs_it(fashion_folders, tmp_path):
    out = tmp_path / "shards"
    prepare(fashion_folders, out, "--shard-size", "32KB")
    good = files(out)
    ok(hpctrain("prepare", "imagenet", "--verify", str(out)))
    shard = out / "train-000002.tar"
    data = bytearray(shard.read_bytes())
    data[1000] ^= 0xFF  # inside the first image's data
    shard.write_bytes(bytes(data))
    result = hpctrain("prepare", "imagenet", "--verify", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "train-000002.tar: corrupted shard" in result.stderr
    assert "rerun `hpctrain prepare imagenet SRC" in result.stderr
    prepare(fashion_folders, out, "--shard-size", "32KB")  # finds the checksum mismatch and rewrites from there
    assert files(out) == good


def test_bad_image_is_named_or_skipped(fashion_folders, tmp_path):
    src = tmp_path / "src"
    for split in ("train", "val"):
        for cls in ("bag", "boot"):
            (src / split / cls).mkdir(parents=True)
            for path in sorted((fashion_folders / split / cls).iterdir())[:4]:
                shutil.copy(path, src / split / cls / path.name)
    bad = src / "train" / "bag" / "00000_truncated.JPEG"
    bad.write_bytes(next((src / "train" / "boot").iterdir()).read_bytes()[:300])
    out = tmp_path / "out"
    result = prepare(src, out, expect=2)
    assert f"{bad}: cannot decode this image" in result.stderr and "--skip-bad-images" in result.stderr
    assert not (out / INDEX_NAME).exists() and not list(out.glob(".*.tmp-*"))
    result = prepare(src, tmp_path / "skipping", "--skip-bad-images")
    assert "skipped 1 unreadable image(s): bag/00000_truncated.JPEG" in result.stdout
    prepared = open_prepared(tmp_path / "skipping")
    assert len(prepared.train) == 8 and "bag/00000_truncated.JPEG" not in set(prepared.train.paths)


@pytest.mark.parametrize(
    "case,message",
    [
        ("missing-src", "no such directory"),
        ("out-is-file", "exists and is not a directory"),
        ("bad-shard-size", "--shard-size '12 parsecs': give a size such as 1GB"),
        ("verify-missing", "no such directory; give the OUT directory"),
    ],
)
def test_bad_input_fails_clearly_and_writes_nothing(fashion_folders, tmp_path, case, message):
    out = tmp_path / "out"
    args = {
        "missing-src": [str(tmp_path / "nowhere"), str(out)],
        "out-is-file": [str(fashion_folders), str(tmp_path / "file")],
        "bad-shard-size": [str(fashion_folders), str(out), "--shard-size", "12 parsecs"],
        "verify-missing": ["--verify", str(out)],
    }[case]
    (tmp_path / "file").write_text("not a directory\n")
    before = tree_digest(tmp_path)
    result = hpctrain("prepare", "imagenet", *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert tree_digest(tmp_path) == before


def test_training_refuses_an_index_of_another_format_version(fashion_folders, tmp_path):
    out = tmp_path / "shards"
    prepare(fashion_folders, out, "--shard-size", "1MB")
    index = json.loads((out / INDEX_NAME).read_text())
    (out / INDEX_NAME).write_text(json.dumps({**index, "version": 99}))
    with pytest.raises(UserError, match="version 99.*hpctrain prepare imagenet SRC OUT"):
        open_prepared(out)
    os.remove(out / "val-000000.tar")
    (out / INDEX_NAME).write_text(json.dumps(index))
    result = train(out, tmp_path / "run", "--epochs", "1", expect=2)
    assert "val-000000.tar" in result.stderr and "hpctrain prepare" in result.stderr


def test_prepare_reports_sizes_people_read(fashion_folders, tmp_path):
    # 300 small JPEGs are a few hundred kB: once reported as "0.00 GB".
    result = prepare(fashion_folders, tmp_path / "out", "--keep-size", "--shard-size", "1MB")
    [line] = [line for line in result.stdout.splitlines() if line.startswith("train:")]
    assert " KiB, " in line and "GiB" not in line, line
    # and the disk size per image (JPEGs of 28x28 pixels: about a kilobyte each, tar headers included)
    per_image = line.split(", ")[-2]
    assert per_image.endswith(" per image") and per_image.split()[1] in ("B", "KiB"), line


def test_raw_shards_hold_decoded_pixels_and_say_their_size_per_image(photo_folders, tmp_path):
    """--format raw: every member is a binary PPM of the source's RGB pixels (shorter side at most --max-side,
    as the jpeg format shrinks), the training decoder uses them without decoding (a view of the bytes read), and
    the output states the disk size per image: 3 bytes a pixel plus the tar's headers."""
    import webdataset as wds
    from PIL import Image

    from hpctrain.data.decode import _decode

    found = find_image_folders(photo_folders)
    out = tmp_path / "raw"
    result = prepare(photo_folders, out, "--format", "raw", "--max-side", "96", "--shard-size", "200KB")
    samples = list(wds.WebDataset([str(p) for p in sorted(out.glob("train-*.tar"))], shardshuffle=False))
    assert len(samples) == len(found.train)
    pixels = 0
    for sample, path in zip(samples, found.train.paths):
        assert set(sample) >= {"ppm", "cls"}, sorted(sample)
        with Image.open(path) as original:
            expected = min(min(original.size), 96)
        with Image.open(io.BytesIO(sample["ppm"])) as stored:
            assert stored.mode == "RGB" and min(stored.size) == expected, path
            pixels += stored.size[0] * stored.size[1]
        image, crop, scale = _decode(sample["ppm"], RandomResizedCrop((32, 32)), 0, 0, 0)
        assert scale == (1.0, 1.0) and not image.flags.writeable, "a view of the stored bytes, nothing decoded"
    [line] = [line for line in result.stdout.splitlines() if line.startswith("train:")]
    per_image = float(line.split(", ")[-2].split()[0])  # "N.N KiB per image"
    pixel_kib = 3 * pixels / len(samples) / 1024
    assert pixel_kib <= per_image <= 1.1 * pixel_kib, line  # headers and the tar's end padding: a few percent
    assert json.loads((out / INDEX_NAME).read_text())["options"]["format"] == "raw"


def test_training_from_raw_shards_resumes_mid_epoch_bitwise(fashion_folders, tmp_path):
    """Raw-pixel shards: a run stopped mid-epoch (2 data workers) and resumed ends bitwise where an uninterrupted
    run from the same shards does; --data-backend auto picks the CPU workers (nothing to decode)."""
    shards, whole, parts = tmp_path / "shards", tmp_path / "whole", tmp_path / "parts"
    prepare(fashion_folders, shards, "--format", "raw", "--shard-size", "64KB")
    uninterrupted = train(shards, whole, "--epochs", "2", "-j", "2")
    assert "data backend cpu (auto: the shards hold decoded pixels" in uninterrupted.stdout
    status, output = interrupt(shards, parts, "-j", "2")
    assert status == 75, output
    resumed = train(shards, parts, "--epochs", "2", "--resume", "-j", "2")
    assert "global step" in resumed.stdout
    assert_bitwise_equal(final_weights(whole), final_weights(parts))


def test_prepare_on_a_file_system_without_locks_says_so_in_one_line(fashion_folders, tmp_path, monkeypatch, capsys):
    """A file system mounted without locks (NFS `nolock`, Lustre without `flock`) refuses flock with ENOLCK. No such
    mount can be made here, so flock itself is replaced by one that refuses as such a file system does."""
    import errno
    import fcntl

    from hpctrain.cli import main

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert main(["prepare", "imagenet", str(fashion_folders), str(tmp_path / "out"), "-j", "1"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "this file system refuses flock" in warnings[0], warnings
    assert (tmp_path / "out" / INDEX_NAME).is_file()
