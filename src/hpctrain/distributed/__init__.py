"""Who am I in a distributed job, and joining its process group.

    from hpctrain.distributed import setup
    env, device = setup()          # works under python, torchrun, srun, Kubeflow, `hpctrain train --nproc`

`detect()` reads the launcher's variables (pure, no torch import); `resolve_device()` and
`init_process_group()` import torch when called. See examples/ddp_user_script.py.

Modules: environment.py (DistEnv, NodePlan), detect.py (detect() and --dist-init-method), probes.py (what each
launcher's variables say: node plans, restart counts, the derived port), hostlist.py (Slurm hostlists),
process_group.py (device and process group), collectives.py (the collectives hpctrain runs, safe to end a
process group right after), failures.py (a collective's failure named as the
missing rank), cores.py (the CPU cores a process may use and the thread count), ports.py (a free TCP port),
lifetime.py (a child that dies with its parent).
"""

from __future__ import annotations

from hpctrain.distributed.environment import LAUNCHERS, DistEnv, NodePlan
from hpctrain.distributed.hostlist import expand_hostlist, expand_tasks_per_node, first_host
from hpctrain.distributed.detect import detect
from hpctrain.distributed.probes import PROBES, kubeflow_node_plan, restart_count, slurm_node_plan, slurm_port
from hpctrain.distributed.collectives import all_gather_object, all_reduce, all_reduce_mean, barrier
from hpctrain.distributed.process_group import (
    destroy_process_group,
    init_process_group,
    pick_device,
    resolve_device,
    setup,
)

__all__ = [
    "LAUNCHERS",
    "PROBES",
    "DistEnv",
    "NodePlan",
    "all_gather_object",
    "all_reduce",
    "all_reduce_mean",
    "barrier",
    "destroy_process_group",
    "detect",
    "expand_hostlist",
    "expand_tasks_per_node",
    "first_host",
    "init_process_group",
    "kubeflow_node_plan",
    "slurm_node_plan",
    "pick_device",
    "resolve_device",
    "restart_count",
    "setup",
    "slurm_port",
]
