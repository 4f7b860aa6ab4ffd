"""TEST ORACLE: the admission rules a real cluster applies to what hpctrain creates, re-expressed in Python from the
projects' own sources (written here, not copied). Each rule names its source file and release:

  TO   training-operator v1.9.4 (github.com/kubeflow/trainer, tag v1.9.4, commit 4445c12a)
  TR   Kubeflow Trainer v2.3.0 (github.com/kubeflow/trainer, tag v2.3.0, commit 658725bd)
  JS   JobSet v0.12.0 (github.com/kubernetes-sigs/jobset, tag v0.12.0, commit f22e565a)
  K8S  Kubernetes' object validation (k8s.io/apimachinery pkg/util/validation/validation.go and
       pkg/apis/core/validation/validation.go, release 1.35), which the API server applies to the pods and
       Services the controllers create from our objects

The schema and CEL rules of the CRDs themselves are tests/kubeflow_crds.py's; core/v1's OpenAPI is
tests/kubernetes_openapi.py's. `refusals(obj)` runs everything a create of `obj` meets (module `oracle` below) and
returns one line per refusal, each starting with its source, e.g.
`TR pkg/runtime/framework/plugins/jobset/jobset.go: spec.runtimePatches.manager: Invalid value: "hpctrain": ...`.
"""

from __future__ import annotations

import re
from typing import Any

# ---- K8S: k8s.io/apimachinery/pkg/util/validation/validation.go (1.35) --------------------------------------

_K8S = "K8S k8s.io/apimachinery/pkg/util/validation/validation.go"
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_HTTP_PATH = re.compile(r"^[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$")


def dns1123_label(value: str) -> list[str]:
    """IsDNS1123Label: at most 63 characters, lower-case alphanumerics and '-', alphanumeric at both ends."""
    out = (
        []
        if _DNS1123_LABEL.match(value)
        else [
            "a lowercase RFC 1123 label must consist of lower case alphanumeric "
            "characters or '-', and must start and end with an alphanumeric character"
        ]
    )
    return out + (["must be no more than 63 characters"] if len(value) > 63 else [])


def dns1035_label(value: str) -> list[str]:
    """IsDNS1035Label: as a DNS-1123 label, but starting with a letter."""
    out = (
        []
        if _DNS1035_LABEL.match(value)
        else [
            "a DNS-1035 label must consist of lower case alphanumeric characters "
            "or '-', start with an alphabetic character, and end with an alphanumeric character"
        ]
    )
    return out + (["must be no more than 63 characters"] if len(value) > 63 else [])


def dns1123_subdomain(value: str) -> list[str]:
    """IsDNS1123Subdomain: dot-separated DNS-1123 labels, at most 253 characters."""
    out = (
        []
        if _DNS1123_SUBDOMAIN.match(value)
        else ["a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"]
    )
    return out + (["must be no more than 253 characters"] if len(value) > 253 else [])


def qualified_name(value: str) -> list[str]:
    """IsQualifiedName (label keys): an optional DNS-subdomain prefix and '/', then a name of at most 63."""
    prefix, _, name = value.rpartition("/") if "/" in value else ("", "", value)
    out = dns1123_subdomain(prefix) if "/" in value else []
    if not _QUALIFIED_NAME.match(name) or len(name) > 63:
        out.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', start and end with an "
            "alphanumeric character, and be at most 63 characters"
        )
    return out


def label_value(value: str) -> list[str]:
    """IsValidLabelValue: empty, or at most 63 alphanumerics, '-', '_', '.', alphanumeric at both ends."""
    ok = _LABEL_VALUE.match(value) and len(value) <= 63
    return (
        []
        if ok
        else [
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
            "'.', must start and end with an alphanumeric character, and be at most 63 characters"
        ]
    )


def domain_prefixed_path(value: str) -> list[str]:
    """IsDomainPrefixedPath: `host/path` (e.g. acme.io/foo), host a DNS-1123 subdomain, path of HTTP path characters."""
    host, slash, path = value.partition("/")
    if not value:
        return ["Required value"]
    if not slash or not host or not path:
        return ['must be a domain-prefixed path (such as "acme.io/foo")']
    out = dns1123_subdomain(host)
    return out + ([] if _HTTP_PATH.match(path) else ["Invalid path"])


