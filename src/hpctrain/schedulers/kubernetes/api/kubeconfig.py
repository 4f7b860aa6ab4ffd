"""The default namespace, as kubectl finds it: HPCTRAIN_NAMESPACE, else the kubeconfig context's `namespace`, else
`default`; and the kubectl commands hpctrain suggests, with the context that found the cluster.

Read here with PyYAML rather than through the client, so that `submit --dry-run` (which renders the namespace into
the manifest) needs neither the `kubernetes` package nor a reachable cluster. A kubeconfig that cannot be read
gives no namespace here; the client's own load then reports it when a command talks to the cluster.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

NAMESPACE_ENV = "HPCTRAIN_NAMESPACE"
DEFAULT_NAMESPACE = "default"
MAX_KUBECONFIG_BYTES = 1 << 20
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def kubectl(context: str | None, *words: str) -> str:
    """`kubectl [--context CONTEXT] WORDS`, quoted: a suggested command reaches the cluster hpctrain used, whatever
    the current context is when it is pasted."""
    return shlex.join(["kubectl", *(["--context", context] if context else []), *words])


def kubeconfig_paths(environ: Mapping[str, str]) -> list[Path]:
    if environ.get("KUBECONFIG"):
        return [Path(p).expanduser() for p in environ["KUBECONFIG"].split(os.pathsep) if p]
    home = environ.get("HOME")
    return [Path(home, ".kube", "config")] if home else []


def _load(path: Path) -> dict[str, Any]:
    import yaml

    try:
        if not path.is_file() or path.stat().st_size > MAX_KUBECONFIG_BYTES:
            return {}
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def context_namespace(context: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The `namespace` of kubeconfig context `context` (default: the current one), or None. Several $KUBECONFIG
    files merge as kubectl merges them: the first current-context and the first definition of a context win."""
    environ = os.environ if environ is None else environ
    if context is None and environ.get("KUBERNETES_SERVICE_HOST"):  # in a pod: the service account's namespace
        try:
            return IN_CLUSTER_NAMESPACE.read_text(encoding="utf-8").strip() or None
        except OSError:
            return None
    configs = [_load(p) for p in kubeconfig_paths(environ)]
    name = context or next(
        (c["current-context"] for c in configs if isinstance(c.get("current-context"), str) and c["current-context"]),
        None,
    )
    if name is None:
        return None
    for config in configs:
        for entry in config.get("contexts") or []:
            if isinstance(entry, dict) and entry.get("name") == name:
                namespace = (
                    (entry.get("context") or {}).get("namespace") if isinstance(entry.get("context"), dict) else None
                )
                return namespace if isinstance(namespace, str) and namespace else None
    return None


def default_namespace(context: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Where a command without --namespace (and without a job file's) looks: HPCTRAIN_NAMESPACE, the context's
    namespace, else `default`."""
    environ = os.environ if environ is None else environ
    return environ.get(NAMESPACE_ENV) or context_namespace(context, environ) or DEFAULT_NAMESPACE
