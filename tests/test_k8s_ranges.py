"""Values rendered into Kubernetes objects are checked for the field they go into (issue 39, item 8): every whole
number against its field's format in the published schemas (the vendored CRDs, whose pod templates carry core/v1's
PodSpec) and the API server's narrower ranges, and --exclude-nodes names as Kubernetes defines a Node's name, each
refused in one line naming the flag before anything is created. The real local API server (scripts/local-k8s.sh)
is the oracle: what it refuses, hpctrain refuses first."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpctrain.errors import UserError
from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
from hpctrain.schedulers.kubernetes.manifests.render import rendered
from hpctrain.schedulers.kubernetes.services.service_pods import ServicePod, render_pod
from test_k8s_render import CASES, _job_for, golden_options
from hpctrain.schedulers.kubernetes.manifests import ranges

IMAGE = "example.invalid/pytorch:latest"
INT32_MAX = 2**31 - 1
REFRESH = (
    f'{sys.executable} -c "import json; from hpctrain.schedulers.kubernetes.manifests.ranges import schemas_from_crds; '
    'print(json.dumps(schemas_from_crds(), indent=1, sort_keys=True))" > '
    "src/hpctrain/schedulers/kubernetes/crds/integer-fields.json"
)


def test_integer_fields_json_is_cut_from_the_vendored_crds() -> None:
    shipped = json.loads((Path(ranges.__file__).parent.parent / "crds" / ranges.INTEGER_FIELDS).read_text())
    assert shipped == ranges.schemas_from_crds(), f"integer-fields.json is out of step with the CRDs: {REFRESH}"


def test_the_pod_specs_formats_are_kubernetes_own() -> None:
    """The PyTorchJob CRD's PodSpec against Kubernetes' published core/v1 OpenAPI (tests/data/kubernetes-openapi):
    the fields a pod of hpctrain's carries have the same formats."""
    from kubernetes_openapi import VERSIONS, _definitions

    pod = ranges._integer_schemas()["Pod"]["properties"]["spec"]["properties"]
    container = pod["containers"]["items"]["properties"]
    for version in VERSIONS:
        spec = _definitions(version)["io.k8s.api.core.v1.PodSpec"]["properties"]
        port = _definitions(version)["io.k8s.api.core.v1.ContainerPort"]["properties"]
        for name in ("activeDeadlineSeconds", "terminationGracePeriodSeconds"):
            assert pod[name] == {"format": spec[name]["format"]}, (version, name)
        assert container["ports"]["items"]["properties"]["containerPort"] == {"format": port["containerPort"]["format"]}


def _ints(value: Any, where: str = "") -> list[str]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [where]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _ints(v, f"{where}.{k}" if where else k)]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _ints(v, f"{where}[{i}]")]
    return []


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_every_whole_number_rendered_is_checked_against_its_field(case: tuple[str, ...]) -> None:
    """No integer escapes the check: each one in a rendered manifest has a format in its kind's schema."""
    api, res, size, storage = case
    job = _job_for(api, res, size)
    out = rendered(job, golden_options(api, storage))
    objects = [out.payload] + ([] if api == "pytorchjob" else [d for d in yaml.safe_load_all(out.text)][:-1])
    pod = render_pod(ServicePod("nb", "dev", ("jupyter",), 8888, time="4:00:00"), golden_options(api, storage))
    for obj in [*objects, pod]:
        checked = {where for where, _, _ in ranges._integers(obj, ranges._integer_schemas()[obj["kind"]], "")}
        assert checked == set(_ints(obj)) and checked, obj["kind"]


def job(**changes: Any) -> JobSpec:
    base = JobSpec(command=("python", "train.py"), name="big", resources=Resources(nodes=2, cpus_per_task=1))
    return base.replace(**changes)


@pytest.mark.parametrize(
    ("api", "changes", "words"),
    [
        ("pytorchjob", {"max_restarts": 2**30}, ("--max-restarts:", "spec.runPolicy.backoffLimit would be 2147483649")),
        ("trainjob", {"max_restarts": 2**31}, ("--max-restarts:", "failurePolicy.maxRestarts would be 2147483648")),
        ("pytorchjob", {"time_limit_s": 99999999 * 86400, "max_restarts": 10**8}, ("--time:", "activeDeadlineSeconds")),
        ("pytorchjob", {"exclude_nodes": ("GPU-Node-3",)}, ("--exclude-nodes 'GPU-Node-3'", "lower-case")),
        ("trainjob", {"exclude_nodes": ("node_7",)}, ("--exclude-nodes 'node_7'",)),
    ],
)
def test_a_value_its_field_cannot_hold_is_refused_when_rendered(
    api: str, changes: dict[str, Any], words: tuple[str, ...]
) -> None:
    with pytest.raises(UserError) as refused:
        rendered(job(**changes), KubernetesOptions(namespace="ns", api=api, image=IMAGE))
    line = str(refused.value)
    assert "\n" not in line and all(w in line for w in words), line