def _each(source: str, where: str, value: str, problems: list[str]) -> list[str]:
    return [f"{source}: {where}: Invalid value: {value!r}: {p}" for p in problems]


def labels(source: str, where: str, mapping: dict[str, str] | None) -> list[str]:
    """ValidateLabels (apimachinery pkg/apis/meta/v1/validation): every key a qualified name, every value a label
    value."""
    out: list[str] = []
    for key, value in (mapping or {}).items():
        out += _each(source, f"{where}[{key}]", key, qualified_name(key))
        out += _each(source, f"{where}[{key}]", str(value), label_value(str(value)))
    return out


def object_meta(obj: dict[str, Any], name_rule: Any, source: str) -> list[str]:
    """The API server's ObjectMeta checks: the name (by the kind's rule) and the labels."""
    meta = obj.get("metadata") or {}
    return _each(source, "metadata.name", meta.get("name", ""), name_rule(meta.get("name", ""))) + labels(
        source, "metadata.labels", meta.get("labels")
    )


def custom_resource_meta(obj: dict[str, Any]) -> list[str]:
    """A custom resource's name is a DNS-1123 subdomain (apiextensions-apiserver's customresource strategy, 1.35)."""
    return object_meta(obj, dns1123_subdomain, "K8S apiextensions-apiserver pkg/registry/customresource/validator.go")


def pod_template_meta(template: dict[str, Any], where: str) -> list[str]:
    """Labels of a pod template become the pods' labels (pkg/apis/core/validation/validation.go: ValidateObjectMeta)."""
    return labels(
        "K8S pkg/apis/core/validation/validation.go",
        f"{where}.metadata.labels",
        (template.get("metadata") or {}).get("labels"),
    )


def pod_spec(spec: dict[str, Any], where: str) -> list[str]:
    """ValidatePodSpec's rules on placement (pkg/apis/core/validation/validation.go, 1.35): nodeSelector labels;
    required node affinity: matchExpressions with a qualified-name key and, for In/NotIn, at least one value, each a
    valid label value (new pods since 1.32: AllowInvalidLabelValueInRequiredNodeAffinity is false for them);
    matchFields only on metadata.name, In/NotIn with exactly one value, a DNS-1123 subdomain
    (ValidateNodeSelectorRequirement, ValidateNodeFieldSelectorRequirement); toleration values are label values."""
    source = "K8S pkg/apis/core/validation/validation.go"
    out = labels(source, f"{where}.nodeSelector", spec.get("nodeSelector"))
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required is not None:
        terms = required.get("nodeSelectorTerms") or []
        if not terms:
            out.append(
                f"{source}: {where}.affinity...nodeSelectorTerms: Required value: "
                "must have at least one node selector term"
            )
        for i, term in enumerate(terms):
            at = f"{where}.affinity.nodeAffinity.required.nodeSelectorTerms[{i}]"
            for j, rq in enumerate(term.get("matchExpressions") or []):
                values, op = rq.get("values") or [], rq.get("operator")
                if op in ("In", "NotIn") and not values:
                    out.append(f"{source}: {at}.matchExpressions[{j}].values: Required value")
                elif op not in ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"):
                    out.append(f"{source}: {at}.matchExpressions[{j}].operator: Invalid value: {op!r}")
                out += _each(
                    source, f"{at}.matchExpressions[{j}].key", rq.get("key", ""), qualified_name(rq.get("key", ""))
                )
                for k, value in enumerate(values):
                    out += _each(source, f"{at}.matchExpressions[{j}].values[{k}]", value, label_value(value))
            for j, rq in enumerate(term.get("matchFields") or []):
                values = rq.get("values") or []
                if rq.get("operator") not in ("In", "NotIn"):
                    out.append(
                        f"{source}: {at}.matchFields[{j}].operator: Invalid value: not a valid selector operator"
                    )
                elif len(values) != 1:
                    out.append(
                        f"{source}: {at}.matchFields[{j}].values: Required value: must be only one value when "
                        "`operator` is 'In' or 'NotIn' for node field selector"
                    )
                if rq.get("key") != "metadata.name":
                    out.append(f"{source}: {at}.matchFields[{j}].key: Invalid value: not a valid field selector key")
                for k, value in enumerate(values):
                    out += _each(source, f"{at}.matchFields[{j}].values[{k}]", value, dns1123_subdomain(value))
    for i, toleration in enumerate(spec.get("tolerations") or []):
        value = toleration.get("value") or ""
        out += _each(source, f"{where}.tolerations[{i}].value", value, label_value(value))
    if spec.get("priorityClassName"):
        name = spec["priorityClassName"]
        out += _each(source, f"{where}.priorityClassName", name, dns1123_subdomain(name))
    return out


