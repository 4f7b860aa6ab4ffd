"""Kubernetes: Kubeflow PyTorchJob / Trainer v2 TrainJob behind hpctrain's scheduler interface.

Importing this package does not import the `kubernetes` client; `KubernetesScheduler` loads it on first use.
"""

from __future__ import annotations

from typing import Any

from hpctrain.schedulers.kubernetes.options import KubernetesOptions


def create(options: KubernetesOptions | None = None, context: str | None = None, **fields: Any):
    """The registry's entry point: `get_scheduler("kubernetes", namespace="team-a", api="trainjob")` or
    `get_scheduler("kubernetes", options=KubernetesOptions(...), context="prod")`. Without a namespace: the
    default one of kubeconfig.default_namespace (HPCTRAIN_NAMESPACE, the context's, `default`)."""
    from hpctrain.schedulers.kubernetes.scheduler import KubernetesScheduler

    if options is None:
        if fields.get("namespace") is None:  # as kubectl: the context's namespace (or HPCTRAIN_NAMESPACE)
            from hpctrain.schedulers.kubernetes.kubeconfig import default_namespace

            fields["namespace"] = default_namespace(context)
        options = KubernetesOptions(**fields)
    elif fields:
        raise TypeError("give KubernetesOptions or its fields, not both")
    return KubernetesScheduler(options, context=context)


__all__ = ["KubernetesOptions", "create"]
