"""The IDX reader and load_dataset: real Fashion-MNIST files plus hand-built edge cases."""

from __future__ import annotations

import gzip
import shutil
import struct
from pathlib import Path

import pytest
import torch

from hpctrain.data import find_dataset_files, get_dataset_spec, load_dataset, read_idx
from hpctrain.errors import UserError


def idx_bytes(array: torch.Tensor, type_code: int = 0x08) -> bytes:
    """Encode a uint8 tensor as IDX: two zero bytes, type code, ndim, big-endian dims, then the data."""
    header = struct.pack(">HBB", 0, type_code, array.dim()) + struct.pack(f">{array.dim()}I", *array.shape)
    return header + array.contiguous().numpy().tobytes()


def write(path: Path, data: bytes, gz: bool) -> Path:
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
@pytest.mark.parametrize("shape", [(7,), (3, 4, 5), (2, 1, 3, 2)])
def test_round_trip_shapes(tmp_path, gz, shape):
    array = torch.randint(0, 256, shape, dtype=torch.uint8)
    # The name says nothing about compression: the reader decides from the content.
    tensor = read_idx(write(tmp_path / "file", idx_bytes(array), gz))
    assert tensor.dtype == torch.uint8
    assert tensor.shape == array.shape
    assert torch.equal(tensor, array)


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
def test_zero_items_is_an_empty_tensor(tmp_path, gz):
    tensor = read_idx(write(tmp_path / "empty", idx_bytes(torch.empty(0, 28, 28, dtype=torch.uint8)), gz))
    assert tensor.shape == (0, 28, 28) and tensor.dtype == torch.uint8


def test_result_is_writable_and_owned(tmp_path):
    # frombuffer over a bytearray: in-place ops must work and must not touch the file.
    path = write(tmp_path / "f", idx_bytes(torch.zeros(2, 2, dtype=torch.uint8)), gz=False)
    tensor = read_idx(path)
    tensor.add_(1)
    assert torch.equal(read_idx(path), torch.zeros(2, 2, dtype=torch.uint8))


@pytest.mark.parametrize("gz", [False, True], ids=["raw", "gz"])
@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda b: b[:-1], "truncated: "),
        (lambda b: b[:18], "truncated: "),  # inside the data (header is 16 bytes)
        (lambda b: b[:6], "truncated IDX header"),  # inside the dims
        (lambda b: b + b"\x00", "has trailing bytes"),
        (lambda b: b"\x01\x00" + b[2:], "not an IDX file"),
        (lambda b: b[:3] + b"\x00" + b[4:], "not an IDX file"),  # ndim 0
        (lambda b: b[:2] + b"\x0d" + b[3:], "element type 0x0d is not supported"),  # float32
        (lambda b: b"", "too short to be an IDX file (0 bytes)"),
        (lambda b: b[:3], "too short to be an IDX file (3 bytes)"),
    ],
    ids=["short-by-one", "short-data", "short-header", "trailing", "magic", "ndim0", "type", "empty", "3-bytes"],
)
def test_malformed_files_are_rejected_with_the_fix(tmp_path, gz, mutate, expected):
    good = idx_bytes(torch.arange(24, dtype=torch.uint8).reshape(2, 3, 4))
    path = write(tmp_path / "bad", mutate(good), gz)
    with pytest.raises(UserError) as err:
        read_idx(path)
    assert expected in str(err.value)
    assert str(path) in str(err.value)
    assert "hpctrain download" in str(err.value)


