"""Built-in datasets: file names, published checksums and mirrors. No torch import here (the
`download` command must stay light)."""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.errors import UserError

# The four files every IDX dataset here consists of, in download order.
ROLES: tuple[str, ...] = ("train_images", "train_labels", "test_images", "test_labels")


@dataclass(frozen=True)
class FileSpec:
    """One file of a dataset. `name` is the uncompressed IDX name; mirrors serve `archive_name`."""

    name: str
    gz_md5: str  # md5 of the published .gz archive
    raw_md5: str  # md5 of the decompressed content: survives recompression by mirrors such as Debian
    raw_size: int  # bytes of the decompressed content: bounds what a download or a check may read

    @property
    def archive_name(self) -> str:
        return self.name + ".gz"


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    files: dict[str, FileSpec]  # role (see ROLES) -> file
    mirrors: tuple[str, ...]  # base URLs, tried in order
    # Directories where an operating-system package installs the files; used first when they exist (no network).
    local_copies: tuple[str, ...] = ()
    torchvision_folder: str | None = None  # torchvision keeps the files in <data_dir>/<folder>/raw/

    def __post_init__(self) -> None:
        if set(self.files) != set(ROLES):
            raise ValueError(f"dataset {self.name!r} must define exactly the files {ROLES}, got {sorted(self.files)}")


def _idx_files(md5s: dict[str, tuple[str, str]]) -> dict[str, FileSpec]:
    # name, and size: the IDX header (4 bytes + 4 per dimension) plus one byte per element (60,000/10,000 28x28 images).
    names = {
        "train_images": ("train-images-idx3-ubyte", 16 + 60_000 * 28 * 28),
        "train_labels": ("train-labels-idx1-ubyte", 8 + 60_000),
        "test_images": ("t10k-images-idx3-ubyte", 16 + 10_000 * 28 * 28),
        "test_labels": ("t10k-labels-idx1-ubyte", 8 + 10_000),
    }
    return {role: FileSpec(names[role][0], *md5s[role], raw_size=names[role][1]) for role in ROLES}


DATASETS: dict[str, DatasetSpec] = {
    "mnist": DatasetSpec(
        name="mnist",
        files=_idx_files(
            {
                "train_images": ("f68b3c2dcbeaaa9fbdd348bbdeb94873", "6bbc9ace898e44ae57da46a324031adb"),
                "train_labels": ("d53e105ee54ea40749a09fcbcd1e9432", "a25bea736e30d166cdddb491f175f624"),
                "test_images": ("9fb629c4189551a2d022fa330f9573f3", "2646ac647ad5339dbf082846283269ea"),
                "test_labels": ("ec29112dd5afa0611ce80d1b7f02629c", "27ae3e4e09519cfbb04c329615203637"),
            }
        ),
        mirrors=(
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
            "http://yann.lecun.com/exdb/mnist/",
        ),
        torchvision_folder="MNIST",
    ),
    "fashion-mnist": DatasetSpec(
        name="fashion-mnist",
        files=_idx_files(
            {
                "train_images": ("8d4fb7e6c68d591d4c3dfef9ec88bf0d", "f4a8712d7a061bf5bd6d2ca38dc4d50a"),
                "train_labels": ("25c81989df183df01b3e8a0aad5dffbe", "9018921c3c673c538a1fc5bad174d6f9"),
                "test_images": ("bef4ecab320f06d8554ea6380940ec79", "8181f5470baa50b63fa0f6fddb340f0a"),
                "test_labels": ("bb300cfdad3c16e7a12a480ee83cd310", "15d484375f8d13e6eb1aabb0c3f46965"),
            }
        ),
        mirrors=(
            "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
            "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
        ),
        local_copies=("/usr/share/datasets/fashion-mnist",),  # Debian/Ubuntu: apt install dataset-fashion-mnist
        torchvision_folder="FashionMNIST",
    ),
}


def get_dataset_spec(name: str) -> DatasetSpec:
    try:
        return DATASETS[name]
    except KeyError:
        raise UserError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}") from None