def test_a_dev_pods_time_past_int32_seconds_is_refused() -> None:
    options = KubernetesOptions(namespace="ns", image=IMAGE)
    limit = "24855-03:14:07"  # 2**31 - 1 seconds: the most a pod's activeDeadlineSeconds may be
    assert (
        render_pod(ServicePod("nb", "dev", ("jupyter",), 8888, time=limit), options)["spec"]["activeDeadlineSeconds"]
        == INT32_MAX
    )
    with pytest.raises(UserError, match=r"^--time: the Pod's spec.activeDeadlineSeconds would be 2147483648, "):
        render_pod(ServicePod("nb", "dev", ("jupyter",), 8888, time="24855-03:14:08"), options)


# ---- the real API server: what it refuses, hpctrain refuses before creating anything ------------------------------


@pytest.mark.k8s
def test_the_real_api_server_refuses_what_hpctrain_refuses_first(k8s_cluster: Any, tmp_path: Path) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from kubeflow_standin import create_namespace, delete_namespace
    from training_helpers import run_hpctrain

    api = k8s_cluster.api_client()
    namespace = create_namespace(api)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    options = KubernetesOptions(namespace=namespace, image=IMAGE)
    try:
        # The oracle: the manifests as they were rendered before, sent as they are.
        pod = render_pod(ServicePod("nb", "dev", ("sleep", "1"), 8888, time="24855-03:14:07"), options)
        pod["spec"]["activeDeadlineSeconds"] = INT32_MAX + 1
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod(namespace, pod)
        assert refused.value.status == 422 and "activeDeadlineSeconds" in refused.value.body
        pod["spec"]["activeDeadlineSeconds"] = INT32_MAX  # the bound itself is taken
        pod["spec"]["affinity"] = rendered(job(exclude_nodes=("gpu-node-3",)), options).payload["spec"][
            "pytorchReplicaSpecs"
        ]["Master"]["template"]["spec"]["affinity"]
        core.create_namespaced_pod(namespace, pod)
        pod["metadata"]["name"] = "nb-upper"
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] = ["GPU-Node-3"]
        with pytest.raises(ApiException) as refused:
            core.create_namespaced_pod(namespace, pod)
        assert refused.value.status == 422 and "GPU-Node-3" in refused.value.body

        # hpctrain: one line naming the flag, exit 2, and nothing in the namespace.
        where = ("--scheduler", "kubernetes", "--context", k8s_cluster.context, "--namespace", namespace)
        (tmp_path / "train.py").write_text("pass\n")
        submits = {
            "--exclude-nodes": ("--exclude-nodes", "GPU-Node-3"),
            "--max-restarts": ("--nodes", "4", "--max-restarts", str(2**30)),
        }
        for flag, extra in submits.items():
            for command in (("submit",), ("submit", "--no-check"), ("check",)):
                proc = run_hpctrain(
                    *command,
                    *where,
                    "--image",
                    IMAGE,
                    "--job-name",
                    "big",
                    *extra,
                    "--",
                    "python",
                    "train.py",
                    cwd=tmp_path,
                )
                lines = proc.stderr.strip().splitlines()
                assert proc.returncode == 2 and len(lines) == 1 and flag in lines[0], proc
        dev = run_hpctrain(
            "dev",
            "start",
            "nb2",
            *where,
            "--image",
            IMAGE,
            "--time",
            "24855-03:14:08",
            cwd=tmp_path,
            env={**__import__("os").environ, "HPCTRAIN_HOME": str(tmp_path / "home")},
        )
        lines = dev.stderr.strip().splitlines()
        assert dev.returncode == 2 and len(lines) == 1 and "--time" in lines[0], dev
        assert [p.metadata.name for p in core.list_namespaced_pod(namespace).items] == ["nb"]
        assert [s.metadata.name for s in core.list_namespaced_secret(namespace).items if s.type == "Opaque"] == []
        assert custom.list_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs")["items"] == []
    finally:
        delete_namespace(api, namespace)
