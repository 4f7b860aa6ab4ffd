"""Trim Kubernetes' published OpenAPI (Swagger 2.0, as kubernetes-client/python ships it in
kubernetes/swagger.json.unprocessed) to the definitions a Pod, a PodTemplateSpec and a Secret reach, unchanged.

    git show TAG:kubernetes/swagger.json.unprocessed | python trim.py > core-v1-VERSION.json

The whole file is 3-4 MB per release; the part the conformance tests read (tests/kubernetes_openapi.py) is the
closure of these roots under $ref, copied definition by definition without edits.
"""

from __future__ import annotations

import json
import sys

ROOTS = (
    "io.k8s.api.core.v1.Pod",
    "io.k8s.api.core.v1.PodTemplateSpec",
    "io.k8s.api.core.v1.Secret",
    "io.k8s.api.core.v1.Service",
)


def refs(node: object) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"].rsplit("/", 1)[1]} if isinstance(node.get("$ref"), str) else set()
        for value in node.values():
            found |= refs(value)
        return found
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node)) if node else set()
    return set()


def main() -> None:
    spec = json.load(sys.stdin)
    keep: dict[str, object] = {}
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if name not in keep:
            keep[name] = spec["definitions"][name]
            todo.extend(refs(keep[name]))
    json.dump(
        {"swagger": spec["swagger"], "info": spec["info"], "definitions": dict(sorted(keep.items()))},
        sys.stdout,
        indent=1,
        sort_keys=True,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
