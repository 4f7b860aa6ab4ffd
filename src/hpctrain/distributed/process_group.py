"""Turn a `DistEnv` into a device and a torch.distributed process group, failing fast with the fix.

Everything that can be checked before the rendezvous is checked here (GPUs per node, the head host's name,
the shared rendezvous file's directory), because after it a mistake shows up as a hang until the timeout.
"""

from __future__ import annotations

import logging
import datetime
import os
import socket
import threading
import urllib.parse
from collections.abc import Mapping
from typing import TYPE_CHECKING

from hpctrain import compat
from hpctrain.distributed.detect import detect
from hpctrain.distributed.environment import DistEnv
from hpctrain.errors import UserError
from hpctrain import channel

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import torch

__all__ = [
    "destroy_process_group",
    "exit_status",
    "init_process_group",
    "pick_device",
    "resolve_device",
    "setup",
]

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"

# Where each launcher's processes-per-node count comes from, for messages.
_PER_NODE_SOURCE = {
    "slurm": "SLURM_NTASKS_PER_NODE / SLURM_STEP_TASKS_PER_NODE",
    "torchrun": "torchrun --nproc-per-node (LOCAL_WORLD_SIZE)",
    "spawn": "--nproc",
    "explicit": "LOCAL_WORLD_SIZE",
    "kubeflow": "PET_NPROC_PER_NODE",
}


def resolve_device(requested: str, env: DistEnv) -> torch.device:
    """The device this process should use: "auto" picks this rank's GPU when CUDA works, else the CPU.

    `hpctrain train --device` offers auto, cpu and cuda; "cuda:N" (one process per node only) comes from users'
    own scripts through `setup(device=...)`, as examples/ddp_user_script.py's --device does."""
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return pick_device(requested, env, visible, os.environ, cuda_build=torch.version.cuda)


def pick_device(
    requested: str,
    env: DistEnv,
    visible_gpus: int,
    environ: Mapping[str, str],
    cuda_build: str | None = "unknown",
) -> torch.device:
    """`resolve_device` with the GPU count passed in, so the rules are testable on machines without GPUs."""
    import torch

    choice = (requested or "auto").strip().lower()
    if choice == "cpu":
        return torch.device("cpu")
    if choice == "auto":
        if visible_gpus == 0:
            return torch.device("cpu")
        choice = "cuda"
    if choice != "cuda" and not choice.startswith("cuda:"):
        raise UserError(f"--device {requested!r} is not understood; use {DEVICE_CHOICES}")
    if visible_gpus == 0:
        raise UserError(_no_cuda_message(requested, environ, cuda_build))
    if choice != "cuda":
        index_text = choice.partition(":")[2]
        if not index_text.isdigit() or int(index_text) >= visible_gpus:
            raise UserError(
                f"--device {requested!r}: {visible_gpus} GPU(s) are visible here, numbered 0..{visible_gpus - 1}"
            )
        if env.local_world_size > 1:
            raise UserError(
                f"--device {requested} would put all {env.local_world_size} processes of this node on one GPU; "
                "use --device cuda (each process takes the GPU of its local rank)"
            )
        return torch.device("cuda", int(index_text))
    _check_gpus_per_node(env, visible_gpus, environ)
    return torch.device("cuda", env.local_rank % visible_gpus)


def _check_gpus_per_node(env: DistEnv, visible: int, environ: Mapping[str, str]) -> None:
    """One process per GPU: more processes than visible GPUs means sharing (NCCL refuses it, or it crawls)."""
    if env.local_world_size <= visible:
        return
    # srun --gpus-per-task=1 (or --gpu-bind) shows each task only its own GPU: one visible GPU per task is right.
    step_gpus = environ.get("SLURM_STEP_GPUS") or environ.get("SLURM_JOB_GPUS") or ""
    if visible == 1 and len([g for g in step_gpus.split(",") if g.strip()]) >= env.local_world_size:
        return
    source = _PER_NODE_SOURCE.get(env.launcher, "the launcher")
    raise UserError(
        f"{env.local_world_size} processes on this node ({source}) but {visible} GPU(s) visible "
        f"(CUDA_VISIBLE_DEVICES={environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}): processes would share GPUs. "
        f"Request one GPU per process (e.g. #SBATCH --gpus-per-node={env.local_world_size} with "
        f"--ntasks-per-node={env.local_world_size}) or start {visible} process(es) per node"
    )


