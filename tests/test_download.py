"""`hpctrain download` against real HTTP servers on 127.0.0.1 serving the real Fashion-MNIST files.

Edge cases that need many downloads use a tiny dataset spec (a few kB of real IDX data with its own
checksums) so the suite stays fast; the main paths run the real CLI on the real files.
"""

from __future__ import annotations

import gzip
import hashlib
import http.server
import os
import pty
import signal
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpctrain.cli.download_progress import PlainReporter
from hpctrain.data import DatasetSpec, FileSpec, ROLES, check_file, download, get_dataset_spec, load_dataset
from hpctrain.data.download import normalize_mirror
from hpctrain.errors import UserError
from training_helpers import run_hpctrain

FASHION = get_dataset_spec("fashion-mnist")
NAMES = [FASHION.files[role].archive_name for role in ROLES]


def run_cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return run_hpctrain("download", *args, env=env, timeout=120, **kwargs)


def closed_port_url() -> str:
    """A URL whose port nothing listens on: connections are refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


def leftovers(directory: Path) -> list[str]:
    """Temporary or partial files a download could leave behind."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".") or p.name.endswith(".part"))


def corrupt_copy(source: Path, target: Path, names=NAMES) -> Path:
    """Copies with one byte flipped in the middle of each file (gzip CRC/deflate errors)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        data = bytearray((source / name).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (target / name).write_bytes(bytes(data))
    return target


# ---------------------------------------------------------------- a tiny dataset with real checksums


def tiny_dataset(directory: Path) -> DatasetSpec:
    """Four small IDX files written gzipped into `directory`, and a spec carrying their real md5s."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for i, role in enumerate(ROLES):
        ndim = 3 if role.endswith("images") else 1
        shape = (5, 3, 3)[:ndim]
        raw = bytes([0, 0, 8, ndim]) + b"".join(n.to_bytes(4, "big") for n in shape)
        raw += bytes((i * 7 + k) % 256 for k in range(5 * (9 if ndim == 3 else 1)))
        archive = gzip.compress(raw, mtime=0)
        name = f"tiny-{role}"
        (directory / (name + ".gz")).write_bytes(archive)
        files[role] = FileSpec(name, hashlib.md5(archive).hexdigest(), hashlib.md5(raw).hexdigest(), len(raw))
    return DatasetSpec(name="tiny", files=files, mirrors=())


class _Misbehaving(http.server.BaseHTTPRequestHandler):
    """Serves files from `root`, misbehaving as `mode` says."""

    root: Path
    mode: str
    log: list[str]
    sent: list[int]  # bytes written per request, for the modes that stream without end
    authorization: list[str | None]  # the Authorization header of each request

    def do_GET(self) -> None:
        self.log.append(self.path)
        self.authorization.append(self.headers.get("Authorization"))
        if self.mode in ("endless", "huge-length"):  # a misconfigured server streaming zeros, bounded for the test
            self.sent.append(0)
            self.send_response(200)
            if self.mode == "huge-length":
                self.send_header("Content-Length", str(10**12))
            self.send_header("Connection", "close")
            self.end_headers()
            block = bytes(1 << 16)
            try:
                while self.sent[-1] < 64 << 20:
                    self.wfile.write(block)
                    self.sent[-1] += len(block)
            except OSError:  # the client stopped reading
                pass
            self.close_connection = True
            return
        path = self.root / self.path.lstrip("/")
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        self.send_response(200)
        if self.mode == "short":  # announces the full length, sends half, closes
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
        elif self.mode == "unannounced":  # no Content-Length, closes after half: only the checksum can tell
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
        elif self.mode == "slow":  # trickles the file out, so a client can be killed mid-transfer
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                for start in range(0, len(data), 1 << 16):
                    self.wfile.write(data[start : start + (1 << 16)])
                    self.wfile.flush()
                    time.sleep(0.02)
            except OSError:  # the client went away
                return
        elif self.mode == "trickle":  # one byte per 50 ms, never silent for a whole --timeout; at most 200 bytes
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                for i in range(min(len(data), 200)):
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                return
        elif self.mode == "html":  # a captive portal or login page
            body = b"<html><body>Please log in</body></html>"
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, format: str, *args) -> None:
        pass


