"""Where `hpctrain web` listens (hpctrain.web.listen) and what it refuses: a non-loopback address, a socket directory
another user can enter or that is not ours; by default a Unix socket in a 0700 directory, which another local user
cannot connect to (tried for real as a second Unix user when the tests run as root). And without the `web` extra,
the command says in one line how to install it."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.errors import UserError
from hpctrain.web import listen

OTHER_USER = "hpctrain-web-other"
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "::", "example.org", "10.0.0.1"])
def test_a_non_loopback_host_is_refused_with_the_reason(capsys, monkeypatch, host):
    def bind(address):  # were the check to let it through, fail here rather than serve on it
        raise AssertionError(f"bound {address}")

    monkeypatch.setattr(listen, "bind", bind)
    assert main(["web", "--port", "8080", "--host", host]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert f"--host {host}" in err
    assert "loopback" in err


@pytest.mark.parametrize(("host", "bound"), [("127.0.0.1", "127.0.0.1"), ("::1", "::1"), ("localhost", "127.0.0.1")])
def test_loopback_hosts_are_accepted(host, bound):
    assert listen.check_loopback(host) == bound


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--host", "127.0.0.1"], "--host needs --port"),
        (["--port", "0"], "out of range"),
        (["--port", "8080", "--socket", "/tmp/x.sock"], "choose one"),
        (["--port", "8080", "--interval", "0"], "--interval"),
    ],
)
def test_bad_combinations_are_one_line(capsys, argv, said):
    assert main(["web", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and "\n" not in err


@pytest.fixture
def short_tmp():
    """A folder with a short path: a Unix socket's path is at most 107 bytes, which pytest's tmp_path under CI's
    folders can pass by itself."""
    folder = Path(tempfile.mkdtemp(prefix="hw-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_default_socket_is_in_a_private_directory(short_tmp):
    tmp_path = short_tmp
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o755)
    address = listen.socket_address(None, {"XDG_RUNTIME_DIR": str(runtime), "HOME": str(tmp_path)})
    assert address.socket_path.parent == runtime / "hpctrain-web"
    assert stat.S_IMODE(os.lstat(address.socket_path.parent).st_mode) == 0o700
    sock = listen.bind(address)
    try:
        assert stat.S_IMODE(os.lstat(address.socket_path).st_mode) == 0o600
    finally:
        sock.close()
    # without XDG_RUNTIME_DIR: under ~/.hpctrain/web
    home = listen.socket_address(None, {"HOME": str(tmp_path)})
    assert home.socket_path.parent == tmp_path / ".hpctrain" / "web"
    assert stat.S_IMODE(os.lstat(home.socket_path.parent).st_mode) == 0o700


def test_a_socket_directory_others_can_enter_is_refused_not_loosened_or_fixed(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    with pytest.raises(UserError, match=r"can be entered by other users \(mode 755\): `chmod 700"):
        listen.socket_address(shared / "console.sock")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755


def test_a_link_in_place_of_the_directory_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(UserError, match="is not a directory"):
        listen.socket_address(tmp_path / "link" / "console.sock")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_socket_directory_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(UserError, match="belongs to another user"):
        listen.socket_address(theirs / "console.sock")


def test_without_the_web_extra_the_command_says_how_to_install_it():
    """uvicorn made unimportable (as when the extra is not installed): one line, exit 2, no traceback."""
    code = "import sys; sys.modules['uvicorn'] = None; from hpctrain.cli import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run(
        [sys.executable, "-c", code, "web", "--port", "8080"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "hpctrain web: error: the web console (hpctrain web) needs the Python package 'uvicorn', which is not "
        "installed here: pip install 'hpctrain[web]'"
    )


def start_console(environ: dict[str, str]) -> tuple[subprocess.Popen[str], Path]:
    """`hpctrain web` on its default Unix socket; the socket path from the lines it prints."""
    process = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", "web", "--scheduler", "slurm"],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = process.stdout.readline()
    if not first.startswith("hpctrain web: listening on "):
        process.kill()
        pytest.fail(f"hpctrain web did not start: {first}{process.stderr.read()}")
    path = Path(first.split("listening on ", 1)[1].split(" (")[0])
    ssh_line = process.stdout.readline()
    assert f"ssh -N -L 8080:{path} " in ssh_line
    assert "?token=" in process.stdout.readline()
    return process, path


def connect_as(user: str | None, path: Path) -> str:
    """What `user` (None: this one) gets when connecting to the socket and asking for /: the status line, or the
    error of connect()."""
    probe = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect(sys.argv[1])\n"
        "except OSError as err:\n"
        "    print(type(err).__name__); sys.exit()\n"
        "s.sendall(b'GET / HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n')\n"
        "print(s.recv(200).decode().splitlines()[0])\n"
    )
    argv = [sys.executable, "-I", "-c", probe, str(path)]
    if user is not None:  # the system's Python: this one may be under a home directory the user cannot enter
        argv = ["runuser", "-u", user, "--", SYSTEM_PYTHON, *argv[1:]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout.strip()


@pytest.fixture
def other_user() -> str:
    if os.geteuid() != 0:
        pytest.skip("trying the socket as a second Unix user needs root (useradd, runuser)")
    if shutil.which("useradd") is None or shutil.which("runuser") is None or not Path(SYSTEM_PYTHON).is_file():
        pytest.fail(f"useradd, runuser and {SYSTEM_PYTHON} are needed to try the socket as another user")
    try:
        pwd.getpwnam(OTHER_USER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/false", OTHER_USER], check=True)
    return OTHER_USER


def test_another_local_user_cannot_connect_to_the_console(other_user):
    """The console as root on its default socket under a runtime directory everyone may traverse: root is served
    (401, no token), the second user's connect() is refused. Opened up (the directory 0755, the socket 0666) the
    same probe connects, which shows it would see a console that let it in."""
    base = Path(tempfile.mkdtemp(prefix="hpctrain-web-test-"))
    base.chmod(0o755)
    environ = {**os.environ, "XDG_RUNTIME_DIR": str(base)}
    process, path = start_console(environ)
    try:
        assert path.parent == base / "hpctrain-web"
        deadline = time.monotonic() + 60
        while not path.is_socket() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert connect_as(None, path) == "HTTP/1.1 401 Unauthorized"
        assert connect_as(other_user, path) == "PermissionError"
        path.parent.chmod(0o755)
        path.chmod(0o666)
        assert connect_as(other_user, path) == "HTTP/1.1 401 Unauthorized"
    finally:
        process.terminate()
        process.wait(timeout=60)
        shutil.rmtree(base, ignore_errors=True)
    assert not path.exists(), "the console leaves its socket behind"


def test_the_console_on_a_port_listens_on_loopback_only():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sock = listen.bind(listen.Address(host="127.0.0.1", port=port))
    try:
        assert sock.getsockname() == ("127.0.0.1", port)
    finally:
        sock.close()


def test_the_console_serves_every_scheduler_found_here(tmp_path):
    """hpctrain.schedulers.available: detect's rule, every match in its order (detect takes the first)."""
    from hpctrain.schedulers import available, detect

    config = tmp_path / "config"
    config.write_text("{}")
    both = ({"KUBECONFIG": str(config)}, lambda name: "/usr/bin/sbatch")
    assert available(*both) == ["slurm", "kubernetes"]
    assert detect(*both) == "slurm"
    assert available({"KUBECONFIG": str(config)}, lambda name: None) == ["kubernetes"]
    assert available({"HOME": str(tmp_path / "nobody")}, lambda name: None) == []
