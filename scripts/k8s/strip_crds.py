"""Make Kubeflow Trainer v2 CRDs loadable by the old (1.20) kube-apiserver of scripts/local-k8s.sh.

    python3 strip_crds.py OUT_DIR CRD.yaml...

Writes OUT_DIR/<name of CRD.yaml>.json for each input, with what 1.20 rejects taken out of every schema:
  - `x-kubernetes-validations` (CEL rules; 1.20 has no CEL),
  - `default: ""` (1.20 checks defaults against the schema and finds many of these invalid),
  - list-map keys that are not `required` in the item schema (1.20 demands that they are).
The vendored originals stay untouched: hpctrain validates manifests against those. Objects that are not
CustomResourceDefinitions are copied as they are. Needs PyYAML (Debian: python3-yaml).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml


def strip_schema(node: object) -> object:
    """Return a copy of the schema `node` without what kube-apiserver 1.20 rejects."""
    if isinstance(node, list):
        return [strip_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        key: strip_schema(value)
        for key, value in node.items()
        if key != "x-kubernetes-validations" and not (key == "default" and value == "")
    }
    keys = out.get("x-kubernetes-list-map-keys")
    items = out.get("items")
    if out.get("x-kubernetes-list-type") == "map" and keys and isinstance(items, dict):
        required = list(items.get("required", []))
        items["required"] = required + [key for key in keys if key not in required]
    return out


def strip_document(doc: dict) -> dict:
    if doc.get("kind") != "CustomResourceDefinition":
        return doc
    doc = dict(doc)
    spec = dict(doc["spec"])
    spec["versions"] = [
        {**version, "schema": strip_schema(version["schema"])} if "schema" in version else version
        for version in spec["versions"]
    ]
    doc["spec"] = spec
    return doc


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: strip_crds.py OUT_DIR CRD.yaml...", file=sys.stderr)
        return 2
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in argv[1:]:
        source = Path(name)
        docs = [doc for doc in yaml.safe_load_all(source.read_text()) if doc]
        if len(docs) != 1:
            print(f"strip_crds.py: {source} holds {len(docs)} objects; expected one", file=sys.stderr)
            return 1
        target = out_dir / (source.stem + ".json")
        tmp = target.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(strip_document(docs[0])))
        tmp.replace(target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