@pytest.fixture
def misbehaving_server():
    """start(root, mode) -> (base URL, requested paths); start.handlers[-1] has .sent and .authorization."""
    servers = []
    handlers: list[type[_Misbehaving]] = []

    def start(root: Path, mode: str) -> tuple[str, list[str]]:
        log: list[str] = []
        handler = type("H", (_Misbehaving,), {"root": root, "mode": mode, "log": log, "sent": [], "authorization": []})
        handlers.append(handler)
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/", log

    start.handlers = handlers
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- the real CLI on the real files


def test_cli_downloads_verifies_then_skips_without_requests(tmp_path, http_mirror, fashion_mnist_source):
    url = http_mirror(fashion_mnist_source)
    result = run_cli("fashion-mnist", "--data-dir", str(tmp_path), "--mirror", url)
    assert result.returncode == 0, result.stderr
    target = tmp_path / "fashion-mnist"
    assert sorted(p.name for p in target.iterdir()) == sorted(NAMES)
    for role in ROLES:
        assert check_file(target / FASHION.files[role].archive_name, FASHION.files[role]) is None
    assert sorted(http_mirror.requests(url)) == sorted("/" + n for n in NAMES)
    assert "4 files verified" in result.stdout
    # Not a terminal: one plain line per event, never a redrawn bar.
    assert "\r" not in result.stderr and "\x1b[" not in result.stderr
    assert result.stderr.count("downloading http://127.0.0.1") == 4
    assert result.stderr.count(", verified") == 4

    again = run_cli("fashion-mnist", "--data-dir", str(tmp_path), "--mirror", url)
    assert again.returncode == 0, again.stderr
    assert len(http_mirror.requests(url)) == 4  # no request at all the second time
    assert again.stderr.count("already present and verified") == 4
    assert load_dataset("fashion-mnist", tmp_path)["train_images"].shape == (60_000, 28, 28)


@pytest.mark.floor  # torchvision's oldest supported MNIST classes read the same layout
def test_cli_download_is_what_torchvisions_fashion_mnist_loads_offline(tmp_path, http_mirror, fashion_mnist_source):
    """The cluster guides' scripts use torchvision.datasets.FashionMNIST(root): after `hpctrain download` it loads
    with download=False (an offline node), the same images and labels hpctrain loads; the archives are hard links,
    not second copies; a bad file in torchvision's folder is moved aside and written anew."""
    torchvision = pytest.importorskip("torchvision")
    url = http_mirror(fashion_mnist_source)
    assert run_cli("fashion-mnist", "--data-dir", str(tmp_path), "--mirror", url).returncode == 0
    raw = tmp_path / "FashionMNIST" / "raw"
    for name in NAMES:  # one file on disk under two names
        assert (raw / name).stat().st_ino == (tmp_path / "fashion-mnist" / name).stat().st_ino
    ours = load_dataset("fashion-mnist", tmp_path)
    for train, split in ((True, "train"), (False, "test")):
        theirs = torchvision.datasets.FashionMNIST(str(tmp_path), train=train, download=False)
        assert theirs.data.equal(ours[f"{split}_images"]) and theirs.targets.equal(ours[f"{split}_labels"])

    damaged = raw / "t10k-labels-idx1-ubyte"
    damaged.write_bytes(damaged.read_bytes()[:-1])
    again = run_cli("fashion-mnist", "--data-dir", str(tmp_path), "--mirror", url)
    assert again.returncode == 0, again.stderr
    assert len(http_mirror.requests(url)) == 4  # the verified archives were used, not fetched again
    assert (raw / "t10k-labels-idx1-ubyte.corrupt").stat().st_size == 10_007
    assert f"FashionMNIST(root={tmp_path}) reads them from {raw}/" in again.stderr
    assert torchvision.datasets.FashionMNIST(str(tmp_path), train=False).targets.equal(ours["test_labels"])
    assert leftovers(raw) == []


