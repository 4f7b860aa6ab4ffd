"""Image folders: which files make up the training and validation sets, and each file's class index.

Layouts understood (the ones ImageNet users have):

- ``DATA/train/<class>/*`` and ``DATA/val/<class>/*`` (torchvision ``ImageFolder`` style);
- a validation folder elsewhere (``val_path``), with class subfolders or flat;
- a flat validation folder (the official ILSVRC one) plus a label file: ILSVRC's ``LOC_val_solution.csv``
  (``ImageId,PredictionString``; the first token of PredictionString is the class folder name, the wnid) or a
  plain ``file label`` list whose label is a class folder name or a class index. A ``LOC_val_solution.csv``
  in the validation folder or beside it is found without being named.

Class indices are always the training set's: class folder names sorted, as torchvision does, so a checkpoint's
outputs mean the same classes whatever the validation layout. Sample lists are sorted by path, so they are the
same on every rank and every run. Paths and labels are held in flat numpy arrays (paths as `PackedStrings`), not
lists of Python objects: forked data workers then share them without copy-on-read page duplication, and spawned
ones (DALI's) receive each path's UTF-8 bytes, not a fixed-width unicode array sized by the longest path.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpctrain.data.decode import read_image_file
from hpctrain.data.packed import PackedStrings
from hpctrain.errors import UserError
from hpctrain.fsutil import FileRefused, read_regular

# torchvision's IMG_EXTENSIONS, compared case-insensitively (ImageNet's files end in .JPEG).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
ILSVRC_SOLUTION = "LOC_val_solution.csv"
MAX_LABEL_FILE_BYTES = 64 << 20  # ILSVRC's LOC_val_solution.csv is 2.5 MB
LAYOUT_HINT = "expected DATA/train/<class>/<image> (and DATA/val/<class>/<image> or --val-path DIR)"


@dataclass(frozen=True)
class ImageSet:
    """Image files and their class indices, sorted by path."""

    root: str
    paths: PackedStrings  # absolute
    labels: np.ndarray  # int64, index into `classes`
    classes: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.paths)

    def name(self, index: int) -> str:
        """How sample `index` is named in messages (its path)."""
        return self.paths[index]

    def read(self, index: int) -> bytes:
        """The encoded bytes of sample `index` (what a decoder needs); BadImageError if they cannot be read."""
        return read_image_file(str(self.paths[index]))

    def subset(self, keep: np.ndarray) -> ImageSet:
        """The samples at positions `keep`, in that order."""
        return dataclasses.replace(self, paths=self.paths[keep], labels=self.labels[keep])


@dataclass(frozen=True)
class ImageFolders:
    train: ImageSet
    val: ImageSet | None

    @property
    def classes(self) -> tuple[str, ...]:
        return self.train.classes


def find_image_folders(
    data: str | os.PathLike, val_path: str | os.PathLike | None = None, val_labels: str | os.PathLike | None = None
) -> ImageFolders:
    """The training set under ``data/train`` and the validation set (``val_path`` or ``data/val``, if present)."""
    data = Path(data)
    if not data.is_dir():
        raise UserError(f"{data}: no such directory; {LAYOUT_HINT}")
    train_dir = data / "train"
    if not train_dir.is_dir():
        raise UserError(f"{data} has no train/ folder; {LAYOUT_HINT}")
    train = scan_class_folders(train_dir)
    if val_path is None:
        val_dir = data / "val"
        if not val_dir.is_dir():
            if val_labels is not None:
                raise UserError(f"{data} has no val/ folder for the labels in {val_labels}; pass --val-path DIR")
            return ImageFolders(train, None)
    else:
        val_dir = Path(val_path)
        if not val_dir.is_dir():
            raise UserError(f"--val-path {val_dir}: no such directory; give the validation image folder")
    return ImageFolders(train, scan_validation(val_dir, train.classes, val_labels))


def scan_class_folders(root: str | os.PathLike, classes: tuple[str, ...] | None = None) -> ImageSet:
    """``root/<class>/**/<image>``; class indices from `classes` (default: the sorted folder names of `root`)."""
    root = Path(root)
    found = sorted(entry.name for entry in os.scandir(root) if entry.is_dir() and not entry.name.startswith("."))
    if not found:
        raise UserError(f"{root} has no class folders; {LAYOUT_HINT}")
    if classes is None:
        classes = tuple(found)
    else:
        known = set(classes)  # built once: a set per folder name made 40,000 classes a quadratic scan
        unknown = [name for name in found if name not in known]
        if unknown:
            raise UserError(
                f"{root}: validation class folder(s) {_some(unknown)} are not training classes; the validation "
                "set must use the training set's class folder names (remove them or fix the --val-path)"
            )
    index = {name: i for i, name in enumerate(classes)}
    paths: list[str] = []
    labels: list[int] = []
    for name in found:
        files = _image_files(root / name)
        if not files:
            raise UserError(
                f"{root / name}: class folder without images ({', '.join(IMAGE_EXTENSIONS)}); "
                "add its images or remove the folder"
            )
        paths.extend(files)
        labels.extend([index[name]] * len(files))
    return ImageSet(str(root), PackedStrings.of(paths), np.array(labels, dtype=np.int64), classes)


def scan_validation(val_dir: Path, classes: tuple[str, ...], labels_file: str | os.PathLike | None) -> ImageSet:
    """A validation folder: class subfolders, or flat images plus a label file."""
    has_class_folders = any(entry.is_dir() and not entry.name.startswith(".") for entry in os.scandir(val_dir))
    if has_class_folders and labels_file is None:
        return scan_class_folders(val_dir, classes)
    if labels_file is None:
        labels_file = _find_solution_file(val_dir)
    return read_flat_validation(val_dir, Path(labels_file), classes)


def read_flat_validation(val_dir: Path, labels_file: Path, classes: tuple[str, ...]) -> ImageSet:
    """Flat validation images labelled by `labels_file` (ILSVRC solution CSV or ``file label`` lines)."""
    try:
        text = read_regular(labels_file, MAX_LABEL_FILE_BYTES).decode("utf-8")
    except FileRefused as err:
        raise UserError(f"{labels_file}: cannot use it as the validation label file ({err.reason})") from None
    except OSError as err:
        raise UserError(f"{labels_file}: cannot read the validation label file ({err.strerror or err})") from err
    except UnicodeDecodeError as err:
        raise UserError(f"{labels_file}: not a text file; give LOC_val_solution.csv or a `file label` list") from err
    entries = _parse_label_file(labels_file, text, classes)
    files = _image_files(val_dir)
    by_name: dict[str, str] = {}
    for path in files:
        relative = os.path.relpath(path, val_dir)
        by_name[relative] = path
        by_name.setdefault(os.path.splitext(relative)[0], path)  # ILSVRC ImageIds have no extension
    missing = [name for name, _ in entries if name not in by_name]
    if missing:
        raise UserError(
            f"{labels_file}: {len(missing)} labelled image(s) not found in {val_dir}, e.g. {_some(missing)}; "
            "point --val-path at the folder holding them or use the label file that belongs to it"
        )
    labelled = {by_name[name]: label for name, label in entries}
    unlabelled = [os.path.relpath(path, val_dir) for path in files if path not in labelled]
    if unlabelled:
        raise UserError(
            f"{val_dir}: {len(unlabelled)} image(s) have no label in {labels_file}, e.g. {_some(unlabelled)}; "
            "add their labels or move them out of the validation folder"
        )
    if not files:
        raise UserError(f"{val_dir}: no images ({', '.join(IMAGE_EXTENSIONS)}) in the validation folder")
    return ImageSet(
        str(val_dir), PackedStrings.of(files), np.array([labelled[p] for p in files], dtype=np.int64), classes
    )


def _parse_label_file(path: Path, text: str, classes: tuple[str, ...]) -> list[tuple[str, int]]:
    lines = text.splitlines()
    header = lines[0].strip().lstrip("\ufeff") if lines else ""
    if header.replace(" ", "").lower().startswith("imageid,predictionstring"):
        rows = [
            (row[0].strip(), (row[1].split() or [""])[0], n)
            for n, row in enumerate(csv.reader(lines[1:]), start=2)
            if row and len(row) >= 2
        ]
    else:
        rows = []
        for n, line in enumerate(lines, start=1):
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            if len(parts) != 2:
                raise UserError(
                    f"{path}:{n}: expected `file label`, got {line.strip()!r}; "
                    "give LOC_val_solution.csv or one `file label` pair per line"
                )
            rows.append((parts[0], parts[1], n))
    if not rows:
        raise UserError(f"{path}: no labels; give LOC_val_solution.csv or one `file label` pair per line")
    index = {name: i for i, name in enumerate(classes)}
    entries: list[tuple[str, int]] = []
    seen: set[str] = set()
    for name, label, n in rows:
        if name in seen:
            raise UserError(f"{path}:{n}: {name} is labelled twice; keep one line per image")
        seen.add(name)
        entries.append((name, _class_index(path, n, label, index)))
    return entries


def _class_index(path: Path, line: int, label: str, index: dict[str, int]) -> int:
    """A label is a training class folder name or, failing that, a class index (names win)."""
    if label in index:
        return index[label]
    if label.isdigit() and int(label) < len(index):
        return int(label)
    raise UserError(
        f"{path}:{line}: label {label!r} is neither a training class folder name nor a class index "
        f"0..{len(index) - 1}; validation labels must refer to the training set's classes"
    )


def _find_solution_file(val_dir: Path) -> Path:
    for candidate in (val_dir / ILSVRC_SOLUTION, val_dir.parent / ILSVRC_SOLUTION):
        if candidate.is_file():
            return candidate
    raise UserError(
        f"{val_dir} holds images but no class folders, and no {ILSVRC_SOLUTION} was found in it or beside it; "
        "pass the label file (LOC_val_solution.csv or a `file label` list) with --val-labels FILE"
    )


def _image_files(folder: Path) -> list[str]:
    """The image files under `folder`, following directory links (datasets are often assembled from links), sorted.

    A link to a folder that encloses it (`ln -s .. loop`) would list the same images forever, and other classes'
    images as this one's: refused, naming the link. A folder reached a second time (by another link, a bind mount)
    is listed once, by the first path in name order."""
    found: list[str] = []
    visited: set[tuple[int, int]] = set()
    pending = [str(folder)]
    while pending:
        directory = pending.pop()
        try:
            info = os.stat(directory)
            entries = sorted(os.scandir(directory), key=lambda e: e.name, reverse=True)  # popped in name order
        except OSError:
            continue  # unreadable: skipped, as os.walk does
        if (info.st_dev, info.st_ino) in visited:
            continue
        visited.add((info.st_dev, info.st_ino))
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                is_dir = entry.is_dir()
            except OSError:
                continue
            if not is_dir:
                if entry.name.lower().endswith(IMAGE_EXTENSIONS):
                    found.append(entry.path)
            elif entry.is_symlink() and _encloses(os.path.realpath(entry.path), os.path.realpath(directory)):
                raise UserError(
                    f"{entry.path} is a link to {os.readlink(entry.path)}, a folder that contains it: "
                    "following it would list images again and again, under this class; remove the link"
                )
            else:
                pending.append(entry.path)
    return sorted(os.path.abspath(p) for p in found)


def _encloses(outer: str, inner: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def _some(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(str(n) for n in names[:limit])
    return shown + (f" (and {len(names) - limit} more)" if len(names) > limit else "")