# ---- TO: training-operator v1.9.4 ----------------------------------------------------------------------------

_TO_WEBHOOK = "TO pkg/webhooks/pytorch/pytorchjob_webhook.go"
_TO_RUNPOLICY = "TO pkg/common/util/webhooks.go"
PYTORCH_CONTAINER = "pytorch"  # PyTorchJobDefaultContainerName (pkg/apis/kubeflow.org/v1/pytorch_types.go)
MANAGED_BY = ("kubeflow.org/training-operator", "kueue.x-k8s.io/multikueue")  # pkg/apis/kubeflow.org/v1/common_types.go


def pytorchjob_webhook(job: dict[str, Any]) -> list[str]:
    """validatePyTorchJob on create: the name a DNS-1035 label; runPolicy.managedBy one of two controllers; with an
    elasticPolicy a Worker and no nprocPerNode beside elasticPolicy.nProcPerNode; replica types Master and Worker
    only, each with containers, each container with an image, one of them named `pytorch`; Master exactly 1
    replica, Worker at least 1."""
    out = _each(
        _TO_WEBHOOK, "metadata.name", job["metadata"].get("name", ""), dns1035_label(job["metadata"].get("name", ""))
    )
    spec = job.get("spec") or {}
    manager = (spec.get("runPolicy") or {}).get("managedBy")
    if manager is not None and manager not in MANAGED_BY:
        out.append(f"{_TO_RUNPOLICY}: spec.runPolicy.managedBy: Unsupported value: {manager!r}")
    replicas = spec.get("pytorchReplicaSpecs")
    elastic = spec.get("elasticPolicy")
    if elastic is not None:
        if "Worker" not in (replicas or {}):
            out.append(
                f"{_TO_WEBHOOK}: spec.pytorchReplicaSpecs[Worker]: Required value: "
                "must be configured if elastic policy is used"
            )
        if elastic.get("nProcPerNode") is not None and spec.get("nprocPerNode") is not None:
            out.append(
                f"{_TO_WEBHOOK}: spec.elasticPolicy.nProcPerNode: Forbidden: must not be used with spec.nprocPerNode"
            )
    if replicas is None:
        return out + [f"{_TO_WEBHOOK}: spec.pytorchReplicaSpecs: Required value: must be required"]
    for rtype, rspec in replicas.items():
        where = f"spec.pytorchReplicaSpecs[{rtype}]"
        if rtype not in ("Master", "Worker"):
            out.append(f"{_TO_WEBHOOK}: {where}: Unsupported value: {rtype!r}")
        containers = ((((rspec or {}).get("template") or {}).get("spec") or {}).get("containers")) or []
        if not containers:
            out.append(f"{_TO_WEBHOOK}: {where}.template.spec.containers: Required value: must be specified")
        for i, c in enumerate(containers):
            if not c.get("image"):
                out.append(f"{_TO_WEBHOOK}: {where}.template.spec.containers[{i}].image: Required value")
        if not any(c.get("name") == PYTORCH_CONTAINER for c in containers):
            out.append(
                f"{_TO_WEBHOOK}: {where}.template.spec.containers: Required value: must have at least one "
                f"container with name {PYTORCH_CONTAINER}"
            )
        count = (rspec or {}).get("replicas")
        if rtype == "Master" and count != 1:
            out.append(f"{_TO_WEBHOOK}: {where}.replicas: Forbidden: must be 1")
        elif rtype != "Master" and count is not None and count < 1:
            out.append(f"{_TO_WEBHOOK}: {where}.replicas: Forbidden: must be at least 1")
        out += pod_template_meta((rspec or {}).get("template") or {}, f"{where}.template")
    return out


_TO_ELASTIC = "TO pkg/controller.v1/pytorch/elastic.go"


