"""scripts/local-k8s.sh: the local API server answers through the default kubeconfig, serves the vendored Kubeflow
CRDs, and stores and deletes Kubeflow objects; its kubeconfig merge keeps other contexts; the CRD stripping for the
old server leaves the schemas otherwise alone.

The server is real (etcd + kube-apiserver 1.20); there is no kubelet and no Kubeflow controller, so the objects
created here are only stored, never run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from k8s_fixtures import CRD_NAMES, ROOT, LocalK8s

CRD_DIR = ROOT / "src" / "hpctrain" / "schedulers" / "kubernetes" / "crds"
HELPERS = ROOT / "scripts" / "k8s"


def vendored(name: str) -> dict:
    return yaml.safe_load((CRD_DIR / name).read_text())


@pytest.mark.k8s
def test_server_answers_through_default_kubeconfig(k8s_cluster: LocalK8s) -> None:
    from kubernetes import client

    api = k8s_cluster.api_client()
    version = client.VersionApi(api).get_code()
    assert (version.major, version.minor) == ("1", "20")
    namespaces = {ns.metadata.name for ns in client.CoreV1Api(api).list_namespace().items}
    assert {"default", "kube-system"} <= namespaces


@pytest.mark.k8s
def test_kubeflow_crds_established(k8s_cluster: LocalK8s) -> None:
    from kubernetes import client

    crds = {
        crd.metadata.name: crd
        for crd in client.ApiextensionsV1Api(k8s_cluster.api_client()).list_custom_resource_definition().items
    }
    for name in CRD_NAMES:
        assert name in crds, f"CRD {name} is not installed"
        conditions = {c.type: c.status for c in crds[name].status.conditions or []}
        assert conditions.get("Established") == "True", f"{name}: {conditions}"
        assert crds[name].metadata.deletion_timestamp is None, f"{name} is being deleted"
    served = crds["pytorchjobs.kubeflow.org"].spec
    shipped = vendored("kubeflow.org_pytorchjobs.yaml")["spec"]
    assert (served.group, served.names.kind, [v.name for v in served.versions]) == (
        shipped["group"],
        shipped["names"]["kind"],
        [v["name"] for v in shipped["versions"]],
    )


@pytest.mark.k8s
def test_torch_distributed_runtime_installed(k8s_cluster: LocalK8s) -> None:
    from kubernetes import client

    runtime = client.CustomObjectsApi(k8s_cluster.api_client()).get_cluster_custom_object(
        "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", "torch-distributed"
    )
    assert runtime["spec"]["mlPolicy"]["torch"] == {}
    assert runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["name"] == "node"


@pytest.mark.k8s
def test_pytorchjob_create_read_delete(k8s_cluster: LocalK8s) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = client.CustomObjectsApi(k8s_cluster.api_client())
    name = f"hpctrain-test-{uuid.uuid4().hex[:8]}"
    container = {"name": "pytorch", "image": "example.invalid/pytorch:latest", "command": ["python", "-c", "pass"]}
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {
                    "replicas": 1,
                    "restartPolicy": "OnFailure",
                    "template": {"spec": {"containers": [container]}},
                },
                "Worker": {
                    "replicas": 2,
                    "restartPolicy": "OnFailure",
                    "template": {"spec": {"containers": [container]}},
                },
            },
            "notAField": True,
        },
    }
    group, version, plural = "kubeflow.org", "v1", "pytorchjobs"
    api.create_namespaced_custom_object(group, version, "default", plural, job)
    try:
        stored = api.get_namespaced_custom_object(group, version, "default", plural, name)
        assert stored["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
        assert stored["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0] == container
        # The CRD's structural schema is in force: a field it does not know is pruned.
        assert "notAField" not in stored["spec"]
        names = [
            item["metadata"]["name"]
            for item in api.list_namespaced_custom_object(group, version, "default", plural)["items"]
        ]
        assert name in names
    finally:
        api.delete_namespaced_custom_object(group, version, "default", plural, name)
    with pytest.raises(ApiException) as gone:
        api.get_namespaced_custom_object(group, version, "default", plural, name)
    assert gone.value.status == 404


def kubeapi(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HELPERS / "kubeapi.py"), *args], capture_output=True, text=True, check=False
    )


def test_kubeconfig_merge_keeps_other_contexts_and_remove_drops_only_ours(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nplaceholder\n-----END CERTIFICATE-----\n")
    token = tmp_path / "token"
    token.write_text("secret\n")
    standalone = tmp_path / "standalone"
    made = kubeapi(
        "write-kubeconfig",
        str(standalone),
        "--context",
        "hpctrain-local",
        "--server",
        "https://127.0.0.1:6443",
        "--ca",
        str(ca),
        "--token-file",
        str(token),
    )
    assert made.returncode == 0, made.stderr
    other = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "prod", "cluster": {"server": "https://prod.example:6443"}}],
        "users": [{"name": "alice", "user": {"token": "t"}}],
        "contexts": [{"name": "prod", "context": {"cluster": "prod", "user": "alice", "namespace": "ml"}}],
        "current-context": "prod",
    }
    target = tmp_path / "kube" / "config"
    target.parent.mkdir()
    target.write_text(yaml.safe_dump(other))

    assert kubeapi("merge-kubeconfig", str(standalone), str(target)).returncode == 0
    assert kubeapi("merge-kubeconfig", str(standalone), str(target)).returncode == 0  # twice: no duplicates
    config = yaml.safe_load(target.read_text())
    assert config["current-context"] == "hpctrain-local"
    assert [c["name"] for c in config["contexts"]] == ["prod", "hpctrain-local"]
    assert [c["name"] for c in config["clusters"]] == ["prod", "hpctrain-local"]
    assert config["contexts"][0] == other["contexts"][0]
    assert config["users"][1] == {"name": "hpctrain-local", "user": {"token": "secret"}}
    assert target.stat().st_mode & 0o777 == 0o600

    assert kubeapi("remove-context", "hpctrain-local", str(target)).returncode == 0
    config = yaml.safe_load(target.read_text())
    assert config["current-context"] == ""
    for section in ("clusters", "users", "contexts"):
        assert config[section] == other[section]


def test_merge_refuses_a_kubeconfig_that_is_not_a_mapping(tmp_path: Path) -> None:
    target = tmp_path / "config"
    target.write_text("- just\n- a list\n")
    standalone = tmp_path / "standalone"
    standalone.write_text(json.dumps({"contexts": [], "current-context": "hpctrain-local"}))
    result = kubeapi("merge-kubeconfig", str(standalone), str(target))
    assert result.returncode == 1
    assert "not a kubeconfig" in result.stderr and "Traceback" not in result.stderr
    assert target.read_text() == "- just\n- a list\n"


def walk(node: object):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def test_strip_crds_removes_only_what_the_old_server_rejects(tmp_path: Path) -> None:
    name = "trainer.kubeflow.org_trainjobs.yaml"
    result = subprocess.run(
        [sys.executable, str(HELPERS / "strip_crds.py"), str(tmp_path), str(CRD_DIR / name)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    original = vendored(name)
    stripped = json.loads((tmp_path / "trainer.kubeflow.org_trainjobs.json").read_text())
    nodes = list(walk(stripped["spec"]["versions"][0]["schema"]))
    assert any("x-kubernetes-validations" in node for node in walk(original))
    assert not any("x-kubernetes-validations" in node for node in nodes)
    assert not any(node.get("default") == "" for node in nodes)
    for node in nodes:
        if node.get("x-kubernetes-list-type") == "map":
            assert set(node["x-kubernetes-list-map-keys"]) <= set(node["items"].get("required", []))
    # Everything else is as shipped.
    assert {k: v for k, v in stripped.items() if k != "spec"} == {k: v for k, v in original.items() if k != "spec"}
    assert stripped["spec"]["names"] == original["spec"]["names"]
