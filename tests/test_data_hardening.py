"""What an attacker found in image folders and prepared shards (issue 17 §3), each a regression test.

Real files throughout: JPEG folders from Fashion-MNIST (tests/image_fixtures.py), shards written by `prepare`, a
real FIFO, /dev/zero behind links, a real tmpfs that fills up (root only; skipped elsewhere).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from hpctrain.data import shards
from hpctrain.data.decode import MAX_IMAGE_BYTES
from hpctrain.data.imagefolder import find_image_folders
from hpctrain.data.shards import INDEX_NAME, PrepareConfig, open_prepared, verify
from hpctrain.errors import UserError
from hpctrain.fsutil import FileRefused, read_regular
from image_fixtures import fashion_folders, train  # noqa: F401
from training_helpers import hpctrain, tree_digest


def small_source(fashion_folders: Path, root: Path, per_class: int = 3, classes=("bag", "boot")) -> Path:
    """SRC/train/<class>/ and SRC/val/<class>/ with a few real JPEGs each."""
    for split in ("train", "val"):
        for cls in classes:
            (root / split / cls).mkdir(parents=True)
            for path in sorted((fashion_folders / split / cls).iterdir())[:per_class]:
                shutil.copy(path, root / split / cls / path.name)
    return root


@pytest.fixture(scope="module")
def prepared(fashion_folders, tmp_path_factory) -> Path:
    """A prepared directory (two train shards) to copy and damage."""
    base = tmp_path_factory.mktemp("prepared")
    src = small_source(fashion_folders, base / "src")
    shards.prepare(PrepareConfig(src=src, out=base / "out", shard_size=8192))
    return base / "out"


def damaged_copy(prepared: Path, tmp_path: Path, change) -> Path:
    out = tmp_path / "out"
    shutil.copytree(prepared, out)
    index = json.loads((out / INDEX_NAME).read_text())
    changed = change(copy.deepcopy(index))
    (out / INDEX_NAME).write_text(changed if isinstance(changed, str) else json.dumps(changed))
    return out


def _set(path: str, value):
    """A change to the index: set the item at `path` (keys separated by `.`, list positions as numbers)."""

    def change(index):
        *parents, last = path.split(".")
        node = index
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        elif value is _DELETE:
            del node[last]
        else:
            node[last] = value
        return index

    return change


_DELETE = object()
INDEX_DAMAGE = {
    "absolute shard name": _set("splits.train.shards.0.name", "/etc/hostname"),
    "climbing shard name": _set("splits.train.shards.0.name", "../../../../etc/passwd"),
    "shard name with a slash": _set("splits.train.shards.0.name", "sub/train-000000.tar"),
    "sample in shard -1": _set("splits.train.samples.shard.0", -1),
    "sample in shard 7": _set("splits.train.samples.shard.0", 7),
    "no classes": _set("splits.train.classes", []),
    "short column": lambda index: (index["splits"]["train"]["samples"]["label"].pop(), index)[1],
    "label out of range": _set("splits.train.samples.label.0", 2),
    "missing key": _set("splits.train.samples.offset", _DELETE),
    "wrong type": _set("splits.train.samples.offset.0", "512"),
    "a bool for a number": _set("splits.train.shards.0.bytes", True),
    "size of 8 GiB": _set("splits.train.samples.size.0", 8 << 30),
    "size of 10**12": _set("splits.train.samples.size.0", 10**12),
    "sample beyond its shard": _set("splits.train.samples.offset.0", 10**9),
    "200k-deep JSON": lambda index: (
        '{"format": "hpctrain-shards", "version": 1, "x": ' + "[" * 200_000 + "]" * 200_000 + "}"
    ),
}


@pytest.mark.parametrize("case", list(INDEX_DAMAGE))
def test_a_damaged_index_is_refused_by_train_and_verify_with_the_fix(prepared, tmp_path, case):
    """Guards issue 17: `--verify` passed a sample in shard -1 or 7 and `classes: []`; `train` then read the wrong
    shard, trained on 11 of 12 samples with a short column, opened /etc/passwd through a shard name, allocated
    8 GiB for a sample's `size`, or died with a traceback (label out of range, missing keys, wrong types, deep
    JSON). One structural check now refuses each, naming the index and `hpctrain prepare`."""
    out = damaged_copy(prepared, tmp_path, INDEX_DAMAGE[case])
    for reader in (open_prepared, verify):  # what `train` and `prepare --verify` call
        with pytest.raises(UserError, match=f"{INDEX_NAME}.*hpctrain prepare imagenet SRC OUT") as err:
            reader(out)
        assert "\n" not in str(err.value)


def test_verify_of_a_damaged_index_is_one_line_on_the_command_line(prepared, tmp_path):
    """The CLI path of the check above: exit 2, one line, no traceback, /etc/passwd never named as read."""
    out = damaged_copy(prepared, tmp_path, INDEX_DAMAGE["climbing shard name"])
    result = hpctrain("prepare", "imagenet", "--verify", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "not a file name inside OUT" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_shard_whose_size_changed_is_refused_before_training(prepared, tmp_path):
    """Guards issue 17 (a sample's size sets the read): train checks the shards against the index's sizes."""
    out = damaged_copy(prepared, tmp_path, lambda index: index)
    with open(out / "train-000000.tar", "ab") as f:
        f.write(b"\0" * 512)
    with pytest.raises(UserError, match="its size differs from the one index.json records"):
        open_prepared(out)


@pytest.mark.parametrize("kind", ["dev-zero", "fifo"])
def test_an_index_that_is_not_a_regular_file_is_refused(prepared, tmp_path, kind):
    """Guards issue 17: index.json -> /dev/zero exhausted memory (and a FIFO would hang)."""
    out = damaged_copy(prepared, tmp_path, lambda index: index)
    (out / INDEX_NAME).unlink()
    if kind == "fifo":
        os.mkfifo(out / INDEX_NAME)
    else:
        (out / INDEX_NAME).symlink_to("/dev/zero")
    with pytest.raises(UserError, match="not a regular file"):
        open_prepared(out)


# ---------------------------------------------------------------- files that are not regular, or too large


def test_read_regular_refuses_fifos_devices_and_large_files(tmp_path):
    """The one helper every user or dataset file is read through (fsutil.read_regular)."""
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(FileRefused, match="not a regular file \\(a FIFO\\)"):
        read_regular(tmp_path / "fifo", 100)  # returns at once: the open does not wait for a writer
    with pytest.raises(FileRefused, match="a character device"):
        read_regular("/dev/zero", 100)
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(FileRefused, match="101 B, more than the 100 B read"):
        read_regular(tmp_path / "big", 100)
    assert read_regular(tmp_path / "big", 101) == b"x" * 101


def test_a_fifo_and_dev_zero_named_as_images_are_bad_images_in_prepare(fashion_folders, tmp_path):
    """Guards issue 17: a FIFO named x.JPEG hung `prepare` (also with --skip-bad-images); zero.JPEG -> /dev/zero
    grew a process to 17 GB. Both are now bad images: named, or left out with --skip-bad-images."""
    src = small_source(fashion_folders, tmp_path / "src")
    os.mkfifo(src / "train" / "bag" / "x.JPEG")
    (src / "train" / "boot" / "zero.JPEG").symlink_to("/dev/zero")
    (src / "train" / "boot" / "huge.JPEG").write_bytes(b"\xff\xd8\xff" + b"\0" * MAX_IMAGE_BYTES)
    result = hpctrain("prepare", "imagenet", str(src), str(tmp_path / "out"), "-j", "1", timeout=120)
    assert result.returncode == 2 and "x.JPEG: cannot decode this image (not a regular file (a FIFO)" in result.stderr
    result = hpctrain(
        "prepare", "imagenet", str(src), str(tmp_path / "out"), "-j", "2", "--skip-bad-images", timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "skipped 3 unreadable image(s): bag/x.JPEG, boot/huge.JPEG, boot/zero.JPEG" in result.stdout
    assert len(open_prepared(tmp_path / "out").train) == 6


def test_a_fifo_among_training_images_is_a_bad_image_not_a_hang(fashion_folders, tmp_path):
    """Guards issue 17: the same FIFO hung `train` (its data workers read image files through the same helper)."""
    from hpctrain.data.decode import BadImageError

    src = small_source(fashion_folders, tmp_path / "src")
    os.mkfifo(src / "train" / "bag" / "x.JPEG")
    train = find_image_folders(src).train
    position = list(train.paths).index(str(src / "train" / "bag" / "x.JPEG"))
    with pytest.raises(BadImageError, match="not a regular file"):
        train.read(position)


def test_val_labels_that_are_not_a_regular_file_are_refused(fashion_folders, tmp_path):
    """Guards issue 17: --val-labels /dev/zero exhausted memory."""
    src = small_source(fashion_folders, tmp_path / "src")
    with pytest.raises(UserError, match="--val-labels|validation label file.*not a regular file"):
        find_image_folders(src, val_labels="/dev/zero")


# ---------------------------------------------------------------- worker counts


def test_worker_counts_are_bounded_by_the_usable_cores(fashion_folders, tmp_path):
    """Guards issue 17: `prepare -j 100000` forked until the load average was 358."""
    from hpctrain.distributed.cores import WORKERS_PER_CORE, available_cores

    limit = WORKERS_PER_CORE * available_cores()
    before = tree_digest(tmp_path)
    result = hpctrain("prepare", "imagenet", str(fashion_folders), str(tmp_path / "out"), "-j", "100000")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"--workers 100000: more than {limit} processes" in result.stderr and f"at most {limit}" in result.stderr
    assert tree_digest(tmp_path) == before


def test_train_data_workers_are_bounded_by_the_usable_cores(fashion_folders, tmp_path):
    """Guards issue 17: `train imagenet -j 100000` was refused only for /dev/shm, suggesting "--workers 10710" on
    2 cores."""
    from hpctrain.distributed.cores import WORKERS_PER_CORE, available_cores

    limit = WORKERS_PER_CORE * available_cores()
    result = train(small_source(fashion_folders, tmp_path / "src"), tmp_path / "run", "-j", "100000", expect=2)
    assert f"--workers 100000: more than {limit} processes" in result.stderr and "Traceback" not in result.stderr
    assert "/dev/shm" not in result.stderr


# ---------------------------------------------------------------- folder layout


def test_a_directory_link_cycle_in_an_image_folder_is_refused_by_name(fashion_folders, tmp_path):
    """Guards issue 17: `ln -s .. DATA/train/a/loop` turned 12 images into 492 and labelled class b's images as
    class a, silently (three such links never finished listing)."""
    src = small_source(fashion_folders, tmp_path / "src")
    (src / "train" / "bag" / "loop").symlink_to("..")
    with pytest.raises(
        UserError, match=f"{src / 'train' / 'bag' / 'loop'} is a link to \\.\\., a folder that contains it"
    ):
        find_image_folders(src)


def test_a_folder_reached_twice_through_links_is_listed_once(fashion_folders, tmp_path):
    """No double counting: a class folder holding a link to one of its own subfolders lists its images once."""
    src = small_source(fashion_folders, tmp_path / "src")
    sub = src / "train" / "bag" / "more"
    sub.mkdir()
    shutil.copy(next((src / "train" / "boot").iterdir()), sub / "extra.JPEG")
    (src / "train" / "bag" / "again").symlink_to("more")
    train = find_image_folders(src).train
    assert len(train) == 7 and sum(p.endswith("extra.JPEG") for p in train.paths) == 1


def test_prepare_refuses_out_inside_src_and_src_inside_out(fashion_folders, tmp_path):
    """Guards issue 17: `prepare imagenet SRC SRC/train/shards` gave SRC a class `shards`."""
    src = small_source(fashion_folders, tmp_path / "src")
    before = tree_digest(tmp_path)
    for out, message in ((src / "train" / "shards", "lies inside SRC"), (tmp_path, "lies inside OUT")):
        result = hpctrain("prepare", "imagenet", str(src), str(out))
        assert result.returncode == 2 and message in result.stderr, result.stderr
    assert tree_digest(tmp_path) == before


def test_prepare_copes_with_a_class_folder_name_that_is_not_utf8(fashion_folders, tmp_path):
    """Guards issue 17: a non-UTF-8 class folder name made `prepare` die with UnicodeEncodeError (train coped).
    Now it prepares, the skipped-image line shows the name's bytes as \\xNN, and the shards read back."""
    src = small_source(fashion_folders, tmp_path / "src")
    odd = os.path.join(os.fsencode(src / "train"), b"caf\xe9")
    os.rename(os.fsencode(src / "train" / "boot"), odd)
    os.rename(os.fsencode(src / "val" / "boot"), os.path.join(os.fsencode(src / "val"), b"caf\xe9"))
    with open(os.path.join(odd, b"bad.JPEG"), "wb") as f:
        f.write(b"not an image")
    result = hpctrain("prepare", "imagenet", str(src), str(tmp_path / "out"), "-j", "1", "--skip-bad-images")
    assert result.returncode == 0, result.stderr
    assert "skipped 1 unreadable image(s): caf\\xe9/bad.JPEG" in result.stdout
    prepared_dir = open_prepared(tmp_path / "out")
    assert prepared_dir.classes == ("bag", os.fsdecode(b"caf\xe9")) and len(prepared_dir.train) == 6


# ---------------------------------------------------------------- a full disk


@pytest.fixture
def small_tmpfs(tmp_path):
    """A file system that fills up: tmpfs, which only root may mount (the test is skipped otherwise)."""
    mount = tmp_path / "small"
    mount.mkdir()
    mounted = []

    def make(size_bytes: int) -> Path:
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", f"hpctrain-{uuid.uuid4().hex[:8]}", str(mount)],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({result.stderr.strip()}): needs root")
        mounted.append(mount)
        return mount

    yield make
    for path in mounted:
        subprocess.run(["umount", str(path)], check=False)


