"""TEST ORACLE, all of it: what a real cluster (Kubeflow training-operator v1.9.4, Trainer v2.3.0 with JobSet v0.12.0,
Kubernetes 1.29 and 1.35) would refuse when hpctrain creates `obj`. `refusals(obj)` is empty when every part accepts:

  * the vendored CRD's openAPIV3Schema with its CEL rules (tests/kubeflow_crds.py)
  * the admission webhooks and the API server's object rules (tests/kubeflow_rules.py)
  * Kubernetes' core/v1 OpenAPI of the oldest and newest release covered, for every pod and pod template: a
    PyTorchJob's replica templates, a TrainJob's runtime patch and the pod template Trainer would make of the
    runtime, the patch and the trainer (tests/kubernetes_openapi.py)

The stand-in controllers (tests/kubeflow_standin.py, tests/trainer_standin.py) apply it to every job they see, so a
job a real cluster refuses fails the end-to-end tests too.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import kubeflow_crds
import kubeflow_rules as rules
import kubernetes_openapi

RUNTIME_FILE = "torch_distributed.yaml"
"""Trainer v2.3.0's torch-distributed ClusterTrainingRuntime (vendored beside the CRDs)."""


@functools.lru_cache(maxsize=None)
def default_runtimes() -> dict[str, dict[str, Any]]:
    runtime = kubeflow_crds.read_vendored(RUNTIME_FILE)
    return {runtime["metadata"]["name"]: runtime}


def merge(base: Any, patch: Any) -> Any:
    """A strategic merge, as far as runtime patches need it (Trainer applies them as apply configurations: maps merge
    key by key, lists of named items merge by name, anything else is replaced)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        return {**base, **{k: merge(base[k], v) if k in base else v for k, v in patch.items()}}
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(x, dict) and "name" in x for x in base + patch)
    ):
        merged = {x["name"]: x for x in base}
        for x in patch:
            merged[x["name"]] = merge(merged[x["name"]], x) if x["name"] in merged else x
        return list(merged.values())
    return patch


def trainer_pod_template(job: dict[str, Any], runtime: dict[str, Any]) -> dict[str, Any]:
    """The `node` pod template Trainer makes: the runtime's, the TrainJob's runtimePatches merged in, and the trainer's
    image, command, args and env on the `node` container (Trainer v2.3.0 pkg/runtime/framework/plugins/jobset/
    builder.go Trainer(): env upserted by name), resourcesPerNode merged into the runtime's resources key by key
    (pkg/runtime/core/trainingruntime.go with pkg/util/trainingruntime MergeResourceRequirements, a strategic
    merge)."""
    spec = copy.deepcopy(runtime["spec"])
    for patch in (job.get("spec") or {}).get("runtimePatches") or []:
        spec = merge(spec, patch.get("trainingRuntimeSpec") or {})
    rjob = next(r for r in spec["template"]["spec"]["replicatedJobs"] if r["name"] == "node")
    template = copy.deepcopy(rjob["template"]["spec"]["template"])
    trainer = (job.get("spec") or {}).get("trainer") or {}
    for c in template["spec"]["containers"]:
        if c["name"] == "node":
            c.update({k: trainer[k] for k in ("image", "command", "args") if k in trainer})
            if trainer.get("env"):
                c["env"] = merge(c.get("env") or [], trainer["env"])
            if "resourcesPerNode" in trainer:
                c["resources"] = merge(c.get("resources") or {}, trainer["resourcesPerNode"])
    return template


def _pod_template(template: dict[str, Any], where: str) -> list[str]:
    return [
        f"core/v1 {v} {where}: {p}"
        for v in kubernetes_openapi.VERSIONS
        for p in kubernetes_openapi.validate(template, "PodTemplateSpec", v)
    ] + rules.pod_spec(template.get("spec") or {}, f"{where}.spec")


def refusals(obj: dict[str, Any], runtimes: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """Every reason a real cluster would refuse creating `obj`, one line each; `runtimes` are the cluster's
    ClusterTrainingRuntimes and the namespace's TrainingRuntimes by name (default: the vendored torch-distributed)."""
    kind = obj.get("kind")
    if kind in ("Pod", "Secret", "Service"):
        name_rule = rules.dns1035_label if kind == "Service" else rules.dns1123_subdomain
        return (
            rules.object_meta(obj, name_rule, "K8S pkg/apis/core/validation/validation.go")
            + [
                f"core/v1 {v}: {p}"
                for v in kubernetes_openapi.VERSIONS
                for p in kubernetes_openapi.validate(obj, kind, v)
            ]
            + (rules.pod_spec(obj.get("spec") or {}, "spec") if kind == "Pod" else [])
        )
    out = [f"CRD {p}" for p in kubeflow_crds.validate(obj)] + rules.custom_resource_meta(obj)
    if kind == "PyTorchJob":
        out += rules.pytorchjob_webhook(obj) + rules.pytorchjob_elastic_env(obj) + rules.pytorchjob_children(obj)
        for rtype, rspec in ((obj.get("spec") or {}).get("pytorchReplicaSpecs") or {}).items():
            out += _pod_template((rspec or {}).get("template") or {}, f"spec.pytorchReplicaSpecs[{rtype}].template")
    elif kind in ("TrainingRuntime", "ClusterTrainingRuntime"):
        out += rules.trainingruntime_webhook(obj)
        rjobs = ((((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get("replicatedJobs")) or []
        for rjob in rjobs:
            out += _pod_template(
                ((rjob.get("template") or {}).get("spec") or {}).get("template") or {},
                f"spec.template.spec.replicatedJobs[{rjob.get('name')}].template",
            )
    elif kind == "TrainJob":
        runtimes = default_runtimes() if runtimes is None else runtimes
        webhook = rules.trainjob_webhook(obj, runtimes)
        out += webhook
        ref = ((obj.get("spec") or {}).get("runtimeRef") or {}).get("name")
        if ref in runtimes:
            out += rules.jobset_webhook(rules.trainjob_jobset(obj, runtimes[ref]))
            out += _pod_template(trainer_pod_template(obj, runtimes[ref]), "the trainer's node pod template")
    return out
