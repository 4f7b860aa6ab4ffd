"""Image folder layouts on real JPEG files: class folders, --val-path, flat validation with label files, errors."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from image_fixtures import FASHION_CLASSES, fashion_folders, flatten_val  # noqa: F401

from hpctrain.data.imagefolder import find_image_folders
from hpctrain.errors import UserError


def test_class_folder_layout(fashion_folders: Path) -> None:
    found = find_image_folders(fashion_folders)
    assert found.classes == tuple(sorted(FASHION_CLASSES))
    assert len(found.train) == 300 and found.val is not None and len(found.val) == 100
    assert list(found.train.paths) == sorted(found.train.paths)
    for images in (found.train, found.val):
        for path, label in zip(images.paths, images.labels):
            assert Path(path).parent.name == found.classes[label]
            assert os.path.isabs(path)
    assert found.train.labels.dtype == np.int64


def test_val_path_elsewhere_maps_through_training_classes(fashion_folders: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    os.symlink(fashion_folders / "train", data / "train")
    val = tmp_path / "elsewhere"
    for cls in ("trouser", "sandal"):  # a subset of the classes: indices must still be the training set's
        shutil.copytree(fashion_folders / "val" / cls, val / cls)
    found = find_image_folders(data, val_path=val)
    assert found.val is not None
    assert sorted(set(found.val.labels.tolist())) == [found.classes.index("sandal"), found.classes.index("trouser")]
    assert found.classes.index("sandal") != 1  # a val-only numbering would have given 0 and 1


def test_no_val_folder_is_fine(fashion_folders: Path, tmp_path: Path) -> None:
    os.symlink(fashion_folders / "train", tmp_path / "train")
    assert find_image_folders(tmp_path).val is None


def _expected_val(fashion_folders: Path, entries: list[tuple[str, str]]) -> dict[str, str]:
    return {image_id: cls for image_id, cls in entries}


def test_flat_val_with_ilsvrc_solution_csv_found_beside_it(fashion_folders: Path, tmp_path: Path) -> None:
    entries = flatten_val(fashion_folders, tmp_path / "data")
    lines = ["ImageId,PredictionString"]
    lines += [f"{image_id},{cls} 10 20 200 300 {cls} 1 2 3 4" for image_id, cls in reversed(entries)]
    (tmp_path / "data" / "LOC_val_solution.csv").write_text("\n".join(lines) + "\n")
    found = find_image_folders(tmp_path / "data")
    assert found.val is not None and len(found.val) == len(entries) == 100
    expected = _expected_val(fashion_folders, entries)
    for path, label in zip(found.val.paths, found.val.labels):
        assert found.classes[label] == expected[Path(path).stem]
    assert list(found.val.paths) == sorted(found.val.paths)


@pytest.mark.parametrize("label_kind", ["name", "index"])
def test_flat_val_with_plain_label_list(fashion_folders: Path, tmp_path: Path, label_kind: str) -> None:
    entries = flatten_val(fashion_folders, tmp_path / "data")
    classes = tuple(sorted(FASHION_CLASSES))
    rows = [f"{image_id}.JPEG {cls if label_kind == 'name' else classes.index(cls)}" for image_id, cls in entries]
    labels = tmp_path / "val_labels.txt"
    labels.write_text("# file label\n" + "\n".join(rows) + "\n")
    found = find_image_folders(tmp_path / "data", val_labels=labels)
    assert found.val is not None and len(found.val) == 100
    expected = _expected_val(fashion_folders, entries)
    assert all(found.classes[label] == expected[Path(p).stem] for p, label in zip(found.val.paths, found.val.labels))


def test_missing_train_folder(tmp_path: Path) -> None:
    (tmp_path / "val").mkdir()
    with pytest.raises(UserError, match=r"has no train/ folder; expected DATA/train/<class>/<image>"):
        find_image_folders(tmp_path)


def test_empty_class_folder_is_named(fashion_folders: Path, tmp_path: Path) -> None:
    shutil.copytree(fashion_folders / "train", tmp_path / "train")
    (tmp_path / "train" / "zebra").mkdir()
    (tmp_path / "train" / "zebra" / "notes.txt").write_text("not an image")
    with pytest.raises(UserError, match=r"train/zebra: class folder without images .*remove the folder"):
        find_image_folders(tmp_path)


def test_val_class_absent_from_train(fashion_folders: Path, tmp_path: Path) -> None:
    os.symlink(fashion_folders / "train", tmp_path / "train")
    shutil.copytree(fashion_folders / "val", tmp_path / "val")
    os.rename(tmp_path / "val" / "coat", tmp_path / "val" / "jacket")
    with pytest.raises(UserError, match=r"validation class folder\(s\) jacket are not training classes"):
        find_image_folders(tmp_path)


def test_label_file_entry_for_missing_file(fashion_folders: Path, tmp_path: Path) -> None:
    entries = flatten_val(fashion_folders, tmp_path / "data")
    os.remove(tmp_path / "data" / "val" / f"{entries[7][0]}.JPEG")
    rows = "\n".join(f"{image_id},{cls} 1 2 3 4" for image_id, cls in entries)
    (tmp_path / "data" / "val" / "LOC_val_solution.csv").write_text("ImageId,PredictionString\n" + rows)
    with pytest.raises(UserError, match=rf"1 labelled image\(s\) not found in .*, e.g. {entries[7][0]}"):
        find_image_folders(tmp_path / "data")


def test_unlabelled_image_and_unknown_label(fashion_folders: Path, tmp_path: Path) -> None:
    entries = flatten_val(fashion_folders, tmp_path / "data")
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(f"{i}.JPEG {c}" for i, c in entries[1:]))
    with pytest.raises(UserError, match=rf"1 image\(s\) have no label in .*, e.g. {entries[0][0]}.JPEG"):
        find_image_folders(tmp_path / "data", val_labels=labels)
    labels.write_text("\n".join(f"{i}.JPEG {c}" for i, c in entries[:-1]) + f"\n{entries[-1][0]}.JPEG 10\n")
    with pytest.raises(UserError, match=r"labels.txt:100: label '10' is neither a training class .* 0..9"):
        find_image_folders(tmp_path / "data", val_labels=labels)


def test_flat_val_without_label_file(fashion_folders: Path, tmp_path: Path) -> None:
    flatten_val(fashion_folders, tmp_path / "data")
    with pytest.raises(UserError, match=r"no LOC_val_solution.csv was found .* --val-labels FILE"):
        find_image_folders(tmp_path / "data")


class _CountedName(str):
    """A class name that counts how often it is hashed: each hash is one step of building or probing a set/dict."""

    hashes = 0

    def __hash__(self) -> int:
        _CountedName.hashes += 1
        return str.__hash__(self)


@pytest.mark.parametrize("count", [100, 200, 400])
def test_validation_class_scan_is_linear_in_the_number_of_classes(tmp_path: Path, count: int) -> None:
    # 40,000 ImageNet-21k-style class folders took 70 s when the training class set was rebuilt for every
    # validation folder name (count² hashes); the scan must hash each class name a fixed number of times.
    from hpctrain.data.imagefolder import scan_class_folders

    names = [f"n{i:08d}" for i in range(count)]
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.jpg").write_bytes(b"")
    _CountedName.hashes = 0
    found = scan_class_folders(tmp_path, tuple(_CountedName(name) for name in names))
    assert len(found) == count and list(found.labels) == list(range(count))
    assert _CountedName.hashes <= 3 * count, f"{_CountedName.hashes} hashes of {count} class names"