def test_cli_corrupt_first_mirror_falls_back_to_second(tmp_path, http_mirror, fashion_mnist_source):
    bad = http_mirror(corrupt_copy(fashion_mnist_source, tmp_path / "bad-mirror"))
    good = http_mirror(fashion_mnist_source)
    data_dir = tmp_path / "data"
    result = run_cli("fashion-mnist", "--data-dir", str(data_dir), "--mirror", bad, "--mirror", good)
    assert result.returncode == 0, result.stderr
    assert len(http_mirror.requests(bad)) == 4 and len(http_mirror.requests(good)) == 4
    assert result.stderr.count("trying the next mirror") == 4
    assert "corrupt gzip data" in result.stderr
    target = data_dir / "fashion-mnist"
    assert leftovers(target) == []
    for role in ROLES:  # what sits under the final names is the good copy
        final = target / FASHION.files[role].archive_name
        assert final.read_bytes() == (fashion_mnist_source / final.name).read_bytes()


def test_cli_nothing_reachable_says_how_to_fetch_elsewhere(tmp_path):
    data_dir = tmp_path / "data"
    result = run_cli("fashion-mnist", "--data-dir", str(data_dir), "--mirror", closed_port_url(), "--timeout", "5")
    assert result.returncode == 2
    assert result.stdout == ""
    message = result.stderr
    assert message.startswith("warning: fashion-mnist: http://127.0.0.1:")
    assert "hpctrain download: error: could not download fashion-mnist file train-images-idx3-ubyte.gz" in message
    assert "cannot connect" in message
    assert "fetch the 4 files on a machine that has it" in message
    assert f"copy them into {data_dir / 'fashion-mnist'}/" in message
    assert f"--data-dir {data_dir}" in message and "--mirror" in message
    assert "Traceback" not in message
    assert leftovers(data_dir / "fashion-mnist") == [] and not any((data_dir / "fashion-mnist").iterdir())


def test_cli_mirror_may_be_a_plain_directory(tmp_path, fashion_mnist_source):
    # A relative path, as a user on a login node would type it.
    (tmp_path / "copies").mkdir()
    for name in NAMES:
        os.symlink(fashion_mnist_source / name, tmp_path / "copies" / name)
    result = run_cli("fashion-mnist", "--data-dir", "out", "--mirror", "copies", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "downloading file:///" in result.stderr
    assert sorted(p.name for p in (tmp_path / "out" / "fashion-mnist").iterdir()) == sorted(NAMES)


def test_cli_progress_bar_on_a_terminal(tmp_path, http_mirror, fashion_mnist_source):
    """stderr on a pseudo-terminal: rich draws a progress bar (redrawn in place) instead of plain lines."""
    url = http_mirror(fashion_mnist_source)
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "download", "fashion-mnist", "--data-dir", str(tmp_path), "--mirror", url],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:  # keep reading, or the child blocks on a full terminal buffer
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its side
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    stdout, _ = proc.communicate(timeout=120)
    reader.join(timeout=10)
    os.close(master)
    terminal = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, terminal
    assert b"4 files verified" in stdout
    assert "━" in terminal  # the bar itself
    assert "fashion-mnist/train-images-idx3-ubyte.gz" in terminal
    assert "\x1b[" in terminal  # cursor movement: redrawn in place
    assert "downloading http://" not in terminal  # not the plain lines


# ---------------------------------------------------------------- failure paths, in-process on a tiny dataset


