"""TensorBoard on runs' `tb/` folders: here (the tensorboard package's own server, bound to 127.0.0.1), and what
a TensorBoard on the cluster needs from here (the runs' --logdir_spec, the readiness check). The
small CPU job or pod on the cluster that reads the shared folder is the backend's (schedulers/<backend>/services.py).

Several runs are compared side by side, each named by its folder (`--logdir_spec name1:dir1,name2:dir2`).
"""

from __future__ import annotations

import logging
import functools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from hpctrain.distributed.lifetime import die_with_parent
from hpctrain.distributed.ports import free_port
from hpctrain.errors import UserError
from hpctrain.servers.common import http_get
from hpctrain.training.metrics import TENSORBOARD_DIR
from hpctrain.channel import note

log = logging.getLogger(__name__)


def event_dir(run_dir: Path) -> Path:
    """RUN_DIR/tb when it exists (what hpctrain writes), else the folder itself (a tb/ folder or any log dir)."""
    tb = run_dir / TENSORBOARD_DIR
    return tb if tb.is_dir() else run_dir


def run_names(run_dirs: list[Path]) -> list[str]:
    """Each run named by its folder; equal names get their parent's name in front, then a counter."""
    folders = [d.parent if d.name == TENSORBOARD_DIR else d for d in run_dirs]
    plain = [f.name or "run" for f in folders]
    names = [f"{f.parent.name}/{n}" if plain.count(n) > 1 else n for f, n in zip(folders, plain)]
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    return out


def logdir_spec(run_dirs: list[str | Path], check_exists: bool = True) -> str:
    """`name1:dir1,name2:dir2` for TensorBoard's --logdir_spec. Paths are used as given (on the cluster they
    must be the paths the job sees)."""
    if not run_dirs:
        raise UserError("give at least one run directory, e.g. hpctrain tensorboard runs/mnist")
    dirs = [Path(d).expanduser() for d in run_dirs]
    if check_exists:
        missing = [str(d) for d in dirs if not d.is_dir()]
        if missing:
            raise UserError(
                f"{', '.join(missing)}: no such run directory; give folders that `hpctrain train --run-dir` wrote"
            )
        dirs = [event_dir(d.resolve()) for d in dirs]
    else:  # the cluster's paths; where this host sees the same folder (a NAS mounted everywhere), its tb/ is used
        dirs = [event_dir(d) for d in dirs]
    bad = [str(d) for d in dirs if "," in str(d)]
    if bad:
        raise UserError(
            f"{bad[0]}: TensorBoard separates runs with commas, so a path cannot contain one; rename or link the folder"
        )
    names = [n.replace(":", "_").replace(",", "_") for n in run_names(dirs)]
    return ",".join(f"{name}:{d}" for name, d in zip(names, dirs))


def tensorboard_argv(spec: str, port: int, host: str = "127.0.0.1", python: str = sys.executable) -> list[str]:
    # `--logdir_spec=SPEC`, one word: a run named -x makes the spec start with a dash, which TensorBoard would take
    # for an option of its own.
    return [
        python,
        "-m",
        "tensorboard.main",
        f"--logdir_spec={spec}",
        "--port",
        str(port),
        "--host",
        host,
        "--reload_interval",
        "10",
    ]


def ready(host: str, port: int) -> bool:
    return http_get(f"http://{host}:{port}/data/runs")[0] == 200


# TensorBoard's start-up lines that say nothing to an hpctrain user: it runs without TensorFlow on purpose, its
# experimental loader note, its own URL line (hpctrain prints the URL, once) and its goodbye on SIGTERM.
_NOISE = re.compile(
    r"TensorFlow installation not found|^NOTE: Using experimental fast data loading|"
    r"^\s+\"--load_fast=false\" and report issues|^\s+https://github\.com/tensorflow/tensorboard/issues/"
    r"|^TensorBoard \S+ at https?://|^TensorBoard caught SIG\w+; exiting|^\s*$"
)


def is_noise(line: str) -> bool:
    """Whether a line of TensorBoard's stderr is one of the start-up lines hpctrain leaves out."""
    return bool(_NOISE.search(line))


def _forward_stderr(stream) -> None:
    for line in stream:
        if not is_noise(line):
            note(log, line.rstrip("\n"), bare=True)


def serve_local(spec: str, port: int | None, wait_s: float = 120.0) -> tuple[subprocess.Popen[str], str]:
    """Start TensorBoard here and return (process, url) once it answers; the caller waits on or stops it. The
    server dies with this process, however this process ends: the kernel sends it SIGKILL. Not SIGTERM: TensorBoard
    has nothing to save, and its SIGTERM handler first writes to its stderr, a pipe whose reader (this process) is
    gone by then; on a loaded CI machine a server once went on serving for over a minute after that."""
    port = port or free_port()
    proc = subprocess.Popen(
        tensorboard_argv(spec, port),
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=functools.partial(die_with_parent, os.getpid(), signal.SIGKILL),
    )
    threading.Thread(target=_forward_stderr, args=(proc.stderr,), name="tensorboard-stderr", daemon=True).start()
    deadline = time.monotonic() + wait_s
    while not ready("127.0.0.1", port):
        if proc.poll() is not None:
            raise UserError(
                f"tensorboard exited (status {proc.returncode}) before it answered; its messages are above "
                f"(port {port} in use? choose another with --port)"
            )
        if time.monotonic() >= deadline:
            proc.terminate()
            raise UserError(f"tensorboard did not answer on port {port} within {wait_s:g} s")
        time.sleep(0.5)
    return proc, f"http://127.0.0.1:{port}/"