def pytorchjob_elastic_env(job: dict[str, Any]) -> list[str]:
    """What the controller needs of an elasticPolicy to give the pods their torchrun variables (ElasticEnvVarGenerator,
    v1.9.4): generateEnvNNodes writes PET_NNODES as `min:max`, dereferencing both minReplicas and maxReplicas once
    either is set (one left out is a nil dereference in the reconcile: the job never gets its pods); and the
    rendezvous host, unless rdzvHost is given, is `JOB-worker-0` (generateEnvRDZVEndpoint), so a Worker replica
    must exist. The webhook checks neither against the other, nor min <= max (torchrun refuses a min above max)."""
    elastic = (job.get("spec") or {}).get("elasticPolicy")
    if elastic is None:
        return []
    out = []
    low, high = elastic.get("minReplicas"), elastic.get("maxReplicas")
    if (low is None) != (high is None):
        out.append(f"{_TO_ELASTIC}: generateEnvNNodes: minReplicas and maxReplicas must be given together")
    elif low is not None and low > high:
        out.append(f"{_TO_ELASTIC}: PET_NNODES {low}:{high}: torchrun refuses a minimum above the maximum")
    return out


def pytorchjob_children(job: dict[str, Any]) -> list[str]:
    """The pods and the headless Services the operator creates per replica, `<job>-<type>-<index>`
    (TO pkg/core/utils.go GenGeneralName; pkg/controller.v1/common/pod.go and service.go), and the API server's
    rules for their names: a pod's a DNS-1123 subdomain, a Service's a DNS-1035 label
    (pkg/apis/core/validation/validation.go ValidatePodName, ValidateServiceName); the job-name label carries the
    job's name (pkg/controller.v1/common/util.go GenLabels)."""
    name = job["metadata"]["name"]
    out = _each(
        "K8S pkg/apis/core/validation/validation.go",
        "pod label training.kubeflow.org/job-name",
        name,
        label_value(name),
    )
    for rtype, rspec in ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).items():
        last = f"{name}-{rtype.lower()}-{max(int((rspec or {}).get('replicas') or 1) - 1, 0)}"
        out += _each("K8S pkg/apis/core/validation/validation.go", f"Pod {last}", last, dns1123_subdomain(last))
        out += _each("K8S pkg/apis/core/validation/validation.go", f"Service {last}", last, dns1035_label(last))
    return out


# ---- TR: Trainer v2.3.0 -----------------------------------------------------------------------------------------

_TR_JOBSET = "TR pkg/runtime/framework/plugins/jobset/jobset.go"
_TR_TORCH = "TR pkg/runtime/framework/plugins/torch/torch.go"
_TR_RUNTIME = "TR pkg/runtime/core/clustertrainingruntime.go"
_TR_NS_RUNTIME = "TR pkg/runtime/core/trainingruntime.go"
_TR_RUNTIME_WEBHOOK = "TR pkg/webhooks/trainingruntime_webhook.go"
TORCHRUN_RESERVED = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
"""TorchRunReservedEnvNames (pkg/constants/constants.go)."""
NO_ENV_PATCH = ("dataset-initializer", "model-initializer", "node")
"""The containers a runtime patch may not give env (pkg/constants/constants.go DatasetInitializer, ModelInitializer,
Node)."""


