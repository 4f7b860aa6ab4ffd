"""The commands around the job on the cluster (`dev`, `tensorboard --on-cluster`, `top`), one module per backend
behind one interface, so that those commands never name a scheduler:

    services = services_for(get_scheduler("slurm"))   # the backend's Services (base.py), imported lazily
    lines = services.dev_start(cfg, placement, wait_s=600, local_port=None)

  * base.py        Services (what each backend offers `dev`, `tensorboard --on-cluster`, `top`) and Placement
  * slurm.py       on Slurm: dev sessions as batch jobs, TensorBoard as a job, top through `srun --overlap`
  * kubernetes.py  on Kubernetes: dev pods, TensorBoard as a pod, top through the API server's exec stream

Below them: hpctrain.sessions (dev sessions per service and per backend), hpctrain.tbserver and hpctrain.top (what
does not depend on the backend), hpctrain.services (a server as a job or a pod). Importing this package imports no
backend: a Slurm user never loads the Kubernetes client.
"""

from __future__ import annotations

import importlib
from typing import Any

from hpctrain.schedulers.services import Placement, Services

# scheduler name -> module with a `create(scheduler) -> Services` function.
BACKENDS: dict[str, str] = {
    "slurm": "hpctrain.schedulers.slurm.around",
    "kubernetes": "hpctrain.schedulers.kubernetes.pods",
}

__all__ = ["BACKENDS", "Placement", "Services", "services_for"]


def services_for(scheduler: Any) -> Services:
    """The services of the backend `scheduler` (a hpctrain.schedulers.Scheduler) is, on its connection."""
    return importlib.import_module(BACKENDS[scheduler.name]).create(scheduler)
