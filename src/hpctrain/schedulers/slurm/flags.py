"""The command-line flags Slurm owns, and what Slurm takes into its own options from a job described by flags
and/or a job file.

The CLI names no scheduler: it asks each backend's INFO to add its flags (add_arguments) and to complete the job's
two parts (complete_job): the neutral job data and Slurm's options. Slurm's jobs run on nodes that share the login
node's file system and programs, so the environment flags (--env-kind, --module, --conda-env, --venv, an apptainer
or enroot --image) describe paths valid here, and a job without an environment runs the Python that submitted it.
A GRES request (--gres, a job file's `gres:`) is split into the job's GPU count and Slurm's GPU type and shards.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import Any

from hpctrain.errors import UserError
from hpctrain.schedulers.slurm.grammar import read_gres_request
from hpctrain.schedulers.slurm.batch.options import ENVIRONMENT_KINDS
from hpctrain.schedulers.slurm.batch.options import LAUNCHERS

ENV_FLAGS = ("kind", "modules", "conda_env", "venv", "image", "mounts", "workdir")
"""argparse dests of the environment flags (`hpctrain submit`'s environment group): EnvironmentSpec fields."""
_GPU_OPTIONS = ("gpu_type", "shards_per_node")


def add_arguments(parser: argparse.ArgumentParser, group: argparse._ArgumentGroup, role: str) -> None:
    """Slurm's own flags for a command's `role` (hpctrain.schedulers.base.ROLES), each in a `--help` group of
    Slurm's: a job's options (submit, check), the placement of a service (dev start, tensorboard --on-cluster),
    and the few a query or an action on a job takes (status, logs, cancel, cluster, debug preempt)."""
    if role == "job":
        _job_arguments(parser)
    elif role in ("dev", "tensorboard"):
        _placement_arguments(parser, role)
    elif role == "status":
        _group(parser).add_argument("--all-users", action="store_true", help="Slurm: everyone's jobs, not only yours")
    elif role == "logs":
        _group(parser).add_argument(
            "--err",
            dest="stream",
            action="store_const",
            const="stderr",
            help="Slurm: the job's stderr file instead of its stdout",
        )
    elif role == "cluster":
        _group(parser).add_argument("--partition", "-p", metavar="NAME", help="Slurm: only the nodes of this partition")
    elif role == "cancel":
        g = _group(parser)
        g.add_argument(
            "--signal", "-s", metavar="SIG", help="Slurm: send this signal (e.g. USR1) instead of cancelling"
        )
        g.add_argument(
            "--full",
            action="store_true",
            help="Slurm, with --signal: signal the batch shell too, not only the job steps",
        )
    elif role == "preempt":
        g = _group(parser)
        g.add_argument(
            "--signal",
            "-s",
            metavar="SIG",
            help="send this signal instead of the one the job's script asks for (e.g. USR1); "
            "needed when the job got its --signal on sbatch's command line",
        )
        g.add_argument(
            "--steps",
            action="store_true",
            help="with --signal: deliver it to the job steps instead of the batch shell "
            "(like --signal=USR1@TIME without B:)",
        )


def _group(parser: argparse.ArgumentParser, what: str = "") -> argparse._ArgumentGroup:
    return parser.add_argument_group(f"slurm{what} (with --scheduler slurm)")


def _job_arguments(parser: argparse.ArgumentParser) -> None:
    g = _group(parser)
    g.add_argument("--partition", "-p", metavar="NAME")
    g.add_argument("--account", "-A", metavar="NAME")
    g.add_argument("--qos", "-q", metavar="NAME")
    g.add_argument("--output", "-o", metavar="PATTERN", help="output file (sbatch --output; %%j = job id)")
    g.add_argument("--error", "-e", metavar="PATTERN", help="error file (default: with the output)")
    g.add_argument(
        "--sbatch",
        dest="sbatch_extra",
        action="append",
        metavar="OPTION",
        help="extra sbatch option for an #SBATCH line, e.g. --sbatch=--exclusive (repeatable)",
    )
    g.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        help="torchrun: one torchrun per node; srun: one task per process; single: one process (default: single "
        "for a built-in recipe's one process, else torchrun)",
    )
    g.add_argument("--rdzv-port", type=int, metavar="PORT", help="torchrun rendezvous port (default: a free one)")
    g.add_argument("--max-requeues", type=int, metavar="N", help="requeues after time-limit warnings (default 3)")
    g.add_argument(
        "--max-preemptions",
        type=int,
        metavar="N",
        help="new starts after Slurm requeued the job itself: preemption, node failure (default 10)",
    )
    g.add_argument(
        "--max-hang-restarts",
        type=int,
        metavar="N",
        help="new starts after hpctrain's hang watchdog ended an attempt (`train --hang-timeout`); it "
        "resumes from its checkpoint (default 2; Slurm: needs the run directory)",
    )
    r = _group(parser, " resources")
    r.add_argument("--gpu-type", metavar="TYPE", help="GPU type as sinfo shows it (gpu:TYPE:N)")
    r.add_argument("--gres", metavar="SPEC", help="gpu:N, gpu:TYPE:N or shard:N (a slice of a shared GPU)")
    e = parser.add_argument_group(
        "slurm environment (with --scheduler slurm; --image: an apptainer .sif or enroot image)"
    )
    e.add_argument(
        "--env-kind",
        dest="kind",
        choices=ENVIRONMENT_KINDS,
        help="where the command runs (default: inferred from --conda-env/--venv/--image/--module, else none)",
    )
    e.add_argument(
        "--module", dest="modules", action="append", metavar="NAME", help="`module load NAME` first (repeatable)"
    )
    e.add_argument("--conda-env", metavar="NAME|PREFIX")
    e.add_argument("--venv", metavar="DIR")
    e.add_argument(
        "--mount", dest="mounts", action="append", metavar="SRC[:DST]", help="container bind mount (repeatable)"
    )
    e.add_argument("--container-workdir", dest="workdir", metavar="DIR")


