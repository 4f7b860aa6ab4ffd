"""The commands around the job, on the cluster: a server process (JupyterLab, sshd, a VS Code tunnel, TensorBoard)
in a Slurm job or a Kubernetes pod, its connection details kept private in a state directory, the command that
reaches it; and the probe `hpctrain top` runs on a job's nodes.

    services = services_for(get_scheduler("slurm"))   # the backend's services (base.Services), imported lazily
    lines = services.dev_start(cfg, placement, wait_s=600, local_port=None)

  * base.py                Services (what each backend offers `dev`, `tensorboard --on-cluster`, `top`), Placement
  * common.py              state directories (0700) and private files (0600), HTTP readiness probes, the tunnel command
  * slurm.py               a service as a batch job: render_service_script (pure) + submit (thin) + wait_ready
  * kubernetes.py          a service as a pod: render_pod (pure) + create/find/delete + port-forward command
  * slurm_services.py      Services on Slurm: dev sessions, TensorBoard as a job, top through `srun --overlap`
  * kubernetes_services.py Services on Kubernetes: dev pods, TensorBoard as a pod, top through the exec stream

Dev sessions themselves (per service and per backend) are in hpctrain.sessions. Importing this package imports no
backend: a Slurm user never loads the Kubernetes client.
"""

from __future__ import annotations

import importlib
from typing import Any

from hpctrain.services.base import Placement, Services

# scheduler name -> module with a `create(scheduler) -> Services` function.
SERVICES: dict[str, str] = {
    "slurm": "hpctrain.services.slurm_services",
    "kubernetes": "hpctrain.services.kubernetes_services",
}

__all__ = ["SERVICES", "Placement", "Services", "services_for"]


def services_for(scheduler: Any) -> Services:
    """The services of the backend `scheduler` (a hpctrain.schedulers.Scheduler) is, on its connection."""
    return importlib.import_module(SERVICES[scheduler.name]).create(scheduler)
