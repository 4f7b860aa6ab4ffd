"""`hpctrain env [--json]`: what a bug report needs: versions, GPUs, and what hpctrain.distributed detects here.

Always prints everything it can: a missing package or an inconsistent launcher environment is shown in
its place, not raised, so `srun hpctrain env` shows each task's view even when training would refuse to start.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import socket
import sys
from typing import Any

from hpctrain.fsutil import format_bytes
from hpctrain.schedulers import SCHEDULERS, backend_info

# Variables that decide detection; echoed so a report shows what the launcher really set.
_LAUNCHER_VARS = (
    "HPCTRAIN_LAUNCHER",
    "TORCHELASTIC_RUN_ID",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PET_NPROC_PER_NODE",
    "PET_NNODES",
    "PET_NODE_RANK",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_TASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_JOB_NODELIST",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_GPUS",
    "CUDA_VISIBLE_DEVICES",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument(
        "--dist-init-method",
        metavar="METHOD",
        default=None,
        help="show detection as training would do it with this override (env, slurm, tcp://HOST:PORT, file:///PATH)",
    )


def run(args: argparse.Namespace) -> int:
    info = collect(args.dist_init_method)
    print(json.dumps(info, indent=2) if args.json else render(info))
    return 0


def collect(init_method: str | None = None) -> dict[str, Any]:
    """Gather the report; each probe that can fail records its error instead of raising."""
    import torch

    from hpctrain.training.provenance import package_version, versions

    shared = versions()  # the same figures every run records in provenance.json
    info: dict[str, Any] = {
        "hpctrain": shared["hpctrain"],
        "python": f"{platform.python_version()} ({platform.python_implementation()}) {sys.executable}",
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "torch": shared["torch"],
        "torch_cuda_build": shared["cuda"],
        "cuda_available": torch.cuda.is_available(),
        "cudnn": shared["cudnn"],
        "nccl": shared["nccl"],
        "torchvision": shared["torchvision"],
        "tensorboard": package_version("tensorboard"),
        "numpy": package_version("numpy"),
        "numpy_problem": _numpy_problem(torch),
        **_scheduler_clients(),
        "gpus": _gpus(torch),
        "launcher_variables": {name: os.environ[name] for name in _LAUNCHER_VARS if name in os.environ},
    }
    info.update(_distributed(init_method))
    return info


def render(info: dict[str, Any]) -> str:
    """Plain `key: value` lines: they paste cleanly into an issue or a terminal-less log."""

    def shown(value: Any) -> str:
        return "not available" if value is None else str(value)

    lines = [
        f"hpctrain:     {info['hpctrain']}",
        f"Python:       {info['python']}",
        f"platform:     {info['platform']}",
        f"hostname:     {info['hostname']}",
        f"torch:        {info['torch']}",
        f"CUDA (build): {shown(info['torch_cuda_build'])}, available here: {'yes' if info['cuda_available'] else 'no'}",
        f"cuDNN:        {shown(info['cudnn'])}",
        f"NCCL:         {shown(info['nccl'])}",
        f"torchvision:  {shown(info['torchvision'])}",
        f"tensorboard:  {shown(info['tensorboard'])}",
        f"NumPy:        {shown(info['numpy'])}"
        + (f" (problem: {info['numpy_problem']})" if info["numpy_problem"] else ""),
    ]
    lines += [f"{backend_info(name).title + ' client:':<13} {shown(info[name])}" for name in SCHEDULERS]
    gpus = info["gpus"]
    lines.append(
        f"GPUs visible: {len(gpus)}"
        + (
            f" (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']})"
            if "CUDA_VISIBLE_DEVICES" in os.environ
            else ""
        )
    )
    lines += [
        f"  cuda:{g['index']}: {g['name']}, {format_bytes(g['memory_bytes'])}, compute capability {g['capability']}"
        for g in gpus
    ]
    dist = info["distributed"]
    lines.append("distributed:  " + (f"error: {dist['error']}" if "error" in dist else dist["summary"]))
    if "error" not in dist:
        lines.append(f"  device (auto): {info['device_auto']}")
        for key in (
            "launcher",
            "rank",
            "world_size",
            "local_rank",
            "local_world_size",
            "node_rank",
            "num_nodes",
            "master_addr",
            "master_port",
            "init_method",
        ):
            lines.append(f"  {key}: {shown(dist[key])}")
    if info["launcher_variables"]:
        lines.append("launcher variables:")
        lines += [f"  {name}={value}" for name, value in info["launcher_variables"].items()]
    return "\n".join(lines)


def _distributed(init_method: str | None) -> dict[str, Any]:
    from hpctrain.distributed import detect, resolve_device
    from hpctrain.errors import UserError

    try:
        env = detect(init_method=init_method)
    except UserError as err:
        return {"distributed": {"error": str(err)}, "device_auto": None}
    try:
        device = str(resolve_device("auto", env))
    except UserError as err:
        device = f"error: {err}"
    return {"distributed": {**dataclasses.asdict(env), "summary": env.describe()}, "device_auto": device}


def _numpy_problem(torch: Any) -> str | None:
    """Why torch cannot use the NumPy installed here (a torch built against NumPy 1.x beside NumPy 2), or None."""
    from hpctrain.compat import installed_numpy_mismatch

    problem = installed_numpy_mismatch()
    if problem is not None:
        return problem
    try:
        import numpy

        torch.from_numpy(numpy.zeros(1))
    except ImportError:
        return None
    except Exception as err:  # whatever the bridge raises is the report
        return f"torch cannot use NumPy here ({type(err).__name__}: {' '.join(str(err).split())[:200]})"
    return None


def _scheduler_clients() -> dict[str, str | None]:
    """Each scheduler backend's client version here (None: not installed), keyed by the backend's name."""
    return {name: backend_info(name).client_version() for name in SCHEDULERS}


def _gpus(torch: Any) -> list[dict[str, Any]]:
    if not torch.cuda.is_available():
        return []
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append(
            {
                "index": index,
                "name": props.name,
                "memory_bytes": int(props.total_memory),
                "capability": f"{props.major}.{props.minor}",
            }
        )
    return gpus