def test_interrupted_transfer_leaves_nothing_that_looks_complete(tmp_path, misbehaving_server):
    spec = tiny_dataset(tmp_path / "src")
    for mode, expected in (("short", "incomplete transfer|transfer failed"), ("unannounced", "truncated gzip data")):
        url, log = misbehaving_server(tmp_path / "src", mode)
        data_dir = tmp_path / mode
        with pytest.raises(UserError, match=expected) as err:
            download(spec, data_dir, [url], reporter=PlainReporter(spec.name))
        assert "could not download tiny file tiny-train_images.gz" in str(err.value)
        assert log == ["/tiny-train_images.gz"]
        assert list((data_dir / "tiny").iterdir()) == []  # no final file, no partial file


def test_interrupted_then_good_mirror(tmp_path, misbehaving_server, http_mirror, capsys):
    spec = tiny_dataset(tmp_path / "src")
    short, _ = misbehaving_server(tmp_path / "src", "short")
    good = http_mirror(tmp_path / "src")
    paths = download(spec, tmp_path / "data", [short, good], reporter=PlainReporter(spec.name))
    assert [p.name for p in paths] == [spec.files[r].archive_name for r in ROLES]
    assert all(check_file(p, spec.files[r]) is None for p, r in zip(paths, ROLES))
    assert leftovers(tmp_path / "data" / "tiny") == []
    assert capsys.readouterr().err.count("trying the next mirror") == 4


@pytest.mark.parametrize("kind", ["refused", "404", "html", "wrong-content", "timeout"])
def test_bad_mirror_then_good_mirror(tmp_path, kind, misbehaving_server, http_mirror, capsys):
    spec = tiny_dataset(tmp_path / "src")
    listener = None
    if kind == "refused":
        bad = closed_port_url()
    elif kind == "404":
        (tmp_path / "empty").mkdir()
        bad = http_mirror(tmp_path / "empty")
    elif kind == "html":
        bad, _ = misbehaving_server(tmp_path / "src", "html")
    elif kind == "wrong-content":  # valid gzip of the wrong data: only the checksum can tell
        other = tmp_path / "other"
        other.mkdir()
        for role in ROLES:
            name = spec.files[role].archive_name
            (other / name).write_bytes(gzip.compress(b"\0\0\x08\x01\0\0\0\x01x"))
        bad = http_mirror(other)
    else:  # accepts the connection (kernel backlog) but never answers
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        bad = f"http://127.0.0.1:{listener.getsockname()[1]}/"
    good = http_mirror(tmp_path / "src")
    try:
        download(spec, tmp_path / "data", [bad, good], reporter=PlainReporter(spec.name), timeout=0.5)
    finally:
        if listener is not None:
            listener.close()
    err = capsys.readouterr().err
    expected = {
        "refused": "cannot connect",
        "404": "HTTP error 404",
        "html": "HTML/XML page instead of the data file",
        "wrong-content": "checksum mismatch: decompressed md5",
        "timeout": "timed out after 0.5 s (raise it with --timeout)",
    }[kind]
    assert err.count(expected) == 4, err
    target = tmp_path / "data" / "tiny"
    assert sorted(p.name for p in target.iterdir()) == sorted(spec.files[r].archive_name for r in ROLES)
    assert all(check_file(target / spec.files[r].archive_name, spec.files[r]) is None for r in ROLES)


def test_every_mirror_corrupt_leaves_no_file(tmp_path, http_mirror):
    spec = tiny_dataset(tmp_path / "src")
    bad1 = http_mirror(corrupt_copy(tmp_path / "src", tmp_path / "bad1", [spec.files[r].archive_name for r in ROLES]))
    bad2 = http_mirror(corrupt_copy(tmp_path / "src", tmp_path / "bad2", [spec.files[r].archive_name for r in ROLES]))
    with pytest.raises(UserError) as err:
        download(spec, tmp_path / "data", [bad1, bad2], reporter=PlainReporter(spec.name))
    assert str(err.value).count("corrupt gzip data") == 2  # both attempts listed
    assert list((tmp_path / "data" / "tiny").iterdir()) == []