def _no_cuda_message(requested: str, environ: Mapping[str, str], cuda_build: str | None) -> str:
    if cuda_build is None:
        why = "this torch build has no CUDA support: install a CUDA build of torch"
    elif environ.get("CUDA_VISIBLE_DEVICES") is not None:
        why = f"no GPU is visible (CUDA_VISIBLE_DEVICES={environ['CUDA_VISIBLE_DEVICES']!r})"
    elif environ.get("SLURM_JOB_ID"):
        why = "no GPU is visible in this Slurm job: request some (#SBATCH --gpus-per-node=N)"
    else:
        why = "torch finds no GPU here (no driver or device)"
    return f"--device {requested} but {why}; or use --device cpu (or auto, which falls back to the CPU)"


def init_process_group(env: DistEnv, device: torch.device, timeout_s: float = 600.0) -> None:
    """Join the job's process group: nccl for CUDA devices, gloo otherwise. A no-op for a single process."""
    if not env.is_distributed:
        return
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise UserError("this torch build lacks torch.distributed; install a standard torch wheel")
    if timeout_s <= 0:
        raise UserError(f"timeout {timeout_s} s must be positive")
    if dist.is_initialized():
        if (dist.get_rank(), dist.get_world_size()) == (env.rank, env.world_size):
            return
        raise UserError(
            f"a process group (rank {dist.get_rank()} of {dist.get_world_size()}) already exists but the "
            f"environment says rank {env.rank} of {env.world_size}; call destroy_process_group() first"
        )
    url = rendezvous_url(env)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        if device.index is None:  # plain "cuda": this rank's GPU, as resolve_device would pick it
            device = torch.device("cuda", env.local_rank % max(torch.cuda.device_count(), 1))
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        dist.init_process_group(
            backend=backend,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timeout,
            **_device_id_argument(device),
            **_rendezvous_arguments(url, env, timeout),
        )
    except Exception as err:  # torch raises DistNetworkError, DistStoreError, RuntimeError, ValueError
        explained = _explain_init_failure(err, env, url, timeout_s)
        if explained is None:
            raise
        raise UserError(explained) from err


def _device_id_argument(device: torch.device) -> dict[str, object]:
    """device_id=GPU (eager NCCL initialisation: a broken GPU or network fails here, not at the first collective)
    where torch has it (2.3+); nothing for the CPU (gloo) or an older torch, which creates NCCL at the first
    collective. A gloo group made later with new_group(backend="gloo") is separate from the NCCL one either way."""
    if device.type != "cuda":
        return {}
    if not compat.init_takes_device_id():
        import torch

        compat.say_once(
            "device_id",
            f"torch {torch.__version__} has no init_process_group(device_id=) (torch >= 2.3):"
            " NCCL starts at the first collective instead of at start-up, so a GPU or network problem "
            "shows there",
        )
        return {}
    return {"device_id": device}


