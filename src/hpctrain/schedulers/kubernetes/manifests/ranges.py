"""Every whole number hpctrain renders into a Kubernetes object fits the field it goes into, checked when it is
rendered, before anything is created (an object the API server, or a controller decoding it, cannot take was created
and never got a pod).

A field's range is its OpenAPI format (int32 or int64) in the published schema of its kind: the vendored Kubeflow
CRDs (crds/, see its README.md), whose pod templates carry core/v1's PodSpec as Kubernetes publishes it, so a Pod
is checked against the PyTorchJob CRD's PodSpec. `crds/integer-fields.json` holds those schemas cut down to the
paths that lead to an integer (`integer_fields`; tests/test_k8s_ranges.py checks it against the CRDs, so that
rendering does not parse 0.6-0.9 MB of YAML). Where the API server's validation is narrower than the format, the
narrower range is in NARROWER, with its source. The error names the flag the number came from (FLAGS).
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from hpctrain.errors import UserError

FORMATS = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
INTEGER_FIELDS = "integer-fields.json"
KINDS = {  # kind -> (vendored CRD, the path in its schema of the part that is checked)
    "PyTorchJob": ("kubeflow.org_pytorchjobs.yaml", ()),
    "TrainJob": ("trainer.kubeflow.org_trainjobs.yaml", ()),
    "TrainingRuntime": ("trainer.kubeflow.org_trainingruntimes.yaml", ()),
    "Pod": (  # a Pod's spec is core/v1's PodSpec: the PyTorchJob CRD carries it in each replica's template
        "kubeflow.org_pytorchjobs.yaml",
        ("properties", "spec", "properties", "pytorchReplicaSpecs", "additionalProperties", "properties", "template"),
    ),
}
NARROWER = {
    # kubernetes pkg/apis/core/validation/validation.go, ValidatePodSpec (1.20 to 1.35): "must be between 1 and
    # 2147483647, inclusive", although the field is an int64.
    ("Pod", "spec.activeDeadlineSeconds"): (1, 2**31 - 1),
}
FLAGS = {  # the field's name -> the flag whose value it carries
    "activeDeadlineSeconds": "--time",
    "backoffLimit": "--max-restarts",
    "maxRestarts": "--max-restarts",
    "terminationGracePeriodSeconds": "--signal-grace",
    "replicas": "--nodes",
    "numNodes": "--nodes",
    "numProcPerNode": "--nproc-per-node",
    "containerPort": "--port",
}


def check_integers(obj: dict[str, Any]) -> None:
    """Raise a UserError naming the flag when a whole number in `obj` (a manifest whose `kind` is in KINDS) lies
    outside its field's range."""
    kind = obj.get("kind")
    if kind not in KINDS:
        return
    schema = _integer_schemas()[kind]
    for where, value, fmt in _integers(obj, schema, ""):
        lo, hi = NARROWER.get((kind, where), FORMATS[fmt])
        if lo <= value <= hi:
            continue
        field = where.rsplit(".", 1)[-1].split("[", 1)[0]
        flag = FLAGS.get(field)
        said = f"{flag}: " if flag else ""
        raise UserError(
            f"{said}the {kind}'s {where} would be {value}, outside what Kubernetes stores there ({lo} to {hi}"
            f"{', an ' + fmt if (lo, hi) == FORMATS[fmt] else ''}): "
            + (f"give a smaller {flag}" if flag else "this is a bug in hpctrain, please report it")
        )


def _integers(value: Any, schema: Any, where: str) -> Any:
    """(path, whole number, format) of each int in `value` that `schema` (an integer_fields tree) gives a format."""
    if not isinstance(schema, dict):
        return
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if schema.get("format") in FORMATS:
            yield where, value, schema["format"]
        return
    if isinstance(value, dict):
        properties, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        for key, item in value.items():
            inner = properties.get(key, extra)
            if inner is not None:
                yield from _integers(item, inner, f"{where}.{key}" if where else key)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from _integers(item, schema["items"], f"{where}[{i}]")


def integer_fields(schema: Any) -> Any:
    """An OpenAPI schema cut down to the paths that lead to an integer field with a format (int32, int64): its
    `properties`, `additionalProperties` and `items`, and at each such field {"format": ...}; None when none."""
    if not isinstance(schema, dict):
        return None
    if schema.get("type") == "integer" and schema.get("format") in FORMATS:
        return {"format": schema["format"]}
    out: dict[str, Any] = {}
    properties = {k: integer_fields(v) for k, v in (schema.get("properties") or {}).items()}
    properties = {k: v for k, v in properties.items() if v is not None}
    if properties:
        out["properties"] = properties
    for key in ("additionalProperties", "items"):
        inner = integer_fields(schema.get(key))
        if inner is not None:
            out[key] = inner
    return out or None


def schemas_from_crds() -> dict[str, Any]:
    """What integer-fields.json holds, made from the vendored CRDs (slow: it parses them)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    out = {}
    for kind, (filename, part) in KINDS.items():
        text = resources.files("hpctrain.schedulers.kubernetes").joinpath("crds", filename).read_text()
        schema = yaml.load(text, Loader=loader)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for key in part:
            schema = schema[key]
        out[kind] = integer_fields(schema)
    return out


@functools.lru_cache(maxsize=None)
def _integer_schemas() -> dict[str, Any]:
    text = resources.files("hpctrain.schedulers.kubernetes").joinpath("crds", INTEGER_FIELDS).read_text()
    return json.loads(text)