def test_present_files_in_any_valid_form_are_kept(tmp_path, http_mirror):
    """Published archive, a recompressed archive, or an uncompressed copy: all verified, none fetched."""
    spec = tiny_dataset(tmp_path / "src")
    target = tmp_path / "data" / "tiny"
    target.mkdir(parents=True)
    archives = [spec.files[r].archive_name for r in ROLES]
    shutil.copy(tmp_path / "src" / archives[0], target)  # the published bytes
    raw1 = gzip.decompress((tmp_path / "src" / archives[1]).read_bytes())
    (target / archives[1]).write_bytes(gzip.compress(raw1, compresslevel=1, mtime=123))  # recompressed
    raw2 = gzip.decompress((tmp_path / "src" / archives[2]).read_bytes())
    (target / spec.files[ROLES[2]].name).write_bytes(raw2)  # uncompressed
    raw3 = gzip.decompress((tmp_path / "src" / archives[3]).read_bytes())
    half = len(raw3) // 2
    (target / archives[3]).write_bytes(gzip.compress(raw3[:half]) + gzip.compress(raw3[half:]))  # two members
    url = http_mirror(tmp_path / "src")
    paths = download(spec, tmp_path / "data", [url], reporter=PlainReporter(spec.name))
    assert http_mirror.requests(url) == []
    assert paths[2].name == spec.files[ROLES[2]].name


def test_invalid_present_file_is_moved_aside_and_replaced(tmp_path, http_mirror, capsys):
    spec = tiny_dataset(tmp_path / "src")
    target = tmp_path / "data" / "tiny"
    target.mkdir(parents=True)
    name = spec.files["train_labels"].archive_name
    (target / name).write_bytes(b"not the file")
    url = http_mirror(tmp_path / "src")
    download(spec, tmp_path / "data", [url], reporter=PlainReporter(spec.name))
    assert sorted(http_mirror.requests(url)) == sorted("/" + spec.files[r].archive_name for r in ROLES)
    assert check_file(target / name, spec.files["train_labels"]) is None
    assert (target / (name + ".corrupt")).read_bytes() == b"not the file"
    assert "moved it to tiny-train_labels.gz.corrupt" in capsys.readouterr().err


def test_invalid_present_file_never_stays_under_its_name_when_mirrors_fail(tmp_path):
    spec = tiny_dataset(tmp_path / "src")
    target = tmp_path / "data" / "tiny"
    target.mkdir(parents=True)
    name = spec.files["train_images"].archive_name
    data = bytearray((tmp_path / "src" / name).read_bytes())
    data[-5] ^= 1  # a bad CRC: the loader would fail later, the download check fails now
    (target / name).write_bytes(bytes(data))
    with pytest.raises(UserError, match="could not download"):
        download(spec, tmp_path / "data", [closed_port_url()], reporter=PlainReporter(spec.name))
    assert not (target / name).exists()
    assert (target / (name + ".corrupt")).exists()


def test_check_file_rejects_trailing_garbage_and_truncation(tmp_path):
    spec = tiny_dataset(tmp_path / "src")
    fspec = spec.files["train_images"]
    archive = (tmp_path / "src" / fspec.archive_name).read_bytes()
    (tmp_path / "junk.gz").write_bytes(archive + b"junk")
    assert "corrupt gzip data" in check_file(tmp_path / "junk.gz", fspec)
    (tmp_path / "cut.gz").write_bytes(archive[:-9])
    assert check_file(tmp_path / "cut.gz", fspec) == "truncated gzip data"
    (tmp_path / "empty").write_bytes(b"")
    assert "checksum mismatch" in check_file(tmp_path / "empty", fspec)


def test_real_files_checksums(fashion_mnist_source):
    """The published raw md5s match Debian's recompressed copies (their archive md5s differ)."""
    for role in ROLES:
        fspec = FASHION.files[role]
        assert check_file(fashion_mnist_source / fspec.archive_name, fspec) is None
    wrong = FASHION.files["train_labels"]
    assert "checksum mismatch" in check_file(fashion_mnist_source / FASHION.files["test_labels"].archive_name, wrong)
    # A longer file is refused once it decompresses past the published size, without reading the rest.
    shorter = FASHION.files["test_labels"]
    assert check_file(fashion_mnist_source / FASHION.files["train_labels"].archive_name, shorter) == (
        "decompresses to more than the published 10008 bytes"
    )