def _placement_arguments(parser: argparse.ArgumentParser, role: str) -> None:
    """Where a service job runs and with which software: `dev start`, `tensorboard --on-cluster`."""
    g = _group(parser, ": where the job runs")
    if role == "dev":
        g.add_argument("--gpu-type", help="GPU type, as `sinfo -o %%G` shows it")
        g.add_argument("--gres", metavar="shard:N", help="a slice of a shared GPU instead (Slurm shard GRES)")
    g.add_argument("--partition", help="Slurm: partition")
    g.add_argument("--account", help="Slurm: account")
    g.add_argument("--conda-env", help="Slurm: activate this conda environment")
    g.add_argument("--venv", help="Slurm: activate this virtual environment")
    g.add_argument(
        "--module", dest="modules", action="append", default=[], help="Slurm: `module load` this first (repeatable)"
    )
    g.add_argument(
        "--mount", dest="mounts", action="append", default=[], help="Slurm containers: bind SRC[:DST] (repeatable)"
    )
    g.add_argument("--login-host", help="the login node your machine reaches with ssh (default: this host's name)")


def complete_job(
    data: dict[str, Any], options: dict[str, Any], flags: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The job's neutral data and Slurm's options, completed: a GRES request split into the job's GPU count and the
    options' GPU type and shards (a flag replaces the file's GPU request); the environment the flags describe (on
    top of the job file's); and the Python of this hpctrain where the job has no environment of its own: the job
    runs hpctrain and torchrun with it, so that a venv called by path, not activated, works."""
    data, options = dict(data), dict(options)
    gres = options.pop("gres", None)  # the flag's (given on top of the file's) or the job file's
    if flags.get("gres") is not None:  # --gres replaces every other GPU request
        data.pop("gpus_per_node", None)
        for key in _GPU_OPTIONS:
            options.pop(key, None)
    elif gres is not None and (flags.get("gpus_per_node") is not None or flags.get("gpu_type") is not None):
        gres = None  # --gpus-per-node/--gpu-type replace the job file's GPU request
    elif gres is not None and ("gpus_per_node" in data or any(key in options for key in _GPU_OPTIONS)):
        raise UserError("the job file gives gres and gpus_per_node/gpu_type/shards_per_node: keep one of them")
    if gres is not None:
        if not isinstance(gres, str):
            raise UserError(f"gres must be a string such as gpu:2 or shard:16 (got {gres!r})")
        gpus, gpu_type, shards = read_gres_request(gres)
        data["gpus_per_node"] = gpus
        options.update({"gpu_type": gpu_type, "shards_per_node": shards})
    options["environment"] = _environment_data(options.get("environment"), flags)
    if _environment_kind(options.get("environment")) == "none" and options.get("python") is None:
        options["python"] = os.path.abspath(sys.executable)
    return data, {k: v for k, v in options.items() if v is not None}


def _environment_kind(value: Any) -> Any:
    return value if isinstance(value, str) else dict(value or {}).get("kind", "none")


def _environment_data(file_value: Any, flags: Mapping[str, Any]) -> Any:
    given = {k: flags.get(k) for k in ENV_FLAGS if flags.get(k) is not None}
    if not given:
        return file_value if file_value is not None else "none"
    env = {"kind": file_value} if isinstance(file_value, str) else dict(file_value or {})
    env = {str(k).replace("-", "_"): v for k, v in env.items()}
    env.update(given)
    if "kind" not in given and env.get("kind", "none") == "none":
        env["kind"] = _infer_kind(env)
    return env


def _infer_kind(env: dict[str, Any]) -> str:
    if env.get("conda_env"):
        return "conda"
    if env.get("venv"):
        return "venv"
    if env.get("image"):
        from hpctrain.images import docker_pull_hint

        hint = docker_pull_hint(str(env["image"]))
        if hint:
            raise UserError(hint)
        if str(env["image"]).endswith(".sif"):
            return "apptainer"
        raise UserError(f"--image {env['image']!r}: say which runtime with --env-kind apptainer or --env-kind pyxis")
    if env.get("modules"):
        return "modules"
    return "none"
