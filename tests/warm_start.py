"""Run `python -m hpctrain ARGS` for a test without paying for `import torch` each time: a warm process.

Test-harness only; hpctrain itself never uses this. Importing torch and torch._dynamo (which the first optimizer
imports) costs about 3.8 CPU s a process on the 2-core CI machine, more than the small training run most tests do,
and the suite starts hundreds of such runs. The pytest workers of a session therefore share warm processes (this
file run as a script; one per start-up environment, see _Server) that have imported torch, torch._dynamo and
hpctrain and then only wait. A test's command is a fork of one that does what `python -m hpctrain ARGS` does from
there on (`runpy`, as the interpreter's `-m` does): the test's working directory, environment, stdin/stdout/stderr
and arguments; the interpreter's exit (SystemExit's code, atexit functions, non-daemon threads joined, death by
SIGINT on an uncaught KeyboardInterrupt). The fork is a real process with a pid of its own that signals reach; its
children are its own. The same preloading is what `hpctrain train --nproc N` does for its workers
(hpctrain/launch/processes.py), so torch is known to be safe to fork in that state: the warm process never runs an
operator (no thread pool, no CUDA context).

What a fork cannot reproduce, it is not used for: a command whose environment differs from the test's clean one
(the warm process's) in a variable read at start-up or at import (PYTHON*, LD_*, OMP_*, MKL_*, KMP_*, TORCH*,
PYTORCH*, CUDA*, ...) runs as a fresh interpreter, and so does every command when HPCTRAIN_TEST_WARM_START=0 (in
pytest's environment, or in the command's own: a test about how a command starts, e.g. its fork server).
Tests of start-up itself (what a command imports, the README's training commands) run fresh interpreters of
their own.

Protocol, over a Unix socket: the client sends one JSON request on one line (target: a module or a script; args,
cwd, env; pgid: the process group to join, or null for a session of its own; tied: the command ends, by SIGKILL,
when the client's end of the connection closes; same_view: start it only if its start-up variables are this
process's, else answer `fresh`) with its stdin, stdout and stderr as file descriptors (SCM_RIGHTS); the warm process
forks, answers the child's pid, and once the child has ended its wait status. One thread: children are watched
through pidfds. torchrun's workers come through tests/warm_worker.py, to a warm process of their own that preloads
only torch (WORKER_PRELOAD).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

# Variables read when an interpreter or a library starts or is imported: a command whose value differs from the
# warm process's gets a fresh interpreter.
STARTUP_PREFIXES = ("PYTHON", "LD_", "OMP_", "MKL_", "KMP_", "TORCH", "PYTORCH", "CUDA", "NCCL", "OPENBLAS", "GOMP")
PRELOAD = (
    "torch",
    "torch._dynamo",
    "torchvision",
    "hpctrain.cli",
    "hpctrain.cli.train",
    "hpctrain.training.loop",
    "hpctrain.recipes.mnist",
    "hpctrain.recipes.imagenet",
    "hpctrain.launch.processes",
    "hpctrain.schedulers.slurm.scheduler",
    "hpctrain.schedulers.kubernetes.scheduler",
    "kubernetes.client",  # where installed (not in the floor environment)
    "kubernetes.config",
    "kubernetes.watch",
)
# The kubernetes client (37, OpenAPI Generator 7) builds an API class on first use: about 0.15 CPU s each; the
# ones hpctrain.schedulers.kubernetes.scheduler uses.
KUBERNETES_APIS = ("CoreV1Api", "CustomObjectsApi", "SchedulingV1Api")


# What a warm process for torchrun's workers (tests/warm_worker.py) preloads: torch and what it imports lazily, not
# hpctrain: a worker script that patches hpctrain's modules (tests/ailing_rank.py) must import them after, as fresh.
WORKER_PRELOAD = PRELOAD[:3]
# Variables torchrun's agent sets for each worker (torch/distributed/elastic/agent/server/local_elastic_agent.py).
TORCHRUN_RUNTIME = ("TORCHELASTIC_", "TORCH_NCCL_ASYNC_ERROR_HANDLING")

HANDLED = {"PYTHONUNBUFFERED"}  # the fork sets up its stdout as the interpreter would


def _startup_view(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES) and k not in HANDLED}


def _worker_view(env: dict[str, str]) -> dict[str, str]:
    """The start-up view less what torchrun gives each worker anew, which only its run reads (not an import)."""
    return {k: v for k, v in _startup_view(env).items() if not k.startswith(TORCHRUN_RUNTIME)}


# ---------------------------------------------------------------------------------------------- the warm process


def _serve(path: str, preload: tuple[str, ...], owner: int) -> None:
    try:
        owner_fd = os.pidfd_open(owner)  # gone with the pytest session that uses it (_Server)
    except ProcessLookupError:
        return
    view = _worker_view(dict(os.environ))  # before any import can change the environment
    for module in preload:
        try:
            __import__(module)
        except ImportError:
            pass  # the command imports it itself, or says it is missing, as a fresh one does
    client = sys.modules.get("kubernetes.client")
    for name in KUBERNETES_APIS if client is not None else ():
        getattr(client, name)
    _fork_local_workers()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)  # nobody reads on: the worker that started it may end before it
    os.dup2(devnull, 1)
    os.close(devnull)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    selector.register(owner_fd, selectors.EVENT_READ, ("owner",))
    while True:
        for key, _ in selector.select():
            if key.data == ("owner",):  # the session ended; its commands' own ties end them
                # The meeting place: the socket, pid and lock files, the warm workers' stand-in records.
                shutil.rmtree(os.path.dirname(path), ignore_errors=True)
                os._exit(0)
            if key.data is None:
                connection, _ = listener.accept()
                started = _start(connection, listener, selector, view)
                if started is None:
                    connection.close()
                    continue
                pid, tied, test = started
                selector.register(os.pidfd_open(pid), selectors.EVENT_READ, ("child", pid, connection, test))
                if tied:  # the client stands for the command: its end (even by SIGKILL) ends the command
                    selector.register(connection, selectors.EVENT_READ, ("tie", pid, connection))
            elif key.data[0] == "tie":
                if not key.data[2].recv(1):
                    selector.unregister(key.fd)
                    _kill_group(key.data[1])
            else:
                _, pid, connection, test = key.data
                selector.unregister(key.fd)
                os.close(key.fd)
                if connection.fileno() in selector.get_map():
                    selector.unregister(connection)
                _, status, usage = os.wait4(pid, 0)
                _report_cpu(test, usage.ru_utime + usage.ru_stime)
                try:
                    connection.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass  # the test stopped listening
                connection.close()


def _fork_local_workers() -> None:
    """`hpctrain train --nproc N` forks its workers from a fork server, a fresh interpreter that imports torch and
    torch._dynamo (hpctrain/launch/processes.py): 5-8 CPU s a run on the loaded CI machine, some 30 runs. A warm
    command's launcher has both imported already and has run no operator, the state the fork server forks from, so
    here its workers are forks of the launcher itself. The fork server's own path stays tested by the commands
    that start fresh (the README's training commands, tests/test_readme_training.py, and the benchmarks)."""
    local = sys.modules.get("hpctrain.launch.processes")
    if local is not None:
        import multiprocessing

        local._context = lambda: multiprocessing.get_context("fork")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _start(
    connection: socket.socket, listener: socket.socket, selector: selectors.BaseSelector, view: dict[str, str]
) -> tuple[int, bool, str] | None:
    message, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
    if len(fds) != 3:
        return None
    while not message.endswith(b"\n"):  # a stream: the rest of a long request, up to its end of line
        chunk = connection.recv(1 << 16)
        if not chunk:
            return None
        message += chunk
    request = json.loads(message)
    if request.get("same_view") and _worker_view(request["env"]) != view:
        for fd in fds:
            os.close(fd)
        connection.sendall(b"fresh\n")  # this process's imports saw another environment: start afresh
        return None
    pid = os.fork()
    if pid == 0:
        # Nothing of the warm process's stays open in the command (as Popen's close_fds): the other commands'
        # pidfds and connections, the listening socket.
        for key in list(selector.get_map().values()):
            if key.data is not None and key.data[0] == "child":
                os.close(key.fd)
                key.data[2].close()
            elif key.data == ("owner",):
                os.close(key.fd)
        selector.close()
        listener.close()
        connection.close()
        _become_command(request, fds)  # never returns
    for fd in fds:
        os.close(fd)
    connection.sendall(f"{pid}\n".encode())
    return pid, bool(request.get("tied")), request["env"].get("PYTEST_CURRENT_TEST", "")


def _report_cpu(test: str, cpu_s: float) -> None:
    """With HPCTRAIN_TEST_CPU_REPORT set (tests/cpu_report.py), one line for a command that ended: the CPU seconds
    of the fork and of the children it waited for, under the test that asked for it (PYTEST_CURRENT_TEST of its
    request). The worker's own report cannot see them: the forks are this process's children, not the worker's."""
    report = os.environ.get("HPCTRAIN_TEST_CPU_REPORT")
    if not report or not test:
        return
    line = json.dumps({"test": test.rsplit(" (", 1)[0], "warm_cpu": round(cpu_s, 2)}) + "\n"
    fd = os.open(report, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _become_command(request: dict, fds: list[int]) -> None:
    import atexit
    import io
    import runpy

    code = 1
    try:
        if request["pgid"] is None:
            os.setsid()  # a session of its own, as torchrun starts each worker
        else:
            os.setpgid(0, request["pgid"])  # the test's process group, as a Popen child's
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _redo_import_time_reads()
        unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8")
        sys.stdout = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8", write_through=unbuffered
        )
        sys.stderr = io.TextIOWrapper(
            io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
            encoding="utf-8",
            errors="backslashreplace",
            line_buffering=True,
        )
        kind, target = request.get("target", ("module", "hpctrain"))
        try:
            if kind == "module":
                sys.argv = ["-m", *request["args"]]
                sys.path[0] = os.getcwd()  # as `python -m` has it
                runpy._run_module_as_main(target, alter_argv=True)
            elif kind == "code":
                sys.argv = ["-c", *request["args"]]
                sys.path[0] = ""  # as `python -c` has it
                main = sys.modules["__main__"] = types.ModuleType("__main__")  # this file's globals stay as they are
                exec(compile(target, "<string>", "exec"), main.__dict__)
            else:
                sys.argv = [target, *request["args"]]
                sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python SCRIPT` has it
                runpy.run_path(target, run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = _exit_code(stop.code)
        except KeyboardInterrupt:
            _flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:  # as the interpreter: the traceback on stderr, status 1
            import traceback

            traceback.print_exc()
            code = 1
        threading._shutdown()  # non-daemon threads, as at the interpreter's exit
        atexit._run_exitfuncs()
    finally:
        _flush()
        os._exit(code)


def _redo_import_time_reads() -> None:
    """What a preloaded module read from the environment when it was imported, read again from the command's: the
    kubernetes client's default kubeconfig (KUBECONFIG, kubernetes/config/kube_config.py, also named in
    kubernetes.config)."""
    kube_config = sys.modules.get("kubernetes.config.kube_config")
    if kube_config is not None:
        location = os.environ.get("KUBECONFIG", "~/.kube/config")
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = location
        sys.modules["kubernetes.config"].KUBE_CONFIG_DEFAULT_LOCATION = location


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


# ------------------------------------------------------------------------------------------------------ the client


class WarmProcess:
    """The subset of subprocess.Popen the tests use, for a command forked from the warm process: pid, stdout (text,
    when asked for), poll, wait, send_signal, terminate, kill, communicate."""

    def __init__(self, connection: socket.socket, pid: int, args: list[str], stdout, stderr) -> None:
        self._connection = connection
        self._answer = b""
        self.pid = pid
        self.args = args
        self.stdout = stdout
        self.stderr = stderr
        self.stdin = None
        self.returncode: int | None = None

    def _read_status(self, timeout: float | None) -> int | None:
        self._connection.settimeout(timeout)
        try:
            while not self._answer.endswith(b"\n"):
                chunk = self._connection.recv(64)
                if not chunk:
                    raise RuntimeError(f"the warm process went away while running {self.args}")
                self._answer += chunk
        except (TimeoutError, BlockingIOError):
            return None
        self._connection.close()
        return int(self._answer)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._read_status(timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        results: dict[str, str] = {}
        readers = [
            threading.Thread(target=lambda n=name, s=stream: results.__setitem__(n, s.read()), daemon=True)
            for name, stream in (("stdout", self.stdout), ("stderr", self.stderr))
            if stream is not None
        ]
        for reader in readers:
            reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        return results.get("stdout"), results.get("stderr")

    def __enter__(self) -> WarmProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


class _Server:
    """One warm process for the start-up view `key`, started in `env` (the clean environment of the pytest worker
    that asked first); `workers`: one for torchrun's workers (WORKER_PRELOAD). The pytest-xdist workers of a session
    share it (a warm process costs 2.7-4.2 CPU s to start, and a CI run's six workers each started five): the first
    to ask starts it, under a lock, and it lives until the session's controller (the lone pytest without xdist) ends.
    Its commands are its own children either way, never the worker's."""

    def __init__(self, key: tuple, env: dict[str, str], workers: bool = False) -> None:
        owner = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
        directory = os.path.join(tempfile.gettempdir(), f"hpctrain-warm-{owner}-{digest}")
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.path = os.path.join(directory, "socket")
        with open(os.path.join(directory, "lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.pid = _read_pid(os.path.join(directory, "pid"))
            if self.alive():
                return
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            process = subprocess.Popen(
                [sys.executable, str(Path(__file__)), self.path, "workers" if workers else "commands", str(owner)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                text=True,
            )
            if process.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the warm process did not start (exit {process.wait()})")
            self.pid = process.pid
            Path(directory, "pid").write_text(f"{self.pid}\n")

    def alive(self) -> bool:
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state != "Z" and b"warm_start.py" in Path(f"/proc/{self.pid}/cmdline").read_bytes()

    def start(self, request: dict, stdin: int, stdout: int, stderr: int) -> tuple[socket.socket, int]:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(self.path)
        return connection, send_request(connection, request, [stdin, stdout, stderr])


def send_request(connection: socket.socket, request: dict, fds: list[int]) -> int | None:
    """Send `request` with the descriptors `fds` (stdin, stdout, stderr); the command's pid, or None where the warm
    process says it must start afresh."""
    socket.send_fds(connection, [json.dumps(request).encode() + b"\n"], fds)
    answer = b""
    while not answer.endswith(b"\n"):
        chunk = connection.recv(64)
        if not chunk:
            raise RuntimeError("the warm process refused the command")
        answer += chunk
    return None if answer == b"fresh\n" else int(answer)


# The warm processes of this pytest worker, by start-up view. An in-process test may leave a variable of the view in
# the worker's environment (hpctrain sets TORCH_NCCL_* defaults when it prepares a run): the clean environment
# changes, and the next command gets a warm process made in the new one, not a fresh interpreter every time after.
_servers: dict[tuple, _Server] = {}
_lock = threading.Lock()
MAX_SERVERS = 4  # of each kind (commands, torchrun's workers): beyond, a command starts fresh


def _server(key: tuple, env: dict[str, str], workers: bool = False) -> _Server | None:
    with _lock:
        server = _servers.get(key)
        if server is None or not server.alive():
            if server is None and sum((k[:1] == ("workers",)) == workers for k in _servers) >= MAX_SERVERS:
                return None
            server = _servers[key] = _Server(key, env, workers)
        return server


def _server_for(env: dict[str, str], baseline: dict[str, str]) -> _Server | None:
    """The warm process for `env`, started if need be; None where `env` asks for a start-up of its own."""
    view = _startup_view(env)
    if view != _startup_view(baseline):
        return None
    return _server(tuple(sorted(view.items())), baseline)


def stand_in_record(socket_path: str, pid: int) -> str:
    """Where the warm worker `pid` (tests/warm_worker.py) notes the pid of the worker it stands for."""
    return os.path.join(os.path.dirname(socket_path), f"stands-for-{pid}")


def worker_pid(pid: int) -> int:
    """The pid of the training process that torchrun's worker `pid` is: itself, or the warm fork it stands for."""
    try:
        if b"warm_worker.py" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid  # a fresh worker (or one that became one)
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return pid
    paths = next(e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"HPCTRAIN_TEST_WARM_WORKERS="))
    records = [Path(stand_in_record(path, pid)) for path in paths.split(os.pathsep) if path]
    for _ in range(300):  # written just after the fork, and the test may look as soon as the worker started
        for record in records:
            try:
                return int(record.read_text())
            except (OSError, ValueError):
                pass
        time.sleep(0.1)
    return pid


def workers_socket(env: dict[str, str]) -> str | None:
    """The socket of a warm process for torchrun's workers whose environment is `env` (as the agent gives it them),
    started if need be; None where warm starts are off. tests/warm_worker.py finds it in HPCTRAIN_TEST_WARM_WORKERS."""
    if not enabled() or env.get("HPCTRAIN_TEST_WARM_START") == "0":
        return None
    view = _worker_view(env)
    server = _server(("workers", *sorted(view.items())), env, workers=True)
    return None if server is None else server.path


def enabled() -> bool:
    return os.environ.get("HPCTRAIN_TEST_WARM_START", "1") != "0" and hasattr(os, "pidfd_open")


def popen(
    args: list[str],
    cwd: Path | str | None,
    env: dict[str, str],
    merge_stderr: bool,
    baseline: dict[str, str],
    target: tuple[str, str] = ("module", "hpctrain"),
):
    """Start `python -m MODULE *args` (target ("module", MODULE)) or `python SCRIPT *args` (("path", SCRIPT)) warm
    if it can be (else a plain Popen): stdout as a text pipe, stderr a pipe of its own or merged into stdout.
    `baseline`: the environment a command gets when the test adds nothing (the warm process's); a command whose
    start-up variables differ from it starts fresh."""
    command = ["-m", target[1]] if target[0] == "module" else [target[1]]
    stderr_flag = subprocess.STDOUT if merge_stderr else subprocess.PIPE
    server = _server_for(env, baseline) if enabled() and env.get("HPCTRAIN_TEST_WARM_START") != "0" else None
    if server is None:
        return subprocess.Popen(
            [sys.executable, *command, *args],
            cwd=cwd,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=stderr_flag,
        )
    out_read, out_write = os.pipe()
    err_read, err_write = (None, out_write) if merge_stderr else os.pipe()
    stdin = os.open(os.devnull, os.O_RDONLY)
    try:
        request = {"target": target, "args": args, "cwd": str(cwd or os.getcwd()), "env": env}
        connection, pid = server.start({**request, "pgid": os.getpgrp()}, stdin, out_write, err_write)
    finally:
        os.close(stdin)
        os.close(out_write)
        if err_read is not None:
            os.close(err_write)
    stdout = open(out_read, encoding="utf-8", errors="replace")
    stderr = None if err_read is None else open(err_read, encoding="utf-8", errors="replace")
    return WarmProcess(connection, pid, [*command, *args], stdout, stderr)


def run(
    args: list[str], cwd: Path | str | None, env: dict[str, str], timeout: float, baseline: dict[str, str]
) -> subprocess.CompletedProcess:
    """As subprocess.run([python, -m, hpctrain, *args], capture_output=True, text=True, timeout=timeout)."""
    return completed(popen(args, cwd, env, merge_stderr=False, baseline=baseline), timeout)


def completed(process, timeout: float) -> subprocess.CompletedProcess:
    """`process` (a Popen or a WarmProcess with stdout and stderr pipes) run to its end, as subprocess.run has it:
    killed, waited for and the timeout raised again when it takes longer than `timeout` seconds."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def _read_pid(path: str) -> int:
    try:
        return int(Path(path).read_text())
    except (OSError, ValueError):
        return 0


if __name__ == "__main__":
    _serve(sys.argv[1], WORKER_PRELOAD if sys.argv[2] == "workers" else PRELOAD, int(sys.argv[3]))
