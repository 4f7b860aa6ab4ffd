"""TEST ORACLE: Kubernetes' own published core/v1 OpenAPI (tests/data/kubernetes-openapi: releases 1.29 and 1.35, the
oldest and newest the conformance tests cover), checked with jsonschema, for the pods, pod templates, Secrets and
Services hpctrain or a Kubeflow controller would create.

The Swagger 2.0 definitions become JSON Schema (Draft 4, whose `$ref: #/definitions/...` they already use) with
these readings of Kubernetes' conventions:
  * an object that lists properties allows no other field: what the API server answers with `fieldValidation=Strict`
    (kubectl --validate=strict) instead of dropping the field
  * IntOrString (`format: int-or-string`) is an integer or a string; a Quantity is a string or a number (both
    decode)
  * `x-kubernetes-list-type: map` lists are unique by their `x-kubernetes-list-map-keys` (two containers or two
    volumes of one name are refused), `set` lists by value
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

OPENAPI_DIR = Path(__file__).parent / "data" / "kubernetes-openapi"
VERSIONS = ("1.29", "1.35")
"""The Kubernetes releases whose core/v1 OpenAPI is vendored: the oldest and newest covered."""
KINDS = {
    "Pod": "io.k8s.api.core.v1.Pod",
    "PodTemplateSpec": "io.k8s.api.core.v1.PodTemplateSpec",
    "Secret": "io.k8s.api.core.v1.Secret",
    "Service": "io.k8s.api.core.v1.Service",
}
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"


def _translate(node: Any) -> Any:
    if isinstance(node, list):
        return [_translate(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _translate(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "description"}
    if "properties" in node and "additionalProperties" not in node:
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=None)
def _definitions(version: str) -> dict[str, Any]:
    return json.loads((OPENAPI_DIR / f"core-v1-{version}.json").read_text())["definitions"]


@functools.lru_cache(maxsize=None)
def _validator(version: str, kind: str) -> Any:
    import jsonschema

    definitions = {name: _translate(d) for name, d in _definitions(version).items()}
    definitions[_INT_OR_STRING] = {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    definitions[_QUANTITY] = {"anyOf": [{"type": "string"}, {"type": "number"}]}
    schema = {"$ref": f"#/definitions/{KINDS[kind]}", "definitions": definitions}
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def list_uniqueness(definitions: dict[str, Any], name: str, obj: Any, path: str) -> list[str]:
    """Duplicates in `x-kubernetes-list-type: map|set` lists under `obj` (a `name` definition)."""
    problems: list[str] = []

    def walk(schema: dict[str, Any], value: Any, where: str) -> None:
        if "$ref" in schema:
            schema = definitions[schema["$ref"].rsplit("/", 1)[1]]
        if isinstance(value, dict):
            props = schema.get("properties") or {}
            for key, item in value.items():
                if key in props:
                    walk(props[key], item, f"{where}.{key}" if where else key)
                elif isinstance(schema.get("additionalProperties"), dict):
                    walk(schema["additionalProperties"], item, f"{where}.{key}" if where else key)
        elif isinstance(value, list):
            problems.extend(duplicates(schema, value, where))
            for i, item in enumerate(value):
                walk(schema.get("items") or {}, item, f"{where}.{i}")

    walk(definitions[name], obj, path)
    return problems


def duplicates(schema: dict[str, Any], items: list[Any], where: str) -> list[str]:
    """The duplicate keys of a list-map (or values of a list-set), as the API server refuses them."""
    kind = schema.get("x-kubernetes-list-type")
    if kind == "map":
        keys = [
            tuple(json.dumps(i.get(k), sort_keys=True) for k in schema.get("x-kubernetes-list-map-keys") or ())
            for i in items
            if isinstance(i, dict)
        ]
    elif kind == "set":
        keys = [json.dumps(i, sort_keys=True) for i in items]
    else:
        return []
    seen, out = set(), []
    for key in keys:
        if key in seen:
            out.append(f"{where}: Duplicate value: {key}")
        seen.add(key)
    return out


def validate(obj: dict[str, Any], kind: str, version: str) -> list[str]:
    """One line per violation of Kubernetes `version`'s core/v1 OpenAPI by `obj` (a `kind` of KINDS)."""
    errors = sorted(_validator(version, kind).iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    out = [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors]
    return out + list_uniqueness(_definitions(version), KINDS[kind], obj, "")
