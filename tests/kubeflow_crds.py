"""TEST ORACLE: the vendored Kubeflow CRDs as a real API server applies them on create, CEL rules included.

The CRDs are Kubeflow's released files, unmodified (src/hpctrain/schedulers/kubernetes/crds/README.md names release,
commit and licence). The local test server (Kubernetes 1.20) evaluates no CEL, and hpctrain's own check
(hpctrain.schedulers.kubernetes.manifests.validate) covers the structural schema only, so this module adds what an API
server
of 1.25 or later does with a custom resource's `openAPIV3Schema`:
  * the structural schema with unknown fields refused (translated by hpctrain's to_json_schema: the schema is the
    CRD's own text, the translation only reads OpenAPI's keywords as JSON Schema's)
  * every `x-kubernetes-validations` rule, compiled and evaluated with cel-python (celpy), `self` bound to the value
    at the rule's place. Transition rules (those naming `oldSelf`) apply to updates only and are skipped on create,
    as the API server skips them.
  * `x-kubernetes-list-type: map|set` uniqueness (tests/kubernetes_openapi.duplicates)
"""

from __future__ import annotations

import functools
from typing import Any

import yaml

from hpctrain.schedulers.kubernetes.manifests.validate import to_json_schema
from kubernetes_openapi import duplicates

CRD_FILES = {
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): "trainer.kubeflow.org_clustertrainingruntimes.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): "trainer.kubeflow.org_trainingruntimes.yaml",
}


def read_vendored(filename: str) -> Any:
    """A file of the package's vendored crds/ folder, parsed."""
    from importlib import resources

    text = resources.files("hpctrain.schedulers.kubernetes").joinpath("crds").joinpath(filename).read_text()
    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # a SafeLoader


@functools.lru_cache(maxsize=None)
def openapi_schema(api_version: str, kind: str) -> dict[str, Any]:
    crd = read_vendored(CRD_FILES[(api_version, kind)])
    version = api_version.rsplit("/", 1)[1]
    return next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]


@functools.lru_cache(maxsize=None)
def _structural(api_version: str, kind: str) -> Any:
    import jsonschema

    schema = to_json_schema(openapi_schema(api_version, kind))  # checked against the metaschema by hpctrain's own tests
    return jsonschema.Draft7Validator(schema)


@functools.lru_cache(maxsize=None)
def _program(rule: str) -> Any:
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(rule))


def cel_violations(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """The `x-kubernetes-validations` rules (and list-map uniqueness) that `value` breaks, walking it with `schema`."""
    import celpy

    out: list[str] = []
    for rule in schema.get("x-kubernetes-validations") or []:
        if "oldSelf" in rule["rule"]:
            continue  # a transition rule: evaluated on update only
        try:
            ok = _program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})
        except Exception as err:  # an evaluation error refuses the object too
            ok = f"{err}"
        if ok is not True and not (isinstance(ok, celpy.celtypes.BoolType) and bool(ok)):
            message = rule.get("message") or rule.get("messageExpression") or f"failed rule: {rule['rule']}"
            out.append(f"{path or '(top)'}: Invalid value: {message} (CEL rule {rule['rule']!r})")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                out += cel_violations(sub, item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        out += duplicates(schema, value, path)
        for i, item in enumerate(value):
            out += cel_violations(schema.get("items") or {}, item, f"{path}.{i}")
    return out


def validate(obj: dict[str, Any]) -> list[str]:
    """One line per way a real API server would refuse creating `obj` under its vendored CRD; empty when none."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in CRD_FILES:
        return [f"no vendored CRD for {key}"]
    errors = sorted(_structural(*key).iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    structural = [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors]
    return structural + cel_violations(openapi_schema(*key), obj)