def test_mirror_validation(tmp_path):
    assert normalize_mirror("http://host/path") == "http://host/path/"
    assert normalize_mirror("file:///srv/data/") == "file:///srv/data/"
    assert normalize_mirror(str(tmp_path)) == tmp_path.as_uri() + "/"
    for bad in ("ftp://host/", "host:8000/data", str(tmp_path / "nowhere")):
        with pytest.raises(UserError, match="is not an http://, https:// or file:// URL.*--mirror"):
            normalize_mirror(bad)


def test_cli_bad_arguments_exit_non_zero(tmp_path):
    result = run_cli("cifar", "--data-dir", str(tmp_path))
    assert result.returncode == 2 and "invalid choice: 'cifar'" in result.stderr
    result = run_cli("mnist", "--data-dir", str(tmp_path), "--mirror", "ftp://x/")
    assert result.returncode == 2 and "--mirror https://host/path/" in result.stderr
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_cli("mnist", "--data-dir", str(blocker), "--mirror", str(tmp_path))
    assert result.returncode == 2 and "pass --data-dir with a writable directory" in result.stderr


def start_download_until_bytes_arrive(data_dir, mirror: str, capture: bool) -> subprocess.Popen:
    """`hpctrain download fashion-mnist` from `mirror` in a subprocess, returned once its partial file has bytes."""
    output = (
        {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        if capture
        else {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hpctrain",
            "download",
            "fashion-mnist",
            "--data-dir",
            str(data_dir),
            "--mirror",
            mirror,
        ],
        **output,
    )
    target = data_dir / "fashion-mnist"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        parts = list(target.glob(".*.part")) if target.is_dir() else []
        if parts and parts[0].stat().st_size > 0:
            return proc
        time.sleep(0.05)
    proc.kill()
    proc.wait(timeout=30)
    pytest.fail("the download never started")


def test_cli_killed_mid_download_leaves_no_final_file(tmp_path, misbehaving_server, http_mirror, fashion_mnist_source):
    slow, _ = misbehaving_server(fashion_mnist_source, "slow")
    target = tmp_path / "fashion-mnist"
    proc = start_download_until_bytes_arrive(tmp_path, slow, capture=False)
    try:
        assert proc.poll() is None, "the download finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    names = [p.name for p in target.iterdir()]
    assert len(names) == 1 and names[0].startswith(".train-images-idx3-ubyte.gz.") and names[0].endswith(".part")
    with pytest.raises(UserError, match="not found"):
        load_dataset("fashion-mnist", tmp_path)

    # A fresh leftover may belong to a live download and is kept; an old one is removed by the next run.
    part = target / names[0]
    old = time.time() - 2 * 3600
    os.utime(part, (old, old))
    good = http_mirror(fashion_mnist_source)
    result = run_cli("fashion-mnist", "--data-dir", str(tmp_path), "--mirror", good)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in target.iterdir()) == sorted(NAMES)


def test_cli_rejects_a_non_positive_timeout(tmp_path):
    result = run_cli("fashion-mnist", "--data-dir", str(tmp_path), "--timeout", "0")
    assert result.returncode == 2 and "must be a positive number of seconds" in result.stderr
    assert not (tmp_path / "fashion-mnist").exists()


def test_an_installed_system_copy_is_used_before_the_network(tmp_path, http_mirror, fashion_mnist_source):
    """Debian's dataset-fashion-mnist package puts the files where the built-in spec looks first."""
    import dataclasses

    from hpctrain.data import download, get_dataset_spec

    web = http_mirror(tmp_path / "empty-web-mirror")
    (tmp_path / "empty-web-mirror").mkdir()
    spec = dataclasses.replace(
        get_dataset_spec("fashion-mnist"),
        mirrors=(web,),
        local_copies=(str(tmp_path / "not-installed"), str(fashion_mnist_source)),
    )
    paths = download(spec, tmp_path / "data", reporter=PlainReporter(spec.name))
    assert len(paths) == 4 and all(p.is_file() for p in paths)
    assert http_mirror.requests(web) == [], "the network was not needed"
    assert get_dataset_spec("fashion-mnist").local_copies == (str(fashion_mnist_source),)