def test_truncated_gzip_stream(tmp_path):
    data = gzip.compress(idx_bytes(torch.randint(0, 256, (50, 28, 28), dtype=torch.uint8)))
    path = write(tmp_path / "cut.gz", data[: len(data) // 2], gz=False)
    with pytest.raises(UserError, match="corrupt gzip file.*hpctrain download"):
        read_idx(path)


def test_gzip_with_trailing_garbage(tmp_path):
    data = gzip.compress(idx_bytes(torch.zeros(3, dtype=torch.uint8))) + b"garbage"
    with pytest.raises(UserError, match="corrupt gzip file"):
        read_idx(write(tmp_path / "junk.gz", data, gz=False))


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(UserError, match="no such file.*hpctrain download"):
        read_idx(tmp_path / "absent")
    with pytest.raises(UserError, match="cannot be read"):
        read_idx(tmp_path)


# ---------------------------------------------------------------- load_dataset on the real files


def test_load_dataset_real_fashion_mnist(fashion_data_dir):
    data = load_dataset("fashion-mnist", fashion_data_dir)
    assert set(data) == {"train_images", "train_labels", "test_images", "test_labels"}
    for split, n in (("train", 60_000), ("test", 10_000)):
        images, labels = data[f"{split}_images"], data[f"{split}_labels"]
        assert images.dtype == torch.uint8 and images.shape == (n, 28, 28)
        assert labels.dtype == torch.int64 and labels.shape == (n,)
        assert int(labels.min()) == 0 and int(labels.max()) == 9
        # Fashion-MNIST is balanced: every class has exactly a tenth of each split.
        assert torch.equal(torch.bincount(labels), torch.full((10,), n // 10))
    assert int(data["train_images"].max()) == 255  # real pixels, not zeros


def test_load_dataset_matches_torchvision_reader(fashion_data_dir, tmp_path):
    """Cross-check against torchvision's own FashionMNIST loader on the same files (its raw/ layout)."""
    torchvision = pytest.importorskip("torchvision")
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for path in (fashion_data_dir / "fashion-mnist").iterdir():
        with gzip.open(path) as src, open(raw / path.name.removesuffix(".gz"), "wb") as dst:
            shutil.copyfileobj(src, dst)
    ours = load_dataset("fashion-mnist", tmp_path)  # found through torchvision's layout
    theirs = torchvision.datasets.FashionMNIST(str(tmp_path), train=False, download=False)
    assert torch.equal(ours["test_images"], theirs.data)
    assert torch.equal(ours["test_labels"], theirs.targets)


def test_find_dataset_files_layouts(fashion_data_dir, tmp_path):
    spec = get_dataset_spec("fashion-mnist")
    names = [f.archive_name for f in spec.files.values()]
    for layout in ("fashion-mnist", ".", "FashionMNIST/raw"):
        root = tmp_path / layout.replace("/", "_").strip(".") / "data"
        target = root / layout
        target.mkdir(parents=True)
        for name in names:
            (target / name).symlink_to(fashion_data_dir / "fashion-mnist" / name)
        found = find_dataset_files(spec, root)
        assert {p.name for p in found.values()} == set(names)
        assert all(p.parent == target.resolve() or p.parent == target for p in found.values())


def test_missing_dataset_names_the_download_command(tmp_path):
    with pytest.raises(UserError) as err:
        load_dataset("fashion-mnist", tmp_path)
    message = str(err.value)
    assert f"hpctrain download fashion-mnist --data-dir {tmp_path}" in message
    assert "FashionMNIST/raw/" in message  # says where it looked


def test_partial_dataset_names_the_missing_files(fashion_data_dir, tmp_path):
    target = tmp_path / "fashion-mnist"
    target.mkdir()
    name = "train-images-idx3-ubyte.gz"
    (target / name).symlink_to(fashion_data_dir / "fashion-mnist" / name)
    with pytest.raises(UserError, match="lacks train-labels-idx1-ubyte.gz, t10k-images"):
        load_dataset("fashion-mnist", tmp_path)


def test_unknown_dataset(tmp_path):
    with pytest.raises(UserError, match="unknown dataset 'cifar'; choose one of: mnist, fashion-mnist"):
        load_dataset("cifar", tmp_path)


def test_images_and_labels_that_do_not_belong_together(tmp_path):
    target = tmp_path / "fashion-mnist"
    target.mkdir()
    spec = get_dataset_spec("fashion-mnist")
    sizes = {"train_images": (5, 28, 28), "train_labels": (4,), "test_images": (2, 28, 28), "test_labels": (2,)}
    for role, shape in sizes.items():
        write(target / spec.files[role].archive_name, idx_bytes(torch.zeros(shape, dtype=torch.uint8)), gz=True)
    with pytest.raises(UserError, match="has 5 images but .* has 4 labels.*hpctrain download fashion-mnist"):
        load_dataset("fashion-mnist", tmp_path)


# ---------------------------------------------------------------- bounded reading: the header's size, not the stream's


def _gzip_of_header_then_zeros(path, shape, zeros: int) -> Path:
    """A gzip file: an IDX header declaring `shape`, then `zeros` zero bytes (compressed about 1000-fold)."""
    import zlib

    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip framing
    block = bytes(1 << 20)
    with open(path, "wb") as out:
        out.write(compressor.compress(struct.pack(">HBB", 0, 8, len(shape)) + struct.pack(f">{len(shape)}I", *shape)))
        for _ in range(zeros // len(block)):
            out.write(compressor.compress(block))
        out.write(compressor.flush())
    return path


def test_a_decompression_bomb_is_read_only_as_far_as_its_header_declares(tmp_path):
    """128 MiB of zeros behind a header declaring 7,840 bytes: refused after reading about what the header
    declares (the peak of Python allocations while reading stays far below what the stream would expand to)."""
    import tracemalloc

    path = _gzip_of_header_then_zeros(tmp_path / "bomb.gz", (10, 28, 28), 128 << 20)
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(UserError, match="has trailing bytes.*7856"):
            read_idx(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"reading allocated {peak} bytes at its peak"


def test_a_header_promising_more_than_the_file_can_hold_is_refused_before_reading(tmp_path):
    path = _gzip_of_header_then_zeros(tmp_path / "liar.gz", (1 << 20, 1 << 20), 0)
    with pytest.raises(UserError, match=r"implies 1099511627788 bytes, more than the file can hold.*hpctrain download"):
        read_idx(path)
    raw = tmp_path / "liar"
    raw.write_bytes(struct.pack(">HBBI", 0, 8, 1, 1000) + bytes(10))
    with pytest.raises(UserError, match="implies 1008 bytes, more than the file can hold"):
        read_idx(raw)
