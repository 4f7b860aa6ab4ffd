"""Conformance: every object hpctrain can render for Kubernetes, checked against Kubeflow's and Kubernetes' own text
rather than ours (tests/kubeflow_oracle.py): the vendored CRDs with their CEL rules (evaluated with cel-python), the
admission webhooks of training-operator v1.9.4, Trainer v2.3.0 and JobSet v0.12.0 re-expressed with their sources
cited, and core/v1's OpenAPI of Kubernetes 1.29 and 1.35. Offline and pure: no cluster.

The property: for every input, hpctrain either refuses it with a UserError (one line naming the fix) or renders
objects a real cluster accepts. The renderer of issue 31's first wave failed these cases (items 1, 5, 6, 9: a
manager that is no domain-prefixed path, JobSet pod names over 63 characters, a leading digit, node names as label
values); the tests were written against it as strict xfails, and pass since the fixes.

The second half shows that the oracle can refuse: each rule, broken on purpose, is caught.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

import kubeflow_oracle
from hpctrain.errors import UserError
from hpctrain.jobs.mapping import from_mapping
from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
from hpctrain.schedulers.kubernetes.manifests.params import parse_params_text
from hpctrain.schedulers.kubernetes.manifests.render import render
from hpctrain.schedulers.kubernetes.manifests.runtime import own_runtime

IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"
COMMAND = ("hpctrain", "train", "mnist", "--epochs", "1")
VOLUMES = (
    "pvc:team-runs:/mnt/share/team",
    "nfs:nas.example.com:/export/users:/mnt/user:ro",
    "host:/mnt/datasets:/data:ro",
)


def assert_accepted_or_refused(make) -> None:
    """`make()` renders objects; hpctrain may refuse (UserError), else the oracle must accept every object, a
    TrainJob with the runtimes rendered beside it (hpctrain's own TrainingRuntime) as the cluster's."""
    try:
        objects = make()
    except UserError as err:
        assert "\n" not in str(err) and str(err), err
        return
    runtimes = {
        **kubeflow_oracle.default_runtimes(),
        **{o["metadata"]["name"]: o for o in objects if o["kind"] == "TrainingRuntime"},
    }
    for obj in objects:
        assert kubeflow_oracle.refusals(obj, runtimes) == [], obj["kind"]


def rendered_objects(job: JobSpec, options: KubernetesOptions) -> list[dict[str, Any]]:
    """What `submit` creates: the job, after its own TrainingRuntime where it has one (TrainJob --max-restarts)."""
    return [o for o in (own_runtime(job, options), render(job, options)) if o is not None]


# ---- training jobs: both APIs, 1 to 100 nodes, GPUs, storage, placement, budgets ----------------------------


def _job(api: str, nodes: int, gpus: int, variant: int, name: str | None = None) -> JobSpec:
    return JobSpec(
        command=COMMAND,
        name=name or f"conf-{api[:3]}-{nodes}n-{gpus}g-{variant}",
        time_limit_s=(1800, 2 * 3600, 3 * 86400, None)[variant % 4],
        resources=Resources(
            nodes=nodes, nproc_per_node=max(1, gpus), gpus_per_node=gpus, cpus_per_task=4, mem_bytes=32 << 30
        ),
        run_dir="/mnt/share/team/runs/%j" if variant % 2 else None,
        env=(("OMP_NUM_THREADS", "4"),) if variant % 3 == 0 else (),
        exclude_nodes=("gpu-node-7", "gpu-node-12") if variant % 2 == 0 else (),
        max_restarts=(0, 3, 1)[variant % 3],
        signal_grace=(0, 120)[variant % 2],
    )


def _options(api: str, variant: int) -> KubernetesOptions:
    storage = {"shm": "16Gi", "volumes": VOLUMES} if variant % 2 else {}
    placement = (
        {
            "node_selector": ("nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB",),
            "tolerations": ("nvidia.com/gpu:NoSchedule",),
            "service_account": "trainer",
            "image_pull_secrets": ("regcred",),
            "labels": ("team=vision",),
        }
        if variant % 3 == 1
        else {}
    )
    priority = {"priority_class": "batch-low"} if api == "pytorchjob" and variant % 2 == 0 else {}
    return KubernetesOptions(namespace="team-a", api=api, image=IMAGE, **storage, **placement, **priority)


MATRIX = [
    (api, nodes, gpus, variant)
    for api in ("pytorchjob", "trainjob")
    for nodes in (1, 2, 100)
    for gpus in (0, 8)
    for variant in range(4)
]


@pytest.mark.parametrize("api,nodes,gpus,variant", MATRIX, ids=[f"{a}-{n}n-{g}g-v{v}" for a, n, g, v in MATRIX])
def test_training_job_matrix(api: str, nodes: int, gpus: int, variant: int) -> None:
    assert_accepted_or_refused(lambda: rendered_objects(_job(api, nodes, gpus, variant), _options(api, variant)))


NAMES = [
    ("pytorchjob", "a" * 50),
    ("pytorchjob", "7run"),
    ("trainjob", "a" * 47),
    ("trainjob", "b" * 49),
    ("trainjob", "c" * 50),
    ("trainjob", "7run"),
]


@pytest.mark.parametrize("api,name", NAMES, ids=[f"{a}-{n[:8]}-{len(n)}" for a, n in NAMES])
@pytest.mark.parametrize("nodes", [1, 100])
def test_job_names(api: str, name: str, nodes: int) -> None:
    assert_accepted_or_refused(lambda: rendered_objects(_job(api, nodes, 0, 1, name=name), _options(api, 1)))


LONG_NODE = "gpu-node-0017.rack-12.zone-b.cluster.research-computing.example.org"  # a DNS name of 68 characters


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_exclude_long_node_names(api: str) -> None:
    job = _job(api, 2, 0, 0).replace(exclude_nodes=(LONG_NODE, "gpu-node-7"))
    assert_accepted_or_refused(lambda: rendered_objects(job, _options(api, 0)))


PARAMS = {
    "pytorchjob": "name=yourtaskname\nkind=PyTorchJob\nworker_count=4\nworker_cpu=16\nworker_gpu=2\nworker_memory=64\n"
    "worker_shared_memory=8\nworker_image=registry.example.com/team/pytorch:v1\n"
    "command=python3 /mnt/user/NAME/mnist.py --epochs=10\npriority=1\nworkspace_id=team-a\ninteractive=false\n",
    "trainjob": "name=tj-params\nkind=TrainJob\nworker_count=2\nworker_cpu=8\nworker_gpu=1\nworker_memory=0.5\n"
    "worker_image=registry.example.com/team/pytorch:v1\ncommand=python3 train.py\npriority=3\n",
}


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_params_file(api: str) -> None:
    def make() -> list[dict[str, Any]]:
        job_fields, option_fields = parse_params_text(PARAMS[api], source="job.params")
        return [render(from_mapping(job_fields, source="job.params"), KubernetesOptions(**option_fields))]

    assert_accepted_or_refused(make)


# ---- the pods around the jobs: dev sessions (with their Secret) and TensorBoard -----------------------------


@pytest.mark.parametrize("variant", range(3))
def test_dev_and_tensorboard_pods(variant: int) -> None:
    from hpctrain.schedulers.kubernetes.services.service_pods import tensorboard_pod
    from hpctrain.schedulers.kubernetes.services import service_pods as k8s
    from hpctrain.servers.sessions import DevConfig
    from hpctrain.schedulers.kubernetes.services.service_pods import render_dev_pod, service_pod

    options = KubernetesOptions(
        namespace="team-a",
        image=IMAGE,
        **({"shm": "2Gi", "volumes": VOLUMES} if variant else {}),
        **({"node_selector": ("pool=cpu",), "labels": ("team=vision",)} if variant == 2 else {}),
    )
    cfg = DevConfig(
        name=f"nb{variant}",
        resources=Resources(cpus_per_task=4, mem_bytes=16 << 30, gpus_per_node=variant),
        time=("08:00:00", None, "1-00:00:00")[variant],
    )
    tensorboard = tensorboard_pod(
        "run1:/mnt/share/team/runs/a,run2:/mnt/share/team/runs/b", ("01:00:00", None, None)[variant]
    )

    def make() -> list[dict[str, Any]]:
        return [
            render_dev_pod(cfg, options),
            k8s.render_secret(service_pod(cfg), options, {"token": "x" * 48}),
            k8s.render_pod(tensorboard, options),
        ]

    assert_accepted_or_refused(make)


# ---- the oracle refuses: each rule broken on purpose -------------------------------------------------------


def _pytorchjob() -> dict[str, Any]:
    return render(_job("pytorchjob", 3, 2, 1), _options("pytorchjob", 1))


def _trainjob() -> dict[str, Any]:
    manifest = render(
        _job("trainjob", 3, 2, 1).replace(max_restarts=0), _options("trainjob", 1)
    )  # on the cluster's runtime
    for patch in manifest["spec"]["runtimePatches"]:
        patch["manager"] = "hpctrain.io/submit"  # a domain-prefixed path: the base case is accepted
    return manifest


def _template(m: dict[str, Any]) -> dict[str, Any]:
    return m["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]


def _patch_pod(m: dict[str, Any]) -> dict[str, Any]:
    return m["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"][
        "spec"
    ]["template"]["spec"]


BROKEN = [
    (
        "pytorchjob",
        lambda m: m["metadata"].update(name="9lives"),
        "TO pkg/webhooks/pytorch/pytorchjob_webhook.go: metadata.name",
    ),
    (
        "pytorchjob",
        lambda m: m["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2),
        "Master].replicas: Forbidden: must be 1",
    ),
    (
        "pytorchjob",
        lambda m: _template(m)["spec"]["containers"][0].update(name="trainer"),
        "must have at least one container with name pytorch",
    ),
    (
        "pytorchjob",
        lambda m: m["spec"]["runPolicy"].update(managedBy="me"),
        "spec.runPolicy.managedBy: Unsupported value",
    ),
    (
        "pytorchjob",
        lambda m: (
            m["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas=120) or m["metadata"].update(name="x" * 53)
        ),
        "Service " + "x" * 53 + "-worker-119",
    ),
    (
        "pytorchjob",
        lambda m: _template(m)["spec"]["containers"].append(dict(_template(m)["spec"]["containers"][0])),
        "Duplicate value",
    ),
    ("pytorchjob", lambda m: _template(m)["spec"]["containers"][0].update(cmd=["x"]), "Additional properties"),
    ("pytorchjob", lambda m: _template(m)["metadata"]["labels"].update(team="v" * 64), "team]: Invalid value"),
    ("pytorchjob", lambda m: _template(m)["spec"]["volumes"][0].pop("name"), "'name' is a required property"),
    (
        "pytorchjob",
        lambda m: _template(m)["spec"].update(
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["a", "b"]}]}
                        ]
                    }
                }
            }
        ),
        "must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
    ),
    (
        "pytorchjob",
        lambda m: _template(m)["spec"].update(
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [LONG_NODE]}
                                ]
                            }
                        ]
                    }
                }
            }
        ),
        "matchExpressions[0].values[0]: Invalid value",
    ),
    ("trainjob", lambda m: m["metadata"].update(name="9lives"), "metadata.name must match RFC 1035 DNS label format"),
    ("trainjob", lambda m: m["spec"]["runtimePatches"][0].update(manager="hpctrain"), "must be a domain-prefixed path"),
    (
        "trainjob",
        lambda m: m["metadata"].update(name="n" * 49),
        "pod names generated for this JobSet will exceed 63 characters",
    ),
    (
        "trainjob",
        lambda m: m["spec"]["trainer"]["env"].append({"name": "PET_NNODES", "value": "2"}),
        "must not have reserved envs",
    ),
    (
        "trainjob",
        lambda m: _patch_pod(m)["containers"][0].update(name="sidecar"),
        "must not have container that doesn't exist",
    ),
    (
        "trainjob",
        lambda m: _patch_pod(m)["containers"][0].update(env=[{"name": "A", "value": "1"}]),
        "must not have envs for the",
    ),
    (
        "trainjob",
        lambda m: m["spec"]["runtimeRef"].update(name="deepspeed"),
        "specified clusterTrainingRuntime must be created",
    ),
    (
        "trainjob",
        lambda m: m["spec"].update(managedBy="me"),
        "ManagedBy must be trainer.kubeflow.org/trainjob-controller",
    ),
    (
        "trainjob",
        lambda m: m["spec"]["trainer"]["resourcesPerNode"]["limits"].update(cpu=[1]),
        "resourcesPerNode.limits.cpu",
    ),
    ("trainjob", lambda m: _patch_pod(m).update(volumes=_patch_pod(m)["volumes"] * 2), "Duplicate value"),
]


@pytest.mark.parametrize("api,mutate,expected", BROKEN, ids=[f"{a}-{e[:40]}" for a, _, e in BROKEN])
def test_oracle_refuses(api: str, mutate, expected: str) -> None:
    manifest = _pytorchjob() if api == "pytorchjob" else _trainjob()
    assert kubeflow_oracle.refusals(manifest) == []
    broken = copy.deepcopy(manifest)
    mutate(broken)
    problems = kubeflow_oracle.refusals(broken)
    assert any(expected in p for p in problems), problems


def test_oracle_refuses_pods() -> None:
    from hpctrain.schedulers.kubernetes.services import service_pods as k8s

    pod = k8s.render_pod(
        k8s.ServicePod(name="tb-1", kind="tensorboard", command=("tensorboard",), port=6006),
        KubernetesOptions(image=IMAGE),
    )
    assert kubeflow_oracle.refusals(pod) == []
    pod["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    pod["metadata"]["name"] = "Tb_1"
    problems = kubeflow_oracle.refusals(pod)
    assert any("containerPort: 'http' is not of type 'integer'" in p for p in problems), problems
    assert any("metadata.name: Invalid value: 'Tb_1'" in p for p in problems), problems


def test_vendored_runtime_passes_its_crd() -> None:
    """The oracle's default runtime (Trainer v2.3.0's torch-distributed) is itself what its CRD accepts."""
    runtime = kubeflow_oracle.default_runtimes()["torch-distributed"]
    assert kubeflow_oracle.refusals(runtime) == []
    broken = copy.deepcopy(runtime)
    broken["spec"]["template"]["spec"]["replicatedJobs"].append(
        copy.deepcopy(broken["spec"]["template"]["spec"]["replicatedJobs"][0])
    )
    assert any("Duplicate value" in p for p in kubeflow_oracle.refusals(broken))


def _own_runtime_job() -> tuple[dict[str, Any], dict[str, Any]]:
    job, options = _job("trainjob", 3, 2, 2), _options("trainjob", 1)
    assert job.max_restarts == 1
    return own_runtime(job, options), render(job, options)


RUNTIME_BROKEN = [
    (
        lambda rt, tj: rt["spec"]["template"]["spec"]["replicatedJobs"][0].update(replicas=2),
        "replicas: Invalid value: 2: always must be 1",
    ),
    (
        lambda rt, tj: rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
            "containers"
        ][0].update(name="trainer"),
        "must contain the required container for the ancestor: trainer",
    ),
    (
        lambda rt, tj: rt["spec"]["template"]["spec"]["failurePolicy"].update(maxRestarts="3"),
        "'3' is not of type 'integer'",
    ),
    (lambda rt, tj: rt["spec"]["template"]["spec"]["failurePolicy"].update(restarts=1), "Additional properties"),
    (
        lambda rt, tj: rt["metadata"].update(namespace="team-b"),
        "specified trainingRuntime must be created before the TrainJob",
    ),
    (
        lambda rt, tj: tj["spec"]["runtimeRef"].update(name="hpctrain-other"),
        "specified trainingRuntime must be created before the TrainJob",
    ),
    (
        lambda rt, tj: tj["spec"]["runtimeRef"].update(kind="ClusterTrainingRuntime"),
        "specified clusterTrainingRuntime must be created",
    ),
]


@pytest.mark.parametrize("mutate,expected", RUNTIME_BROKEN, ids=[e[:40] for _, e in RUNTIME_BROKEN])
def test_oracle_refuses_a_broken_own_runtime(mutate, expected: str) -> None:
    """hpctrain's own TrainingRuntime (TrainJob --max-restarts) and the TrainJob on it pass, each rule broken fails:
    Trainer's TrainingRuntime webhook, the CRD's schema, and the TrainJob validator's lookup of a namespaced runtime
    (the same namespace, the same kind)."""
    runtime, trainjob = _own_runtime_job()
    runtimes = lambda rt: {**kubeflow_oracle.default_runtimes(), rt["metadata"]["name"]: rt}
    assert kubeflow_oracle.refusals(runtime) == [] and kubeflow_oracle.refusals(trainjob, runtimes(runtime)) == []
    mutate(runtime, trainjob)
    problems = kubeflow_oracle.refusals(runtime) + kubeflow_oracle.refusals(trainjob, runtimes(runtime))
    assert any(expected in p for p in problems), problems
