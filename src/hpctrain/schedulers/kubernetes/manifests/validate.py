"""Validate a rendered manifest against the vendored Kubeflow CRD schemas (crds/, see its README.md) with jsonschema.

The API server prunes fields it does not know without a word, so a typo in a manifest would silently vanish;
here an unknown field is an error. A CRD's openAPIV3Schema is OpenAPI, not JSON Schema, so it is translated:
  * x-kubernetes-int-or-string: an integer or a string
  * nullable: null is allowed too
  * an object that lists properties and neither preserves unknown fields nor declares additionalProperties
    gets additionalProperties: false (what `kubectl --validate=strict` reports as "unknown field")
CEL rules (x-kubernetes-validations) are not evaluated, as the local test server does not evaluate them either.
"""

from __future__ import annotations

import functools
import sys
from importlib import resources
from typing import Any

CRD_FILES = {
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml",
}


def to_json_schema(node: Any) -> Any:
    """A CRD's structural schema -> a JSON Schema that rejects unknown fields."""
    if isinstance(node, list):
        return [to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: to_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    preserve = node.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in node and not preserve and "additionalProperties" not in node:
        out["additionalProperties"] = False
    return out


# jsonschema's optional format checkers: imported with jsonschema when installed, used only by a FormatChecker.
# rfc3987_syntax (jsonschema's format-nongpl extra, which Jupyter's packages require) compiles some 35 Earley parsers
# when imported: 1.2 CPU s of every `check` (python-jsonschema/jsonschema#1392 and #1428); the others (arrow,
# isoduration, webcolors, ...) another 0.1 s.
FORMAT_BACKENDS = (
    "rfc3987_syntax",
    "rfc3987",
    "rfc3986_validator",
    "rfc3339_validator",
    "fqdn",
    "idna",
    "webcolors",
    "jsonpointer",
    "uri_template",
    "isoduration",
)


def _import_jsonschema() -> Any:
    """jsonschema, imported without its format checkers' backends: hpctrain checks no formats. The block is lifted
    once jsonschema is in (a later `import idna` works)."""
    if "jsonschema" in sys.modules:
        return sys.modules["jsonschema"]
    blocked = [name for name in FORMAT_BACKENDS if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # `import` raises ImportError
    try:
        import jsonschema
    finally:
        for name in blocked:
            del sys.modules[name]
    return jsonschema


def crd_schema(filename: str) -> dict[str, Any]:
    """The vendored CRD's schema (its first version's openAPIV3Schema), as JSON Schema (to_json_schema)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    text = resources.files("hpctrain.schedulers.kubernetes").joinpath("crds").joinpath(filename).read_text()
    crd = yaml.load(text, Loader=loader)  # a SafeLoader
    return to_json_schema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


@functools.lru_cache(maxsize=None)
def _validator(filename: str) -> Any:
    """Built once a process. The translated schema is not checked against the metaschema here (0.1 CPU s of every
    `check`): tests/test_k8s_render.py checks both vendored CRDs' translations."""
    return _import_jsonschema().Draft7Validator(crd_schema(filename))


def validate_manifest(manifest: dict[str, Any]) -> list[str]:
    """One line per schema violation (`spec.runPolicy.backofLimit: unknown field ...`); empty when valid."""
    key = (manifest.get("apiVersion"), manifest.get("kind"))
    if key not in CRD_FILES:
        known = ", ".join(f"{kind} ({api})" for api, kind in CRD_FILES)
        return [f"apiVersion/kind {key[0]}/{key[1]} has no vendored CRD: hpctrain validates {known}"]
    errors = sorted(_validator(CRD_FILES[key]).iter_errors(manifest), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors]


def unknown_fields(manifest: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """The paths (`spec.runtimePatches`) of the manifest's fields that a CRD's structural schema does not declare:
    what the API server prunes without a word (or, asked for fieldValidation=Strict, refuses)."""
    if not isinstance(schema, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    out: list[str] = []
    if isinstance(manifest, dict):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in manifest.items():
            where = f"{path}.{key}" if path else key
            if properties is not None and key in properties:
                out += unknown_fields(value, properties[key], where)
            elif isinstance(extra, dict):
                out += unknown_fields(value, extra, where)
            elif properties is not None and extra is not True:
                out.append(where)
    elif isinstance(manifest, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(manifest):
            out += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return out
