"""`hpctrain dev start|list|stop NAME`: an interactive JupyterLab (or sshd, or a VS Code tunnel) on a compute node,
or JupyterLab in a pod.

    hpctrain dev start explore --gpus-per-node 1 --cpus 8 --mem 32G --time 4:00:00 --venv ~/venvs/torch
    hpctrain dev list --idle-warn 1h
    hpctrain dev stop explore
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError

_DURATION_RE = re.compile(r"^(?P<n>\d+(?:\.\d+)?)(?P<unit>[smhd]?)$")


def add_service_job_arguments(parser: argparse.ArgumentParser, wait_help: str) -> None:
    """Where a service job or pod (`dev start`, `tensorboard --on-cluster`) runs, with which software, and how
    long `start` waits for its server (`wait_help`): the flags both share."""
    parser.add_argument("--partition", help="Slurm: partition")
    parser.add_argument("--account", help="Slurm: account")
    parser.add_argument("--image", help="Slurm: an apptainer .sif or enroot .sqsh file; Kubernetes: the container image")
    parser.add_argument("--conda-env", help="Slurm: activate this conda environment")
    parser.add_argument("--venv", help="Slurm: activate this virtual environment")
    parser.add_argument("--module", action="append", default=[], help="Slurm: `module load` this first (repeatable)")
    parser.add_argument("--mount", action="append", default=[], help="Slurm containers: bind SRC[:DST] (repeatable)")
    parser.add_argument("--volume", action="append", default=[], help="Kubernetes: pvc:CLAIM:/mount, nfs:... (repeatable)")
    parser.add_argument("--wait", type=float, default=600.0, metavar="S",
                        help=wait_help)
    parser.add_argument("--login-host", help="the login node your machine reaches with ssh (default: this host's name)")


def add_scheduler_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scheduler", choices=("slurm", "kubernetes"),
                        help="where to run (default: $HPCTRAIN_SCHEDULER, else slurm when sbatch is on PATH, else "
                             "kubernetes with a kubeconfig)")
    parser.add_argument("--namespace",
                        help="Kubernetes namespace (default: $HPCTRAIN_NAMESPACE, else the kubeconfig context's, else default)")
    parser.add_argument("--context", help="Kubernetes context of the kubeconfig (default: its current context)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    start = sub.add_parser("start", help="start a session and print how to reach it")
    start.add_argument("name", metavar="NAME", help="session name (lower-case letters, digits, -)")
    start.add_argument("--service", choices=("jupyter", "ssh", "code"), default="jupyter",
                       help="jupyter: JupyterLab with a random token (default); ssh: an sshd of your own, for ssh and "
                            "VS Code Remote-SSH (Slurm only); code: a VS Code tunnel (`code tunnel`, which must be "
                            "installed on the compute nodes; Slurm only)")
    start.add_argument("--ssh-key", type=Path, metavar="FILE.pub",
                       help="--service ssh: the public key you will log in with, from the machine you connect from "
                            "(default: the first of ~/.ssh/id_ed25519.pub, id_ecdsa.pub, id_rsa.pub here)")
    start.add_argument("--port", type=int, help="the server's port (default: a free one on Slurm, 8888 in a pod)")
    start.add_argument("--cpus", type=int, default=2, help="CPUs (default: 2)")
    start.add_argument("--gpus-per-node", type=int, default=0, metavar="N", help="whole GPUs")
    start.add_argument("--gpu-type", help="GPU type, as `sinfo -o %%G` shows it")
    start.add_argument("--gres", metavar="shard:N", help="a slice of a shared GPU instead (Slurm shard GRES)")
    start.add_argument("--mem", help="memory, e.g. 16G")
    start.add_argument("--time", default="04:00:00", help="time limit (default: 04:00:00); the session ends then")
    add_service_job_arguments(start, "seconds to wait for the server to answer (default: 600; 0 on Kubernetes: do "
                                     "not wait)")
    start.add_argument("--shm", help="Kubernetes: size of /dev/shm, e.g. 8Gi")
    start.add_argument("--local-port", type=int, help="port on your machine for the tunnel (default: the same as remote)")
    start.add_argument("--dry-run", action="store_true", help="print the batch script or pod manifest; submit nothing")
    add_scheduler_arguments(start)

    listing = sub.add_parser("list", help="sessions, how long they have run, and which sit idle")
    listing.add_argument("--idle-warn", default="1h", metavar="DURATION",
                         help="warn about sessions idle longer than this (90s, 30m, 2h; default: 1h)")
    add_scheduler_arguments(listing)

    stop = sub.add_parser("stop", help="stop a session and free its node or pod")
    stop.add_argument("name", metavar="NAME")
    add_scheduler_arguments(stop)


def parse_duration_s(text: str, flag: str) -> float:
    m = _DURATION_RE.match(str(text).strip())
    if not m:
        raise UserError(f"{flag} {text!r}: give a duration such as 90s, 30m, 2h or 1d (a bare number is minutes)")
    return float(m["n"]) * {"s": 1, "": 60, "m": 60, "h": 3600, "d": 86400}[m["unit"]]


def format_age(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"


def environment_from_args(args: argparse.Namespace) -> Any:
    """--image/--conda-env/--venv/--module/--mount -> EnvironmentSpec (Slurm)."""
    from hpctrain.images import docker_pull_hint
    from hpctrain.jobs.spec import EnvironmentSpec

    chosen = [f for f, v in (("--image", args.image), ("--conda-env", args.conda_env), ("--venv", args.venv)) if v]
    if len(chosen) > 1:
        raise UserError(f"{' and '.join(chosen)}: choose one environment")
    modules = tuple(args.module)
    mounts = tuple(args.mount)
    if args.image:
        hint = docker_pull_hint(args.image)
        if hint:
            raise UserError(hint)
        kind = "apptainer" if args.image.endswith(".sif") else "pyxis"
        return EnvironmentSpec(kind=kind, image=args.image, modules=modules, mounts=mounts)
    if args.conda_env:
        return EnvironmentSpec(kind="conda", conda_env=args.conda_env, modules=modules, mounts=mounts)
    if args.venv:
        return EnvironmentSpec(kind="venv", venv=args.venv, modules=modules, mounts=mounts)
    return EnvironmentSpec(kind="modules" if modules else "none", modules=modules, mounts=mounts)


def config_from_args(args: argparse.Namespace, kubernetes: bool) -> Any:
    from hpctrain.devsession import DevConfig
    from hpctrain.jobs.spec import EnvironmentSpec, Resources, parse_gres

    gpus, gpu_type, shards = parse_gres(args.gres) if args.gres else (0, None, 0)
    if gpus:
        raise UserError(f"--gres {args.gres}: ask for whole GPUs with --gpus-per-node N; --gres is for shard:N")
    resources = Resources(cpus_per_task=args.cpus, gpus_per_node=args.gpus_per_node, gpu_type=args.gpu_type,
                          shards_per_node=shards, mem=args.mem)
    if kubernetes:
        if args.conda_env or args.venv or args.module or args.mount:
            raise UserError("--conda-env/--venv/--module/--mount apply to Slurm: on Kubernetes the --image is the "
                            "environment and --volume mounts storage")
        environment = EnvironmentSpec()
    else:
        if args.shm or args.volume:
            raise UserError("--shm/--volume apply to Kubernetes: on Slurm use --mount with a container --image")
        environment = environment_from_args(args)
    return DevConfig(name=args.name, service=args.service, resources=resources, environment=environment,
                     time=args.time, partition=args.partition, account=args.account, port=args.port,
                     ssh_key=args.ssh_key)


def k8s_options(args: argparse.Namespace, **extra: Any) -> Any:
    from hpctrain.schedulers.kubernetes.options import KubernetesOptions

    from hpctrain.schedulers.kubernetes.kubeconfig import default_namespace

    return KubernetesOptions(namespace=args.namespace or default_namespace(args.context), **extra)


def scheduler_of(args: argparse.Namespace) -> str:
    from hpctrain.cli.scheduling import choose_scheduler

    return choose_scheduler(args)


def core_of(args: argparse.Namespace) -> Any:
    from hpctrain.services.kubernetes import core_api

    return core_api(context=args.context)


def run(args: argparse.Namespace) -> int:
    return {"start": _start, "list": _list, "stop": _stop}[args.action](args)


def _start(args: argparse.Namespace) -> int:
    from hpctrain import devsession
    from hpctrain.services.common import login_host

    scheduler = scheduler_of(args)
    cfg = config_from_args(args, kubernetes=scheduler == "kubernetes")
    if scheduler == "kubernetes":
        options = k8s_options(args, image=args.image, shm=args.shm, volumes=tuple(args.volume))
        if args.dry_run:
            from hpctrain.schedulers.kubernetes.render import render_yaml

            print(render_yaml(devsession.render_dev_pod(cfg, options)), end="")
            return 0
        conn = devsession.start_kubernetes(cfg, options, core_of(args), None, args.wait, args.local_port)
        print("\nOn your machine, forward the port (keep it running):")
        print(f"  {conn['port_forward']}")
        print(f"then open:\n  {conn['url']}")
        print(f"Stop it when done: hpctrain dev stop {cfg.name} --scheduler kubernetes")
        return 0
    state_dir = devsession.session_dir(cfg.name)
    if args.dry_run:
        print(devsession.render_dev_script(cfg, state_dir), end="")
        return 0
    conn = devsession.start_slurm(cfg, None, args.login_host or login_host(), args.wait, args.local_port)
    if cfg.service == "code":
        print(f"\nThe VS Code tunnel {conn['tunnel_name']} is up (job {conn['job_id']} on {conn['node']}). Open:")
        print(f"  {conn['url']}")
        print(f"or in VS Code: Remote Explorer > Tunnels > {conn['tunnel_name']} (signed in with the same account)")
        if conn.get("login_prompt"):
            print(f"(it asked you to sign in: {conn['login_prompt']})")
    elif cfg.service == "ssh":
        print(f"\nsshd is up on {conn['node']}:{conn['port']} (job {conn['job_id']}). Log in through the login node:")
        print(f"  {conn['ssh']}")
        print(f"Its host key, made for this session: {conn['host_key_fingerprint']} (ED25519). For VS Code Remote-SSH, "
              f"add to ~/.ssh/config:\n")
        print(conn["ssh_config"])
        print(f"and to ~/.ssh/known_hosts:\n  {conn['known_hosts']}\nthen connect to {devsession.ssh_alias(cfg.name)}.")
        print(f"(or, with a tunnel: {conn['tunnel']}, then ssh -p {conn['local_port']} {conn['user']}@localhost)")
    else:
        print(f"\n{cfg.service} is up on {conn['node']}:{conn['port']} (job {conn['job_id']}). On your machine, open the tunnel:")
        print(f"  {conn['tunnel']}")
        print(f"then open:\n  {conn['url']}")
    print(f"Details (private): {state_dir / devsession.CONNECTION_FILE}")
    print(f"Stop it when done, so that it stops holding the node: hpctrain dev stop {cfg.name}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from hpctrain import devsession

    idle_warn = parse_duration_s(args.idle_warn, "--idle-warn")
    recorded = devsession.recorded_schedulers()
    core = core_of(args) if "kubernetes" in recorded or args.scheduler == "kubernetes" else None
    sessions = devsession.list_sessions(core=core)
    if not sessions:
        print("no dev sessions (start one with `hpctrain dev start NAME`)")
        return 0
    rows = [("NAME", "SCHEDULER", "JOB/POD", "STATE", "AGE", "ENDPOINT", "IDLE")]
    warnings = []
    for s in sessions:
        rows.append((s.name, s.scheduler, s.where, s.state, format_age(s.age_s), s.endpoint or "-", format_age(s.idle_s)))
        if s.idle_s is not None and s.idle_s > idle_warn:
            warnings.append(f"warning: {s.name} has been idle for {format_age(s.idle_s)} (no kernel or terminal activity) "
                            f"while holding its resources: `hpctrain dev stop {s.name}`")
        if s.state in ("GONE",) or s.state in _ENDED:
            warnings.append(f"note: {s.name} has ended ({s.state}); `hpctrain dev stop {s.name}` forgets it")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    for w in warnings:
        print(w, file=sys.stderr if w.startswith("warning") else sys.stdout)
    return 0


_ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "SUCCEEDED"}


def _stop(args: argparse.Namespace) -> int:
    from hpctrain import devsession
    from hpctrain.services.common import read_json

    conn = read_json(devsession.session_dir(args.name) / devsession.CONNECTION_FILE) or {}
    core = core_of(args) if conn.get("scheduler") == "kubernetes" else None
    print(f"dev session {args.name}: {devsession.stop(args.name, core=core)}")
    return 0
