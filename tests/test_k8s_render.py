"""Kubernetes render: golden manifests for PyTorchJob/TrainJob x CPU/GPU x single/multi-pod x with/without volumes
and shm, each validated against the vendored Kubeflow CRD schemas; the schema check rejects unknown fields; the
restart, resource, command and run-dir mapping; what Kubernetes cannot express is refused with the fix."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
import subprocess
import sys
from pathlib import Path

import kubeflow_oracle
import pytest
import yaml

from hpctrain.errors import UserError
from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
from hpctrain.schedulers.kubernetes.manifests.render import container_command, render, rendered
from hpctrain.schedulers.kubernetes.manifests.validate import CRD_FILES, crd_schema, to_json_schema, validate_manifest

GOLDEN_DIR = Path(__file__).parent / "golden" / "kubernetes"
UPDATE = os.environ.get("HPCTRAIN_UPDATE_GOLDEN") == "1"
IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"
STORAGE = {
    "plain": {},
    "volumes": {
        "shm": "8Gi",
        "volumes": (
            "pvc:team-runs:/mnt/share/team",
            "nfs:nas.example.com:/export/users:/mnt/user:ro",
            "host:/mnt/datasets:/data:ro",
        ),
    },
}


def golden_job(res: str, size: str) -> JobSpec:
    nodes = 1 if size == "single" else 3
    gpus = 2 if res == "gpu" else 0
    return JobSpec(
        command=("hpctrain", "train", "mnist", "--dataset", "fashion-mnist", "--epochs", "1"),
        name=f"mnist-{res}-{size}",
        time_limit_s=2 * 3600,
        resources=Resources(
            nodes=nodes, nproc_per_node=max(1, gpus), gpus_per_node=gpus, cpus_per_task=4, mem_bytes=32 << 30
        ),
        run_dir="/mnt/share/team/runs/mnist-%j",
        env=(("OMP_NUM_THREADS", "4"),),
        max_restarts=3 if size == "multi" else 0,
    )


def golden_options(api: str, storage: str) -> KubernetesOptions:
    extra = {"priority_class": "batch-low"} if api == "pytorchjob" else {}
    return KubernetesOptions(namespace="team-a", api=api, image=IMAGE, **STORAGE[storage], **extra)


CASES = [
    (a, c, s, v)
    for a in ("pytorchjob", "trainjob")
    for c in ("cpu", "gpu")
    for s in ("single", "multi")
    for v in STORAGE
]


def _job_for(api: str, res: str, size: str) -> JobSpec:
    job = golden_job(res, size)
    return job.replace(max_restarts=0) if api == "trainjob" else job


@pytest.mark.parametrize("api,res,size,storage", CASES, ids=["-".join(c) for c in CASES])
def test_golden(api: str, res: str, size: str, storage: str) -> None:
    result = rendered(_job_for(api, res, size), golden_options(api, storage))
    assert validate_manifest(result.payload) == []
    assert yaml.safe_load(result.text) == result.payload  # the YAML is the manifest (no anchors, no loss)
    path = GOLDEN_DIR / f"{api}-{res}-{size}-{storage}.yaml"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(result.text)
    if not path.exists():
        pytest.fail(f"{path} is missing; create it with: HPCTRAIN_UPDATE_GOLDEN=1 pytest {__file__}")
    expected = path.read_text()
    if result.text != expected:
        diff = "".join(
            difflib.unified_diff(expected.splitlines(True), result.text.splitlines(True), str(path), "rendered")
        )
        pytest.fail(
            f"rendered manifest differs from {path.name}:\n{diff}\nIf the change is intended, refresh with: "
            f"HPCTRAIN_UPDATE_GOLDEN=1 pytest {__file__}"
        )


def elastic_job() -> JobSpec:
    """`--nodes 2:3 --max-restarts 3`: an elastic PyTorchJob (golden file pytorchjob-cpu-elastic-plain.yaml)."""
    job = golden_job("cpu", "multi")
    return job.replace(name="mnist-elastic", resources=dataclasses.replace(job.resources, min_nodes=2))


def test_golden_elastic() -> None:
    """--nodes MIN:MAX renders Workers only with an elasticPolicy that training-operator v1.9's webhook, the CRD and
    the API server accept (tests/kubeflow_oracle.py), its pods running torchrun on the PET_* the controller sets."""
    result = rendered(elastic_job(), golden_options("pytorchjob", "plain"))
    assert validate_manifest(result.payload) == []
    assert kubeflow_oracle.refusals(result.payload) == []
    spec = result.payload["spec"]
    assert spec["elasticPolicy"] == {"minReplicas": 2, "maxReplicas": 3, "maxRestarts": 3, "rdzvBackend": "c10d"}
    assert list(spec["pytorchReplicaSpecs"]) == ["Worker"] and spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == 3
    command = spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("torchrun") :][:4] == ["torchrun", "--no-python", "hpctrain", "train"]
    path = GOLDEN_DIR / "pytorchjob-cpu-elastic-plain.yaml"
    if UPDATE:
        path.write_text(result.text)
    assert path.read_text() == result.text, f"refresh with: HPCTRAIN_UPDATE_GOLDEN=1 pytest {__file__}"


@pytest.mark.parametrize(
    "mutate,expected",
    [
        (lambda spec: spec["elasticPolicy"].pop("minReplicas"), "minReplicas and maxReplicas must be given together"),
        (lambda spec: spec["elasticPolicy"].update(minReplicas=4), "refuses a minimum above the maximum"),
        (
            lambda spec: spec.update(pytorchReplicaSpecs={"Master": spec["pytorchReplicaSpecs"]["Worker"]}),
            "must be configured if elastic policy is used",
        ),
        (lambda spec: spec["elasticPolicy"].update(nProcPerNode=1), "must not be used with spec.nprocPerNode"),
    ],
)
def test_the_oracle_refuses_what_training_operator_refuses_of_an_elasticpolicy(mutate, expected: str) -> None:
    """The rules the elastic golden is checked against are live: each refuses its case (tests/kubeflow_rules.py)."""
    manifest = copy.deepcopy(rendered(elastic_job(), golden_options("pytorchjob", "plain")).payload)
    mutate(manifest["spec"])
    assert any(expected in line for line in kubeflow_oracle.refusals(manifest)), kubeflow_oracle.refusals(manifest)


@pytest.mark.parametrize(
    "api,change,message",
    [
        ("trainjob", {}, "a TrainJob \\(Trainer v2.3\\) has no elastic policy; use --k8s-api pytorchjob"),
        ("pytorchjob", {"max_restarts": 0}, "give the budget of such membership changes with --max-restarts N"),
    ],
)
def test_elastic_refusals(api: str, change: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        render(elastic_job().replace(**change), golden_options(api, "plain"))


def test_every_golden_file_validates_against_its_crd() -> None:
    files = sorted(GOLDEN_DIR.glob("*.yaml"))
    assert len(files) == len(CASES) + 1  # and the elastic one
    for path in files:
        assert validate_manifest(yaml.safe_load(path.read_text())) == [], path.name


def _base(api: str = "pytorchjob") -> dict:
    return render(golden_job("gpu", "multi").replace(max_restarts=0), golden_options(api, "volumes"))


@pytest.mark.parametrize(
    "api,mutate,expected",
    [
        ("pytorchjob", lambda m: m["spec"].update(bogus=1), "spec: Additional properties are not allowed ('bogus'"),
        ("pytorchjob", lambda m: m["spec"]["runPolicy"].update(backofLimit=2), "spec.runPolicy: Additional properties"),
        (
            "pytorchjob",
            lambda m: m["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0].update(cmd=["x"]),
            "spec.pytorchReplicaSpecs.Master.template.spec.containers.0: Additional properties",
        ),
        (
            "pytorchjob",
            lambda m: m["spec"]["pytorchReplicaSpecs"]["Worker"].update(replicas="two"),
            "spec.pytorchReplicaSpecs.Worker.replicas: 'two' is not of type 'integer'",
        ),
        (
            "pytorchjob",
            lambda m: m["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"][
                "limits"
            ].update(cpu=[1]),
            "resources.limits.cpu: [1] is not valid under any of the given schemas",
        ),
        ("pytorchjob", lambda m: m["spec"].pop("pytorchReplicaSpecs"), "'pytorchReplicaSpecs' is a required property"),
        ("trainjob", lambda m: m["spec"]["trainer"].update(numWorkers=2), "spec.trainer: Additional properties"),
        ("trainjob", lambda m: m["spec"].pop("runtimeRef"), "'runtimeRef' is a required property"),
        (
            "trainjob",
            lambda m: m["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
                "template"
            ]["spec"]["template"]["spec"].update(priorityClassName="x"),
            "Additional properties are not allowed ('priorityClassName'",
        ),
    ],
)
def test_schema_rejects(api: str, mutate, expected: str) -> None:
    manifest = copy.deepcopy(_base(api))
    assert validate_manifest(manifest) == []
    mutate(manifest)
    problems = validate_manifest(manifest)
    assert any(expected in p for p in problems), problems


def test_validation_does_not_pay_for_a_format_checker_it_never_uses() -> None:
    """rfc3987_syntax (installed here with jsonschema's format-nongpl extra, as Jupyter brings it) compiles its
    parsers when imported: 1.2 CPU s. Validating a manifest leaves it out, finds the same errors, and a later import
    of it still works (nothing is blocked for good)."""
    pytest.importorskip("rfc3987_syntax", reason="the slow format checker is not installed: nothing to leave out")
    code = (
        "import sys\n"
        "from hpctrain.schedulers.kubernetes.manifests.validate import validate_manifest\n"
        "problems = validate_manifest({'apiVersion': 'kubeflow.org/v1', 'kind': 'PyTorchJob', 'spec': {'x': 1}})\n"
        "print('rfc3987_syntax' in sys.modules, any(\"'x' was unexpected\" in p for p in problems))\n"
        "import rfc3987_syntax\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout) == (0, "False True\n"), result.stderr


def test_schema_translation() -> None:
    schema = to_json_schema(
        {
            "type": "object",
            "properties": {
                "q": {"x-kubernetes-int-or-string": True},
                "n": {"type": "string", "nullable": True},
                "free": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": True,
                    "properties": {"a": {"type": "string"}},
                },
                "map": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        }
    )
    assert schema["additionalProperties"] is False
    assert schema["properties"]["q"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert schema["properties"]["n"]["type"] == ["string", "null"]
    assert "additionalProperties" not in schema["properties"]["free"]
    assert schema["properties"]["map"]["additionalProperties"] == {"type": "string"}


@pytest.mark.parametrize("filename", sorted(CRD_FILES.values()))
def test_each_vendored_crds_translation_is_a_valid_draft7_schema(filename: str) -> None:
    """`check` builds its validator without the metaschema check (validate._validator): here it is done."""
    import jsonschema

    jsonschema.Draft7Validator.check_schema(crd_schema(filename))


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_excluded_nodes_become_a_required_node_affinity(api: str) -> None:
    manifest = render(
        _job_for(api, "gpu", "multi").replace(exclude_nodes=("gpu07", "gpu12")), golden_options(api, "plain")
    )
    assert validate_manifest(manifest) == []
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "NotIn", "values": ["gpu07"]},
                            {"key": "metadata.name", "operator": "NotIn", "values": ["gpu12"]},
                        ]
                    }
                ]
            }
        }
    }
    found = list(_find_key(manifest, "affinity"))
    assert found and all(a == affinity for a in found), found
    assert len(found) == (2 if api == "pytorchjob" else 1)  # Master and Worker; the runtime patch's one pod spec
    assert not list(_find_key(render(_job_for(api, "gpu", "multi"), golden_options(api, "plain")), "affinity"))


def _find_key(value, key: str):
    if isinstance(value, dict):
        for k, v in value.items():
            if k == key:
                yield v
            yield from _find_key(v, key)
    elif isinstance(value, list):
        for item in value:
            yield from _find_key(item, key)


def test_unknown_kind_is_named() -> None:
    assert "no vendored CRD" in validate_manifest({"apiVersion": "batch/v1", "kind": "Job"})[0]


def test_pytorchjob_mapping() -> None:
    m = render(golden_job("gpu", "multi"), golden_options("pytorchjob", "volumes"))
    master, worker = m["spec"]["pytorchReplicaSpecs"]["Master"], m["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert (master["replicas"], worker["replicas"]) == (1, 2)  # 3 pods: one master, two workers
    assert master["restartPolicy"] == worker["restartPolicy"] == "OnFailure"  # 75 (preempted) must be retried
    # --max-restarts 3 on 3 pods: 3 incidents that restart every pod are 9 restarts, and the operator fails the job
    # when they *reach* backoffLimit; --time 2:00:00 per attempt (4 attempts) plus a day for the queue
    assert m["spec"]["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "backoffLimit": 10,
        "activeDeadlineSeconds": 4 * 7200 + 24 * 3600,
    }
    assert m["spec"]["nprocPerNode"] == "2"
    pod = master["template"]["spec"]
    container = pod["containers"][0]
    assert container["name"] == "pytorch"
    assert (
        container["resources"]["requests"]
        == container["resources"]["limits"]
        == {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"}
    )
    assert {"name": "HPCTRAIN_RUN_DIR", "value": "/mnt/share/team/runs/mnist-mnist-gpu-multi"} in container["env"]
    assert pod["terminationGracePeriodSeconds"] == 120  # --signal-grace: time to checkpoint after SIGTERM
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert pod["priorityClassName"] == "batch-low"
    assert m["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "hpctrain"
    assert master["template"]["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "hpctrain"


@pytest.mark.parametrize(
    "api,command,nodes,nproc,expected",
    [
        (
            "pytorchjob",
            ("hpctrain", "train", "mnist"),
            2,
            2,
            ["hpctrain", "train", "mnist"],
        ),  # hpctrain fans out itself
        (
            "pytorchjob",
            ("/usr/bin/python3", "-m", "hpctrain", "train"),
            1,
            2,
            ["/usr/bin/python3", "-m", "hpctrain", "train"],
        ),
        ("pytorchjob", ("python", "train.py"), 2, 2, ["torchrun", "--no-python", "python", "train.py"]),
        ("pytorchjob", ("python", "train.py"), 2, 1, ["python", "train.py"]),  # RANK/WORLD_SIZE per pod
        ("trainjob", ("hpctrain", "train", "mnist"), 2, 1, ["torchrun", "--no-python", "hpctrain", "train", "mnist"]),
        ("trainjob", ("python", "train.py"), 1, 1, ["python", "train.py"]),
    ],
)
def test_container_command(api: str, command: tuple, nodes: int, nproc: int, expected: list[str]) -> None:
    job = JobSpec(command=command, resources=Resources(nodes=nodes, nproc_per_node=nproc))
    assert container_command(job, KubernetesOptions(api=api, image=IMAGE)) == expected


@pytest.mark.parametrize(
    "change,api,message",
    [
        ({"resources": Resources(mem_bytes=0)}, "pytorchjob", "--mem 0"),
        ({"name": "Mnist_Run"}, "pytorchjob", "not a valid Kubeflow job name"),
        ({"name": "a" * 55}, "pytorchjob", "use at most 54"),
        ({"resources": Resources(nproc_per_node=2, gpus_per_node=4)}, "pytorchjob", "set --nproc-per-node 4"),
        ({"env": (("PET_NNODES", "2"),)}, "trainjob", "PET_* variables are set by the Trainer runtime"),
    ],
)
def test_render_refuses_what_kubernetes_cannot_express(change: dict, api: str, message: str) -> None:
    job = JobSpec(command=("hpctrain", "train", "mnist")).replace(**change)
    with pytest.raises(UserError, match=message.replace("*", r"\*").replace("(", r"\(")):
        render(job, KubernetesOptions(api=api, image=IMAGE))


def test_render_needs_an_image() -> None:
    with pytest.raises(UserError, match="give --image"):
        render(JobSpec(command=("hpctrain", "train", "mnist")), KubernetesOptions())


def test_trainjob_priority_class_refused() -> None:
    with pytest.raises(UserError, match="no per-job priority class"):
        render(JobSpec(command=("hpctrain",)), KubernetesOptions(api="trainjob", image=IMAGE, priority_class="high"))


def test_render_is_pure() -> None:
    job, options = golden_job("cpu", "multi"), golden_options("pytorchjob", "volumes")
    assert rendered(job, options) == rendered(job, options)
    assert rendered(job, options).filename == "pytorchjob.yaml"
    assert rendered(job.replace(max_restarts=0), golden_options("trainjob", "plain")).filename == "trainjob.yaml"