def _rendezvous_arguments(url: str, env: DistEnv, timeout: datetime.timedelta) -> dict[str, object]:
    """init_method=url, except after a torchrun restart: its store outlives the failed attempt, and a new worker
    could read a dead worker's address from it (seen: gloo's connectFullMesh refused when a worker of the old
    group was still shutting down). Each attempt gets its own key prefix there."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    parsed = urllib.parse.urlsplit(url)
    if env.launcher != "torchrun" or restart is None or parsed.scheme != "tcp" or parsed.port is None:
        return {"init_method": url}
    import torch.distributed as dist
    from torch.distributed.rendezvous import _create_c10d_store  # reuses torchrun's agent store when it serves

    store = _create_c10d_store(parsed.hostname, parsed.port, env.rank, env.world_size, timeout)
    return {"store": dist.PrefixStore(f"hpctrain/attempt-{restart}", store)}


def rendezvous_url(env: DistEnv) -> str:
    """The URL torch should use, after checks that turn later hangs into errors now."""
    method = env.init_method
    if method is None:
        raise UserError(f"rank {env.rank} of {env.world_size} has no rendezvous; pass --dist-init-method")
    if method == "env://" or method.startswith("tcp://"):
        host, port = env.master_addr, env.master_port
        if not host or port is None:
            raise UserError(f"{method} needs the head node's address and port (MASTER_ADDR, MASTER_PORT); set them")
        _check_resolvable(host, port, env)
        return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
    if method.startswith("file://"):
        path = urllib.parse.unquote(urllib.parse.urlsplit(method).path)
        parent = os.path.dirname(path) or "/"
        if not os.path.isdir(parent):
            raise UserError(
                f"{method}: directory {parent} does not exist here; the rendezvous file must be on a "
                "filesystem every rank sees (create the directory, or use tcp://HOST:PORT)"
            )
        return method
    raise UserError(f"rendezvous {method!r} is not env://, tcp://HOST:PORT or file:///PATH; pass --dist-init-method")


def _check_resolvable(host: str, port: int, env: DistEnv) -> None:
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as err:
        origin = {"slurm": " (the first host of the Slurm node list)"}.get(env.launcher, "")
        raise UserError(
            f"cannot resolve the rendezvous host {host!r}{origin}: {err}. Set MASTER_ADDR to a name or IP "
            "address that every node resolves (see /etc/hosts or DNS), or pass --dist-init-method tcp://IP:PORT"
        ) from None


def _explain_init_failure(err: Exception, env: DistEnv, url: str, timeout_s: float) -> str | None:
    text = str(err)
    lowered = text.lower()
    where = f"rank {env.rank} of {env.world_size} ({env.launcher}) at {url}"
    if "address already in use" in lowered or "eaddrinuse" in lowered:
        return (
            f"{where}: the port is already in use on the head node (another job, or a previous run that has not "
            "exited): set MASTER_PORT to another free port"
        )
    if "timed out" in lowered or "timeout" in lowered:
        return (
            f"{where}: gave up after {timeout_s:g} s waiting for all {env.world_size} processes. Check that every "
            "process started and reached this point, that they agree on the world size, and that the head "
            "host and port are reachable from this node (firewalls). Underlying error: " + text.splitlines()[0][:300]
        )
    return None


DESTROY_TIMEOUT_S = 60.0
"""How long leaving the process group may take. It takes milliseconds; now and then torch's own
`destroy_process_group` never returns on one rank of a job that finished (pytorch/pytorch#75097; seen here with
torch 2.2 and gloo), and the job would hold its nodes until the time limit."""
_left_hanging = False


def destroy_process_group() -> None:
    """Leave the process group if there is one (safe to call always, e.g. in `finally`). When torch's shutdown of it
    does not return within DESTROY_TIMEOUT_S, say so and go on: `exit_status` then ends the process without waiting
    for it (hpctrain's own commands do)."""
    import torch.distributed as dist

    global _left_hanging
    if not (dist.is_available() and dist.is_initialized()):
        return
    failure: list[BaseException] = []

    def leave() -> None:
        try:
            dist.destroy_process_group()
        except BaseException as err:  # raised again in the caller's thread
            failure.append(err)

    worker = threading.Thread(target=leave, name="hpctrain-leave-process-group", daemon=True)
    worker.start()
    worker.join(DESTROY_TIMEOUT_S)
    if worker.is_alive():
        _left_hanging = True
        log.warning(
            f"leaving the process group did not finish within {DESTROY_TIMEOUT_S:g} s (a "
            "PyTorch shutdown hang, pytorch/pytorch#75097); the process ends without waiting for it"
        )
    elif failure:
        raise failure[0]


def exit_status(status: int) -> int:
    """`status`, or, when leaving the process group hung (destroy_process_group), the process ends here with it: a
    thread stuck inside torch would stop the interpreter from exiting."""
    if _left_hanging:
        channel.flush()
        os._exit(status)
    return status


def setup(
    device: str = "auto",
    timeout_s: float = 600.0,
    init_method: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[DistEnv, torch.device]:
    """detect() + resolve_device() + init_process_group(): the three lines a user script needs."""
    env = detect(environ, init_method)
    chosen = resolve_device(device, env)
    init_process_group(env, chosen, timeout_s)
    return env, chosen
