"""The command-line flags Kubernetes owns: where the jobs are (a namespace, a kubeconfig context, the kind of
job) and a job's options (volumes, node selectors, ...). The CLI asks each backend's INFO to add its own.
"""

from __future__ import annotations

import argparse

from hpctrain.schedulers.base import SERVICE_ROLES
from hpctrain.schedulers.kubernetes.manifests.options import APIS


def add_arguments(parser: argparse.ArgumentParser, group: argparse._ArgumentGroup, role: str) -> None:
    """Where the jobs are, in the command's scheduler `group`, for every role (hpctrain.schedulers.base.ROLES); the
    kind of job where a command handles jobs (not a service's: dev, tensorboard, top); role `job` (submit, check)
    adds a job's options, `dev` and `tensorboard` a service pod's volumes (and /dev/shm), `logs` the replica."""
    group.add_argument(
        "--namespace",
        metavar="NAME",
        help="Kubernetes: the namespace (default: $HPCTRAIN_NAMESPACE, else the kubeconfig context's, else default)",
    )
    if role not in SERVICE_ROLES:
        group.add_argument(
            "--k8s-api",
            dest="k8s_api",
            choices=APIS,
            help="Kubernetes: Kubeflow PyTorchJob (default) or Trainer v2 TrainJob",
        )
    group.add_argument(
        "--context", metavar="NAME", help="Kubernetes: the kubeconfig context (default: the current one)"
    )
    if role == "logs":
        parser.add_argument_group("kubernetes (with --scheduler kubernetes)").add_argument(
            "--replica",
            metavar="NAME",
            help="Kubernetes: the replica whose log to show (master-0, worker-1; default: rank 0)",
        )
    if role in ("dev", "tensorboard"):
        g = parser.add_argument_group("kubernetes: where the pod runs (with --scheduler kubernetes)")
        if role == "dev":
            g.add_argument("--shm", help="Kubernetes: size of /dev/shm, e.g. 8Gi")
        g.add_argument(
            "--volume",
            dest="volumes",
            action="append",
            default=[],
            help="Kubernetes: pvc:CLAIM:/mount, nfs:... (repeatable)",
        )
    if role != "job":
        return
    k = parser.add_argument_group("kubernetes (with --scheduler kubernetes; --nodes counts worker pods)")
    k.add_argument(
        "--shm", metavar="SIZE", help="size of /dev/shm, an in-memory volume (e.g. 8Gi): DataLoader workers need it"
    )
    k.add_argument("--priority-class", metavar="NAME", help="the pods' PriorityClass")
    k.add_argument(
        "--volume",
        dest="volumes",
        action="append",
        metavar="SPEC",
        help="pvc:CLAIM:/mount, nfs:SERVER:/export:/mount or host:/node/path:/mount, each with an "
        "optional :ro (repeatable)",
    )
    k.add_argument(
        "--node-selector",
        dest="node_selector",
        action="append",
        metavar="KEY=VALUE",
        help="run only on nodes with this label (repeatable)",
    )
    k.add_argument(
        "--toleration",
        dest="tolerations",
        action="append",
        metavar="KEY[=VALUE][:EFFECT]",
        help="tolerate a node taint (repeatable)",
    )
    k.add_argument("--service-account", metavar="NAME")
    k.add_argument(
        "--image-pull-secret",
        dest="image_pull_secrets",
        action="append",
        metavar="NAME",
        help="secret for pulling --image from a private registry (repeatable)",
    )
    k.add_argument(
        "--label",
        dest="labels",
        action="append",
        metavar="KEY=VALUE",
        help="extra label on the job and its pods (repeatable)",
    )
    k.add_argument(
        "--replace",
        action="store_true",
        default=None,
        help="submit: a job of the same name in the namespace, running or ended, is deleted first (its "
        "pods get SIGTERM and their grace period), then this one is created",
    )
    k.add_argument(
        "--runtime",
        metavar="NAME",
        help="--k8s-api trainjob: the ClusterTrainingRuntime the TrainJob runs "
        "on (default: torch-distributed; `kubectl get clustertrainingruntimes` lists them)",
    )