# ---------------------------------------------------------------- hostile or unlucky mirrors and disks


@pytest.mark.parametrize("mode", ["endless", "huge-length"])
def test_a_mirror_streaming_without_end_is_cut_off(tmp_path, misbehaving_server, mode):
    spec = tiny_dataset(tmp_path / "src")
    url, _ = misbehaving_server(tmp_path / "src", mode)
    with pytest.raises(UserError) as err:
        download(spec, tmp_path / "data", [url], reporter=PlainReporter(spec.name))
    message = str(err.value)
    assert f"{url}tiny-train_images.gz: " in message  # names the mirror
    cap = 2 * spec.files["train_images"].raw_size + (64 << 10)
    if mode == "endless":
        assert f"sent more than {cap} bytes for a" in message
    else:
        assert f"announces 1000000000000 bytes, more than the {cap}" in message
    sent = misbehaving_server.handlers[-1].sent
    assert len(sent) == 1 and sent[0] < 64 << 20, "the client read the whole stream"
    assert list((tmp_path / "data" / "tiny").iterdir()) == []


def test_a_trickling_mirror_is_abandoned_below_the_minimum_rate(tmp_path, misbehaving_server, http_mirror, capsys):
    """One byte per 50 ms never trips the per-read timeout; the minimum rate over a --timeout window does."""
    spec = tiny_dataset(tmp_path / "src")
    slow, log = misbehaving_server(tmp_path / "src", "trickle")
    good = http_mirror(tmp_path / "src")
    paths = download(
        spec, tmp_path / "data", [slow, good], reporter=PlainReporter(spec.name), timeout=0.5, min_rate=1000
    )
    assert all(check_file(p, spec.files[r]) is None for p, r in zip(paths, ROLES))
    err = capsys.readouterr().err
    assert err.count(f"warning: tiny: {slow}tiny-") == 4
    assert err.count("bytes/s over") == 4 and "below --min-rate 1000; use a faster --mirror" in err
    assert leftovers(tmp_path / "data" / "tiny") == []


def test_cli_trickling_mirror_fails_with_the_fix(tmp_path, misbehaving_server, fashion_mnist_source):
    slow, _ = misbehaving_server(fashion_mnist_source, "trickle")
    result = run_cli(
        "fashion-mnist", "--data-dir", str(tmp_path), "--mirror", slow, "--timeout", "0.5", "--min-rate", "1000"
    )
    assert result.returncode == 2, result.stderr
    assert f"- {slow}train-images-idx3-ubyte.gz: too slow:" in result.stderr
    assert "lower --min-rate" in result.stderr and "Traceback" not in result.stderr
    assert leftovers(tmp_path / "fashion-mnist") == []
    bad = run_cli("fashion-mnist", "--data-dir", str(tmp_path), "--min-rate", "nan")
    assert bad.returncode == 2 and "--min-rate nan: must be a number of bytes per second >= 0" in bad.stderr


def test_cli_sigterm_removes_the_partial_download(tmp_path, misbehaving_server, fashion_mnist_source):
    slow, _ = misbehaving_server(fashion_mnist_source, "slow")
    target = tmp_path / "fashion-mnist"
    proc = start_download_until_bytes_arrive(tmp_path, slow, capture=True)
    try:
        assert proc.poll() is None, "the download finished before it could be terminated"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == 143, stderr
    assert stderr.splitlines()[-1] == "hpctrain download: terminated by SIGTERM; partial files removed"
    assert "Traceback" not in stderr
    assert list(target.iterdir()) == []


