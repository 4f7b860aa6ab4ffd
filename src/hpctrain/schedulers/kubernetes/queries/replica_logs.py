"""Each replica's output kept in the job's run directory, where it outlives the pod.

A pod's log goes with the pod: a PyTorchJob that fails at its backoff limit loses its running pods (cleanPodPolicy),
and with them every line its ranks wrote. So when a job has a run directory (--run-dir, on a volume every replica
mounts), the training container's command runs under KEEP_LOG, a small program for the image's python3 (no shell,
no hpctrain needed in the image; the command stays a list of arguments, never code): it copies the command's stdout
and stderr to the container's log as they come and appends them to RUN_DIR/pod-logs/HOST.log (HOST: the pod's host
name, JOB-master-0, JOB-worker-1, ...), between a line that says when it started and one with its exit status. It
forwards SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 to the command (a cancel's checkpoint works as before) and exits
with its status (128+N for a signal N). The log file is opened with O_NOFOLLOW and appended to: a restarted container
adds to it.

The container's termination message is the other place (render.py: terminationMessagePolicy FallbackToLogsOnError):
the kubelet keeps the last lines of a failed container's log (80 lines, 2 KiB) in the pod's status, for as long as
the pod exists.

Reading them back (`status JOB`, `logs JOB` once the pods are gone, `submit --wait`): `kept_dir` finds the run
directory from the job object (its HPCTRAIN_RUN_DIR and volumes) as this machine sees it, `failed_tails` the last
lines of each replica whose last run ended non-zero, `kept_lines` a replica's whole kept log; each file read without
following links, never blocking on a FIFO, undecodable bytes shown escaped.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hpctrain.readback import BadRunFile, open_regular, read_tail
from hpctrain.schedulers.kubernetes.manifests.options import Volume

LOG_DIR = "pod-logs"
TAIL_LINES = 20
TAIL_BYTES = 64 << 10
STARTED, EXITED = "---- hpctrain: ", " exited with status "
# argv: [LOG_DIR, COMMAND...]. Python 3.5+ (a read or wait interrupted by a forwarded signal is retried, PEP 475).
KEEP_LOG = (
    "import os, signal, socket, subprocess, sys, threading, time\n"
    "where, command = sys.argv[1], sys.argv[2:]\n"
    "host = socket.gethostname()\n"
    "out, log, last = sys.stdout.buffer, None, b'\\n'\n"
    "try:\n"
    "    os.makedirs(where, exist_ok=True)\n"
    "    log = os.open(os.path.join(where, host + '.log'),\n"
    "                  os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)\n"
    "except OSError as err:\n"
    "    print('hpctrain: this log is not kept in %s: %s' % (where, err), file=sys.stderr, flush=True)\n"
    "def put(data):\n"
    "    global log, last\n"
    "    last = data[-1:] or last\n"
    "    out.write(data)\n"
    "    out.flush()\n"
    "    if log is not None:\n"
    "        try:\n"
    "            os.write(log, data)\n"
    "        except OSError:\n"
    "            log = None\n"
    "put(('---- hpctrain: %s started %s\\n' % (host, time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()))).encode())\n"
    "try:\n"
    "    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)\n"
    "except OSError as err:\n"
    "    put(('hpctrain: cannot run %s: %s\\n' % (command[0], err)).encode())\n"
    "    put(('---- hpctrain: %s exited with status 127\\n' % host).encode())\n"
    "    sys.exit(127)\n"
    "for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):\n"
    "    signal.signal(signum, lambda n, frame: child.send_signal(n))\n"
    "def copy():\n"
    "    while True:\n"
    "        data = os.read(child.stdout.fileno(), 65536)\n"
    "        if not data:\n"
    "            break\n"
    "        put(data)\n"
    "copier = threading.Thread(target=copy, daemon=True)\n"
    "copier.start()\n"
    "code = child.wait()\n"
    "copier.join(10)\n"
    "code = 128 - code if code < 0 else code\n"
    "end = ('---- hpctrain: %s exited with status %d\\n' % (host, code)).encode()\n"
    "put(end if last == b'\\n' else b'\\n' + end)\n"
    "sys.exit(code)\n"
)


def keep_log(command: list[str], run_dir: str | None) -> list[str]:
    """`command` under KEEP_LOG when the job has a run directory (as the pods see it), else as it is."""
    if run_dir is None:
        return command
    return ["python3", "-c", KEEP_LOG, posixpath.join(run_dir, LOG_DIR), *command]


def kept_dir(obj: dict[str, Any], path_here: Callable[[str, list[Volume]], tuple[str | None, str]]) -> Path | None:
    """RUN_DIR/pod-logs of the job object `obj` as this machine sees it (`path_here`: local.path_here), or None when
    the job has no run directory or its volume is not reachable from here."""
    return run_dir_here(obj, path_here, LOG_DIR)


def run_dir_here(
    obj: dict[str, Any], path_here: Callable[[str, list[Volume]], tuple[str | None, str]], *under: str
) -> Path | None:
    """The job's run directory (or the path `under` it) as this machine sees it, or None when the job has no run
    directory or its volume is not reachable from here."""
    pod, env = _pod_and_env(obj)
    run_dir = next((e.get("value") for e in env if e.get("name") == "HPCTRAIN_RUN_DIR"), None)
    if not isinstance(run_dir, str):
        return None
    mounts = next((c.get("volumeMounts") or [] for c in pod.get("containers") or [] if c.get("volumeMounts")), [])
    sources = {v.get("name"): v for v in pod.get("volumes") or []}
    volumes = []
    for m in mounts:
        v = sources.get(m.get("name")) or {}
        if "hostPath" in v:
            volumes.append(Volume("host", v["hostPath"].get("path", ""), m.get("mountPath", "")))
        elif "nfs" in v:
            volumes.append(Volume("nfs", v["nfs"].get("path", ""), m.get("mountPath", ""), v["nfs"].get("server")))
        elif "persistentVolumeClaim" in v:
            volumes.append(Volume("pvc", v["persistentVolumeClaim"].get("claimName", ""), m.get("mountPath", "")))
    here, _ = path_here(posixpath.join(run_dir, *under), volumes)
    return Path(here) if here else None


def _pod_and_env(obj: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The job's pod spec (volumes, mounts) and its training container's env, as render.py writes them."""
    spec = obj.get("spec") or {}
    if "pytorchReplicaSpecs" in spec:  # the Master's, or an elastic job's Workers' (it has no Master)
        specs = spec["pytorchReplicaSpecs"] or {}
        pod = ((specs.get("Master") or specs.get("Worker") or {}).get("template") or {}).get("spec") or {}
        return pod, next((c.get("env") or [] for c in pod.get("containers") or []), [])
    pod = {}
    for patch in spec.get("runtimePatches") or []:
        for rjob in (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}).get(
            "replicatedJobs"
        ) or []:
            pod = ((((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")) or pod
    return pod, (spec.get("trainer") or {}).get("env") or []


def kept_logs(directory: Path, job_id: str) -> dict[str, Path]:
    """Replica name (`master-0`, the host name less `JOB-`) -> its kept log, in name order."""
    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    out = {}
    for name in names:
        if name.endswith(".log"):
            host = name[: -len(".log")]
            out[host[len(job_id) + 1 :] if host.startswith(f"{job_id}-") else host] = directory / name
    return dict(sorted(out.items()))


def failed_tails(directory: Path | None, job_id: str, lines: int = TAIL_LINES) -> tuple[str, ...]:
    """`REPLICA: LINE` for the last `lines` lines of each kept log whose last run ended with a non-zero status, with
    the lines that mark each run's start and exit status (a run killed as its pod went, 143, may follow the one
    that failed)."""
    if directory is None:
        return ()
    out: list[str] = []
    for replica, path in kept_logs(directory, job_id).items():
        try:
            tail = _tail(path, directory)
        except (OSError, BadRunFile):
            continue
        ended = next((i for i in range(len(tail) - 1, -1, -1) if tail[i].startswith(STARTED)), None)
        if ended is None or EXITED not in tail[ended] or tail[ended].endswith(f"{EXITED}0"):
            continue
        said = tail[: ended + 1]  # up to its last run's end: earlier runs (restarts in place) too, marked
        while said and not said[-1].strip():
            said.pop()
        out += [f"{replica}: {line}" for line in said[-lines:]]
    return tuple(out)


def _tail(path: Path, within: Path) -> list[str]:
    return read_tail(path, TAIL_BYTES, within.parent).decode("utf-8", "backslashreplace").split("\n")


def kept_lines(path: Path, within: Path) -> Iterator[str]:
    """The lines of a kept log (`within`: the run directory), read as they come (the file may be large)."""
    fd = open_regular(path, within)
    with os.fdopen(fd, "rb") as f:
        for line in f:
            yield line.rstrip(b"\n").decode("utf-8", "backslashreplace")