def test_prepare_on_a_full_disk_says_so_and_removes_the_unfinished_shard(fashion_folders, tmp_path, small_tmpfs):
    """Guards issue 17: `prepare` on a full disk died with an OSError traceback from inside tarfile."""
    src = small_source(fashion_folders, tmp_path / "src", per_class=30, classes=("bag", "boot", "coat"))
    mount = small_tmpfs(48 * 1024)
    result = hpctrain("prepare", "imagenet", str(src), str(mount / "out"), "-j", "1", "--shard-size", "16KB")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "No space left on device while writing the shards" in result.stderr
    assert "rerun the same command to continue" in result.stderr
    assert [line for line in result.stderr.splitlines() if "error" in line] == result.stderr.splitlines()[-1:]
    assert not list((mount / "out").glob(".*.tmp-*")), "the unfinished shard is removed"
    assert list((mount / "out").glob("train-*.tar")), "complete shards are kept"


def test_a_resumed_prepare_takes_only_the_shards_it_wrote(fashion_folders, tmp_path):
    """Guards issue 39 §13: resuming without an index took any shard in OUT under a shard's name; a planted shard
    of other images went into the index. Only shards this preparation recorded (its journal) are kept."""
    src = small_source(fashion_folders, tmp_path / "src")
    other = tmp_path / "other"  # the same classes and counts, other images
    for split in ("train", "val"):
        for cls in ("bag", "boot"):
            (other / split / cls).mkdir(parents=True)
            for path in sorted((fashion_folders / split / cls).iterdir())[3:6]:
                shutil.copy(path, other / split / cls / path.name)
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    shards.prepare(PrepareConfig(src=src, out=out, shard_size=8192))
    shards.prepare(PrepareConfig(src=other, out=elsewhere, shard_size=8192))
    good = {p.name: p.read_bytes() for p in sorted(out.glob("*.tar"))}
    assert len(good) >= 3 and (elsewhere / "train-000001.tar").read_bytes() != good["train-000001.tar"]
    (out / INDEX_NAME).unlink()  # as if interrupted before the index was written
    shutil.copy(elsewhere / "train-000001.tar", out / "train-000001.tar")  # planted
    index = shards.prepare(PrepareConfig(src=src, out=out, shard_size=8192))
    assert {p.name: p.read_bytes() for p in sorted(out.glob("*.tar"))} == good
    others = {p.name for p in (other / "train").rglob("*") if p.is_file()}
    assert not others & {Path(p).name for p in index["splits"]["train"]["samples"]["path"]}


def test_a_shard_member_that_is_a_directory_is_a_one_line_error(tmp_path):
    """Guards issue 39 §13: a directory member hit an `assert` (gone under python -O)."""
    import tarfile

    from hpctrain.data.shards.index import shard_members

    shard = tmp_path / "train-000000.tar"
    with tarfile.open(shard, "w") as tar:
        member = tarfile.TarInfo("00000000.cls")
        member.type = tarfile.DIRTYPE
        tar.addfile(member)
    with pytest.raises(UserError, match=r"member '00000000.cls' is not a regular file.*hpctrain prepare imagenet"):
        shard_members(shard)