def _replicated_jobs(runtime_spec: dict[str, Any]) -> dict[str, set[str]]:
    """Each replicated job of a runtime -> the names of its containers and init containers."""
    out: dict[str, set[str]] = {}
    for rjob in ((runtime_spec.get("template") or {}).get("spec") or {}).get("replicatedJobs") or []:
        pod = ((((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")) or {}
        out[rjob["name"]] = {c["name"] for c in (pod.get("containers") or []) + (pod.get("initContainers") or [])}
    return out


def trainjob_webhook(job: dict[str, Any], runtimes: dict[str, dict[str, Any]]) -> list[str]:
    """TrainJobValidator.ValidateCreate (TR pkg/webhooks/trainjob_webhook.go): the referenced runtime must exist (a
    ClusterTrainingRuntime, or a TrainingRuntime in the TrainJob's namespace: ValidateObjects of
    pkg/runtime/core/clustertrainingruntime.go and trainingruntime.go), then the runtime's plugins validate (JobSet,
    Torch; the rules for initializers, torchtune, MPI, XGBoost and Flux do not apply to what hpctrain renders).
    `runtimes`: the cluster's runtimes of either kind by name."""
    spec = job.get("spec") or {}
    ref = spec.get("runtimeRef") or {}
    kind = ref.get("kind", "ClusterTrainingRuntime")
    if (
        kind not in ("ClusterTrainingRuntime", "TrainingRuntime")
        or ref.get("apiGroup", "trainer.kubeflow.org") != "trainer.kubeflow.org"
    ):
        return [f"TR pkg/webhooks/trainjob_webhook.go: unsupported runtime: {ref.get('apiGroup')}/{kind}"]
    found = runtimes.get(ref.get("name"))
    namespace = (job.get("metadata") or {}).get("namespace")
    if (
        found is None
        or found.get("kind", "ClusterTrainingRuntime") != kind
        or (kind == "TrainingRuntime" and (found.get("metadata") or {}).get("namespace") != namespace)
    ):
        source, what = (
            (_TR_RUNTIME, "clusterTrainingRuntime")
            if kind == "ClusterTrainingRuntime"
            else (_TR_NS_RUNTIME, "trainingRuntime")
        )
        return [
            f"{source}: spec.runtimeRef: Invalid value: {ref!r}: specified {what} must be created before the "
            "TrainJob is created"
        ]
    runtime = found["spec"]
    rjobs = _replicated_jobs(runtime)
    out: list[str] = []
    # JobSet plugin, Validate: the patch's manager, and patches only of what the runtime has.
    for patch in spec.get("runtimePatches") or []:
        manager = patch.get("manager", "")
        out += _each(_TR_JOBSET, "spec.runtimePatches.manager", manager, domain_prefixed_path(manager))
        patched = (((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec")) or {}
        for rjob in patched.get("replicatedJobs") or []:
            if rjob.get("name") not in rjobs:
                out.append(
                    f"{_TR_JOBSET}: spec.runtimePatches: Invalid value: must not have replicated job that "
                    "doesn't exist in the runtime job template"
                )
                continue
            pod = ((((rjob.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")) or {}
            for c in pod.get("initContainers") or []:
                if c.get("name") not in rjobs[rjob["name"]]:
                    out.append(
                        f"{_TR_JOBSET}: spec.runtimePatches: Invalid value: must not have initContainer that "
                        f"doesn't exist in the runtime job {rjob['name']}"
                    )
            for c in pod.get("containers") or []:
                if c.get("name") not in rjobs[rjob["name"]]:
                    out.append(
                        f"{_TR_JOBSET}: spec.runtimePatches: Invalid value: must not have container that "
                        f"doesn't exist in the runtime job {rjob['name']}"
                    )
                elif c.get("env") and c["name"] in NO_ENV_PATCH:
                    out.append(
                        f"{_TR_JOBSET}: spec.runtimePatches: Invalid value: must not have envs for the "
                        f"{', '.join(NO_ENV_PATCH)} containers"
                    )
            out += pod_template_meta(
                ((rjob.get("template") or {}).get("spec") or {}).get("template") or {},
                f"spec.runtimePatches[{patch.get('manager')}].{rjob['name']}.template",
            )
    # Torch plugin, Validate: no torchrun variable in the trainer's env.
    if "torch" in (runtime.get("mlPolicy") or {}):
        reserved = sorted(
            {e.get("name") for e in (spec.get("trainer") or {}).get("env") or []} & set(TORCHRUN_RESERVED)
        )
        if reserved:
            out.append(
                f"{_TR_TORCH}: spec.trainer.env: Invalid value: must not have reserved envs, invalid envs "
                f"configured: {reserved}"
            )
    return out


def trainingruntime_webhook(runtime: dict[str, Any]) -> list[str]:
    """TrainingRuntimeValidator.ValidateCreate (TR pkg/webhooks/trainingruntime_webhook.go validateReplicatedJobs;
    Trainer's ClusterTrainingRuntime webhook applies the same): a replicated job labelled as a TrainJob ancestor
    (trainer, model-initializer, dataset-initializer) has replicas 1 (JobSet's default when unset) and the
    container its ancestor needs (trainer: `node`)."""
    expected = {
        "trainer": "node",
        "model-initializer": "model-initializer",
        "dataset-initializer": "dataset-initializer",
    }
    out = []
    rjobs = ((((runtime.get("spec") or {}).get("template") or {}).get("spec") or {}).get("replicatedJobs")) or []
    for i, rjob in enumerate(rjobs):
        template = rjob.get("template") or {}
        ancestor = ((template.get("metadata") or {}).get("labels") or {}).get(
            "trainer.kubeflow.org/trainjob-ancestor-step"
        )
        if ancestor not in expected:
            continue
        where = f"spec.template.spec.replicatedJobs[{i}]"
        if int(rjob.get("replicas", 1)) != 1:
            out.append(
                f"{_TR_RUNTIME_WEBHOOK}: {where}.replicas: Invalid value: {rjob.get('replicas')}: always must be 1"
            )
        pod = (((template.get("spec") or {}).get("template") or {}).get("spec")) or {}
        if not any(c.get("name") == expected[ancestor] for c in pod.get("containers") or []):
            out.append(
                f"{_TR_RUNTIME_WEBHOOK}: {where}.template.spec.template.spec.containers: Invalid value: must "
                f"contain the required container for the ancestor: {ancestor}"
            )
    return out


def trainjob_jobset(job: dict[str, Any], runtime: dict[str, Any]) -> dict[str, Any]:
    """The parts of the JobSet Trainer builds for a TrainJob that JobSet's webhook reads: its name is the TrainJob's
    (TR pkg/runtime/framework/plugins/jobset/builder.go), each replicated job has 1 replica (builder.go: "Support
    multiple replicas" is a TODO there) and the trainer's job runs numNodes pods as parallelism = completions
    (pkg/runtime/framework/plugins/jobset/jobset.go, from the PodSet's count)."""
    nodes = int(
        ((job.get("spec") or {}).get("trainer") or {}).get("numNodes")
        or (runtime["spec"].get("mlPolicy") or {}).get("numNodes")
        or 1
    )
    rjobs = []
    for rjob in ((runtime["spec"].get("template") or {}).get("spec") or {}).get("replicatedJobs") or []:
        count = nodes if rjob["name"] == "node" else 1
        job_spec = dict((rjob.get("template") or {}).get("spec") or {}, parallelism=count, completions=count)
        rjobs.append({"name": rjob["name"], "replicas": 1, "template": {"spec": job_spec}})
    return {"metadata": {"name": job["metadata"]["name"]}, "spec": {"replicatedJobs": rjobs}}


# ---- JS: JobSet v0.12.0 ---------------------------------------------------------------------------------------

_JS = "JS pkg/webhooks/jobset_webhook.go"


def jobset_webhook(jobset: dict[str, Any]) -> list[str]:
    """The JobSet webhook's create checks that depend on names and sizes (Default: completionMode Indexed when
    unset; ValidateCreate: every generated Job name `<jobset>-<rjob>-<last index>` and, for Indexed Jobs, every pod
    name `<jobset>-<rjob>-<job index>-<pod index>-abcde` (the 5 random characters) a DNS-1035 label;
    pkg/util/placement/placement.go GenJobName, GenPodName)."""
    name = jobset["metadata"]["name"]
    out: list[str] = []
    for i, rjob in enumerate(jobset["spec"]["replicatedJobs"]):
        where = f"spec.replicatedJobs[{i}].name"
        spec = rjob["template"]["spec"]
        longest_job = f"{name}-{rjob['name']}-{int(rjob.get('replicas', 1)) - 1}"
        for problem in dns1035_label(longest_job):
            problem = (
                "JobSet name is too long, job names generated for this JobSet will exceed 63 characters"
                if "63" in problem
                else problem
            )
            out.append(f"{_JS}: {where}: Invalid value: {longest_job!r}: {problem}")
        if spec.get("completionMode", "Indexed") == "Indexed" and spec.get("completions") is not None:
            pod = f"{longest_job}-{int(spec['completions']) - 1}-abcde"
            for problem in dns1035_label(pod):
                problem = (
                    "JobSet name is too long, pod names generated for this JobSet will exceed 63 characters"
                    if "63" in problem
                    else problem
                )
                out.append(f"{_JS}: {where}: Invalid value: {longest_job!r}: {problem}")
    return out