def test_a_directory_where_the_file_goes_is_a_clear_error(tmp_path, http_mirror):
    spec = tiny_dataset(tmp_path / "src")
    url = http_mirror(tmp_path / "src")
    blocker = tmp_path / "data" / "tiny" / spec.files["train_images"].archive_name
    (blocker / "inside").mkdir(parents=True)
    with pytest.raises(UserError) as err:
        download(spec, tmp_path / "data", [url], reporter=PlainReporter(spec.name))
    assert str(err.value) == (
        f"{blocker} is a directory, where the downloaded file must go; move or remove it, "
        "or pass --data-dir naming another directory"
    )
    assert http_mirror.requests(url) == []
    assert (blocker / "inside").is_dir()  # the user's directory is left alone


def test_cli_password_in_a_mirror_url_is_never_printed(tmp_path, misbehaving_server, fashion_mnist_source):
    secret = "s3cr%40t"  # percent-encoded '@', as a URL carries it
    refused = closed_port_url().replace("http://", f"http://alice:{secret}@")
    result = run_cli("fashion-mnist", "--data-dir", str(tmp_path), "--mirror", refused, "--timeout", "5")
    assert result.returncode == 2
    assert "s3cr" not in result.stderr and "alice:***@127.0.0.1" in result.stderr
    result = run_cli("fashion-mnist", "--data-dir", str(tmp_path), "--mirror", f"ftp://alice:{secret}@host/")
    assert result.returncode == 2 and "s3cr" not in result.stderr and "ftp://alice:***@host/" in result.stderr

    # The credentials are used (HTTP Basic authentication), only never shown.
    import base64

    url, _ = misbehaving_server(tmp_path / "nothing-here", "short")
    result = run_cli(
        "fashion-mnist", "--data-dir", str(tmp_path), "--mirror", url.replace("http://", f"http://alice:{secret}@")
    )
    assert result.returncode == 2 and "HTTP error 404" in result.stderr
    assert "s3cr" not in result.stderr and result.stderr.count("alice:***@127.0.0.1") >= 2
    sent = misbehaving_server.handlers[-1].authorization
    assert sent and set(sent) == {"Basic " + base64.b64encode(b"alice:s3cr@t").decode()}


@pytest.fixture
def full_disk(tmp_path):
    """A 1 MiB tmpfs: writing a dataset file into it fails with ENOSPC (needs root, as CI runs)."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill up (needs root): {result.stderr.strip()}")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


def test_cli_full_disk_says_so_and_where(full_disk, http_mirror, fashion_mnist_source):
    first = http_mirror(fashion_mnist_source)
    second = http_mirror(fashion_mnist_source)
    result = run_cli("fashion-mnist", "--data-dir", str(full_disk), "--mirror", first, "--mirror", second)
    assert result.returncode == 2
    error = result.stderr.splitlines()[-1]
    assert error.startswith(
        f"hpctrain download: error: cannot write train-images-idx3-ubyte.gz into {full_disk / 'fashion-mnist'}: "
        "the file system is full (No space left on device"
    )
    assert "free space there, or pass --data-dir on a file system with room" in error
    assert "internet" not in result.stderr and "warning" not in result.stderr and "Traceback" not in result.stderr
    assert http_mirror.requests(second) == []  # no other mirror can fix a full disk
    assert list((full_disk / "fashion-mnist").iterdir()) == []  # the partial file is gone


@pytest.mark.parametrize(
    "text,shown",
    [
        ("http://alice:s3cret@host/x", "http://alice:***@host/x"),
        ("http://alice:p@ss@host:8080/x y", "http://alice:***@host:8080/x y"),  # an unencoded @ in the password
        ("a https://u:pw@h/a and file://v:q@k/b", "a https://u:***@h/a and file://v:***@k/b"),
        ("http://host/a:b@c", "http://host/a:b@c"),  # no credentials, only a path
    ],
)
def test_redact(text, shown):
    from hpctrain.data.download import redact

    assert redact(text) == shown
