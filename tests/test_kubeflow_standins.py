"""The Kubeflow stand-ins (tests/kubeflow_standin.py, tests/trainer_standin.py) behave as the real controllers where
hpctrain depends on them, against the real local API server (scripts/local-k8s.sh; no kubelet: pod phases and
restart counts are written here through the status subresource, as the kubelet would). Each pass is run by hand
(`reconcile()`), so nothing waits on the stand-in's thread.

* they refuse what the real admission webhooks refuse (tests/kubeflow_oracle.py): the job ends AdmissionRefused,
  without pods, and the refusal is in .errors, which fails an end-to-end test
* PyTorchJob (training-operator v1.9.4): a headless Service per replica, the variables in every container, an
  evicted OnFailure pod made again, activeDeadlineSeconds from startTime, cleanPodPolicy None by default
* TrainJob (Trainer v2.3.0, JobSet v0.12.0, the Job controller): resources merged into the runtime's, JobSet's
  Service, the Job's backoff counting only active pods' restarts, activeDeadlineSeconds, and JobSet's
  failurePolicy.maxRestarts on hpctrain's own namespaced TrainingRuntime (TrainJob --max-restarts)
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest

from k8s_fixtures import LocalK8s
from kubeflow_standin import GROUP, PLURAL, VERSION, KubeflowStandIn, create_namespace, delete_namespace, parse_time
from trainer_standin import TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS, TrainerStandIn

pytestmark = pytest.mark.k8s
IMAGE = "example.invalid/pytorch:latest"
CONTAINER = {
    "name": "pytorch",
    "image": IMAGE,
    "command": ["python", "train.py"],
    "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "1"}},
}
SIDECAR = {"name": "sidecar", "image": IMAGE, "command": ["sleep", "inf"]}


@pytest.fixture
def standin(k8s_cluster: LocalK8s) -> Iterator[TrainerStandIn]:
    api = k8s_cluster.api_client()
    namespace = create_namespace(api, "hpct-standin")
    try:
        yield TrainerStandIn(api, namespace)  # not started: the tests run its passes
    finally:
        delete_namespace(api, namespace)


def pytorchjob(name: str, workers: int = 1, run_policy: dict[str, Any] | None = None) -> dict[str, Any]:
    template = {"spec": {"containers": [CONTAINER, SIDECAR]}}
    replicas = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
    if workers:
        replicas["Worker"] = {"replicas": workers, "restartPolicy": "OnFailure", "template": template}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {"runPolicy": run_policy or {}, "pytorchReplicaSpecs": replicas},
    }


def trainjob(
    name: str, manager: str = "hpctrain.io/submit", runtime: str = "torch-distributed", **spec: Any
) -> dict[str, Any]:
    patch_pod = {
        "containers": [{"name": "node", "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "emptyDir": {}}],
    }
    return {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"apiGroup": TRAINER_GROUP, "kind": "ClusterTrainingRuntime", "name": runtime},
            "trainer": {
                "image": IMAGE,
                "command": ["python", "train.py"],
                "numNodes": 2,
                "resourcesPerNode": {"limits": {"cpu": "2"}},
            },
            "runtimePatches": [
                {
                    "manager": manager,
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {"name": "node", "template": {"spec": {"template": {"spec": patch_pod}}}}
                                ]
                            }
                        }
                    },
                }
            ],
            **spec,
        },
    }


def create(s: KubeflowStandIn, obj: dict[str, Any]) -> None:
    group, version, plural = (
        (GROUP, VERSION, PLURAL) if obj["kind"] == "PyTorchJob" else (TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS)
    )
    s.custom.create_namespaced_custom_object(group, version, s.namespace, plural, obj)


def get(s: KubeflowStandIn, kind: str, name: str) -> dict[str, Any]:
    group, version, plural = (
        (GROUP, VERSION, PLURAL) if kind == "PyTorchJob" else (TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS)
    )
    return s.custom.get_namespaced_custom_object(group, version, s.namespace, plural, name)


def last_condition(s: KubeflowStandIn, kind: str, name: str) -> dict[str, Any]:
    conditions = [c for c in (get(s, kind, name).get("status") or {}).get("conditions") or [] if c["status"] == "True"]
    return conditions[-1] if conditions else {}


def pods(s: KubeflowStandIn) -> dict[str, Any]:
    return {
        p.metadata.name: p for p in s.core.list_namespaced_pod(s.namespace).items if not p.metadata.deletion_timestamp
    }


def set_phase(
    s: KubeflowStandIn,
    pod: str,
    phase: str,
    restarts: int = 0,
    reason: str | None = None,
    init_restarts: int | None = None,
) -> None:
    """The status a kubelet would write: `restarts` on the first container; an init container's status when
    `init_restarts` is given."""

    def status(name: str, count: int, state: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": name,
            "image": IMAGE,
            "imageID": "",
            "ready": phase == "Running",
            "restartCount": count,
            "state": state,
        }

    state = {"running": {}} if phase == "Running" else {"terminated": {"exitCode": 0 if phase == "Succeeded" else 137}}
    containers = s.core.read_namespaced_pod(pod, s.namespace).spec.containers
    body: dict[str, Any] = {
        "phase": phase,
        "reason": reason,
        "podIP": "10.0.0.9",
        "conditions": [{"type": "Ready", "status": "True" if phase == "Running" else "False"}],
        "containerStatuses": [status(c.name, restarts if i == 0 else 0, state) for i, c in enumerate(containers)],
    }
    if init_restarts is not None:
        body["initContainerStatuses"] = [status("init-pytorch", init_restarts, {"terminated": {"exitCode": 0}})]
    s.core.patch_namespaced_pod_status(pod, s.namespace, {"status": body})


def test_webhook_refusals_end_the_job_without_pods(standin: TrainerStandIn) -> None:
    """Without the oracle the stand-ins made pods for both (there was no admission at all)."""
    create(standin, pytorchjob("7run"))
    create(standin, trainjob("tj-bad", manager="hpctrain"))
    standin.reconcile()
    assert not pods(standin)
    assert last_condition(standin, "PyTorchJob", "7run")["reason"] == "AdmissionRefused"
    assert last_condition(standin, "TrainJob", "tj-bad")["reason"] == "AdmissionRefused"
    assert any(
        e.startswith(
            "a real cluster refuses PyTorchJob 7run: TO pkg/webhooks/pytorch/pytorchjob_webhook.go: metadata.name"
        )
        for e in standin.errors
    ), standin.errors
    assert any(
        "TrainJob tj-bad: TR pkg/runtime/framework/plugins/jobset/jobset.go: spec.runtimePatches.manager" in e
        for e in standin.errors
    ), standin.errors
    standin.errors.clear()
    standin.reconcile()  # decided once: no second refusal, still no pods
    assert not standin.errors and not pods(standin)


def test_pytorchjob_services_env_and_eviction(standin: TrainerStandIn) -> None:
    create(standin, pytorchjob("pj", workers=2))
    standin.reconcile()
    services = {s.metadata.name: s for s in standin.core.list_namespaced_service(standin.namespace).items}
    assert sorted(services) == ["pj-master-0", "pj-worker-0", "pj-worker-1"]
    master_svc = services["pj-master-0"].spec
    assert master_svc.cluster_ip == "None" and not master_svc.publish_not_ready_addresses
    assert master_svc.selector == {
        "training.kubeflow.org/job-name": "pj",
        "training.kubeflow.org/replica-type": "master",
        "training.kubeflow.org/replica-index": "0",
    }
    master = pods(standin)["pj-master-0"]
    for container in master.spec.containers:  # every container, the sidecar too
        assert {"MASTER_ADDR", "WORLD_SIZE", "RANK"} <= {e.name for e in container.env}, container.name
    assert not standin.errors, standin.errors

    set_phase(standin, "pj-master-0", "Failed", reason="Evicted")  # an OnFailure pod evicted: made again
    standin.reconcile()
    assert last_condition(standin, "PyTorchJob", "pj")["type"] == "Restarting"
    standin.reconcile()
    assert "pj-master-0" in pods(standin) and pods(standin)["pj-master-0"].status.phase in (None, "Pending")
    assert last_condition(standin, "PyTorchJob", "pj")["type"] != "Failed"


def test_a_worker_is_given_only_a_ready_masters_address_never_a_terminating_ones(standin: TrainerStandIn) -> None:
    """The master's headless Service has no publishNotReadyAddresses: its name resolves to a Ready pod only. After a
    preemption the old master may still be terminating when its worker is made again; given that pod's address, the
    new worker would wait on it forever (the likely cause of a CI run where the preempted job never resumed)."""
    create(standin, pytorchjob("pj", workers=1))
    standin.reconcile()
    assert sorted(pods(standin)) == ["pj-master-0"]  # no address yet: the worker waits, as the init container would
    set_phase(standin, "pj-master-0", "Running")
    standin.reconcile()
    [alias] = pods(standin)["pj-worker-0"].spec.host_aliases
    assert alias.hostnames == ["pj-master-0"] and alias.ip == "10.0.0.9"

    # The scheduler preempts both: the worker goes at once, the master (a finalizer here) is still terminating.
    standin.core.patch_namespaced_pod(
        "pj-master-0", standin.namespace, {"metadata": {"finalizers": ["hpctrain.test/hold"]}}
    )
    for name in ("pj-worker-0", "pj-master-0"):
        standin.core.delete_namespaced_pod(name, standin.namespace)
    standin.reconcile()
    assert "pj-worker-0" not in pods(standin), "a worker made with the terminating master's address"
    standin.core.patch_namespaced_pod("pj-master-0", standin.namespace, {"metadata": {"finalizers": None}})
    standin.reconcile()
    assert sorted(pods(standin)) == ["pj-master-0"]
    assert not standin.errors, standin.errors


def test_pytorchjob_backoff_counts_running_pods_init_containers_included(standin: TrainerStandIn) -> None:
    """training-operator v1.9.4 PastBackoffLimit: the restarts of Running pods' containers and init containers (the
    real workers' init-pytorch restarts count too), `>= backoffLimit`."""
    create(standin, pytorchjob("pj-backoff", workers=2, run_policy={"backoffLimit": 3}))
    standin.reconcile()
    set_phase(standin, "pj-backoff-master-0", "Running")
    standin.reconcile()  # the workers, now that the master has an address
    set_phase(standin, "pj-backoff-worker-0", "Succeeded", restarts=5)  # a finished pod's restarts do not count
    set_phase(standin, "pj-backoff-worker-1", "Running", restarts=1, init_restarts=1)
    standin.reconcile()
    assert last_condition(standin, "PyTorchJob", "pj-backoff")["type"] != "Failed"
    set_phase(standin, "pj-backoff-worker-1", "Running", restarts=1, init_restarts=2)
    standin.reconcile()
    condition = last_condition(standin, "PyTorchJob", "pj-backoff")
    assert (condition["type"], condition["message"]) == (
        "Failed",
        "Job pj-backoff has failed because it has reached the specified backoff limit",
    )


@pytest.mark.parametrize("policy,kept", [(None, True), ("Running", False)])
def test_pytorchjob_deadline_and_clean_pod_policy(standin: TrainerStandIn, policy: str | None, kept: bool) -> None:
    run_policy = {"activeDeadlineSeconds": 5, **({"cleanPodPolicy": policy} if policy else {})}
    create(standin, pytorchjob("pj-deadline", workers=0, run_policy=run_policy))
    standin.reconcile()
    set_phase(standin, "pj-deadline-master-0", "Running")
    started = parse_time(get(standin, "PyTorchJob", "pj-deadline")["status"]["startTime"])
    standin.clock = lambda: started + dt.timedelta(seconds=4.9)  # the stand-in's clock, moved on: no sleeping
    standin.reconcile()
    assert last_condition(standin, "PyTorchJob", "pj-deadline")["type"] != "Failed"
    standin.clock = lambda: started + dt.timedelta(seconds=5)
    standin.reconcile()
    condition = last_condition(standin, "PyTorchJob", "pj-deadline")
    assert condition["type"] == "Failed"
    assert condition["message"] == "Job pj-deadline has failed because it was active longer than specified deadline"
    standin.reconcile()
    assert ("pj-deadline-master-0" in pods(standin)) is kept  # v1.9.4's default None keeps a running pod


@pytest.fixture
def sized_runtime(standin: TrainerStandIn) -> Iterator[str]:
    """The cluster's torch-distributed runtime with memory set on its node container (cluster-scoped: a unique name,
    removed afterwards)."""
    runtime = standin.custom.get_cluster_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", "torch-distributed"
    )
    name = f"hpctrain-test-{standin.namespace}"
    spec = copy.deepcopy(runtime["spec"])
    node = spec["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    node["resources"] = {"requests": {"memory": "1Gi"}, "limits": {"memory": "1Gi"}}
    standin.custom.create_cluster_custom_object(
        TRAINER_GROUP,
        TRAINER_VERSION,
        "clustertrainingruntimes",
        {
            "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
            "kind": "ClusterTrainingRuntime",
            "metadata": {"name": name},
            "spec": spec,
        },
    )
    try:
        yield name
    finally:
        standin.custom.delete_cluster_custom_object(TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", name)


def test_trainjob_resources_service_and_backoff(standin: TrainerStandIn, sized_runtime: str) -> None:
    create(standin, trainjob("tj", runtime=sized_runtime))
    standin.reconcile()
    assert not standin.errors, standin.errors
    (pod,) = pods(standin).values()  # node 0 first; the others once it has an address
    container = next(c for c in pod.spec.containers if c.name == "node")
    # resourcesPerNode (limits cpu 2) merged into the runtime's, key by key: before, it replaced them.
    assert container.resources.limits == {"memory": "1Gi", "cpu": "2"}
    assert container.resources.requests["memory"] == "1Gi"
    service = standin.core.read_namespaced_service("tj", standin.namespace).spec
    assert service.cluster_ip == "None" and service.publish_not_ready_addresses is True

    set_phase(standin, pod.metadata.name, "Running")
    standin.reconcile()
    assert len(pods(standin)) == 2
    first, second = sorted(pods(standin))
    # 6 restarts (the Job's default backoffLimit) on a pod that then succeeded no longer count (Job controller:
    # Running and Pending pods only); before, every pod's restarts were summed and the job failed.
    set_phase(standin, first, "Succeeded", restarts=6)
    set_phase(standin, second, "Running", restarts=1)
    standin.reconcile()
    assert last_condition(standin, "TrainJob", "tj").get("type") != "Failed"
    set_phase(standin, second, "Running", restarts=6)
    standin.reconcile()
    assert last_condition(standin, "TrainJob", "tj")["type"] == "Failed"


def test_trainjob_deadline_counts_from_creation(standin: TrainerStandIn) -> None:
    create(standin, trainjob("tj-deadline", activeDeadlineSeconds=1))
    created = parse_time(get(standin, "TrainJob", "tj-deadline")["metadata"]["creationTimestamp"])
    standin.clock = lambda: created + dt.timedelta(seconds=1)  # the stand-in's clock, moved on: no sleeping
    standin.reconcile()
    assert pods(standin)
    standin.clock = lambda: created + dt.timedelta(seconds=1.1)
    standin.reconcile()
    condition = last_condition(standin, "TrainJob", "tj-deadline")
    assert (condition["type"], condition["reason"], condition["message"]) == (
        "Failed",
        "DeadlineExceeded",
        "TrainJob exceeded its active deadline",
    )
    assert not pods(standin)


def test_trainjob_on_hpctrains_own_runtime_restarts_the_set_max_restarts_times(standin: TrainerStandIn) -> None:
    """`submit --k8s-api trainjob --max-restarts 2`: the TrainJob on hpctrain's own TrainingRuntime (namespaced, made
    first and admitted by the oracle). A failed pod (restartPolicy Never, the Job's backoffLimit 0) fails the Job, and
    JobSet deletes and recreates the whole set, restart-attempt + 1, while fewer than maxRestarts restarts were made;
    the third failure fails it, ReachedMaxRestarts (JobSet v0.12.0 pkg/controllers/failure_policy.go
    restartJobSetActionApplier). Node 1 failing counts as node 0 would: one restart per incident."""
    from hpctrain.jobs.spec import JobSpec, Resources
    from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
    from hpctrain.schedulers.kubernetes.scheduler import KubernetesScheduler

    sched = KubernetesScheduler(
        KubernetesOptions(namespace=standin.namespace, api="trainjob", image=IMAGE),
        api_client=standin.custom.api_client,
    )
    job = JobSpec(
        command=("python", "train.py"),
        name="tj-budget",
        max_restarts=2,
        resources=Resources(nodes=2, cpus_per_task=1, mem_bytes=1 << 30),
    )
    sched.submit(job, sched.render(job))
    for attempt, failing in ((0, 0), (1, 1), (2, 0)):
        standin.reconcile()  # node 0
        (node0,) = pods(standin).values()
        set_phase(standin, node0.metadata.name, "Running")
        standin.reconcile()  # node 1, once node 0 has an address
        assert not standin.errors, standin.errors
        current = sorted(
            pods(standin).values(), key=lambda p: p.metadata.annotations["batch.kubernetes.io/job-completion-index"]
        )
        assert [p.metadata.labels["jobset.sigs.k8s.io/restart-attempt"] for p in current] == [str(attempt)] * 2
        assert current[0].spec.restart_policy == "Never"
        assert last_condition(standin, "TrainJob", "tj-budget").get("type") != "Failed"
        set_phase(standin, current[failing].metadata.name, "Failed")
        standin.reconcile()  # the Job fails: JobSet restarts the set, or fails it at the limit
    condition = last_condition(standin, "TrainJob", "tj-budget")
    assert (condition["type"], condition["reason"]) == ("Failed", "ReachedMaxRestarts"), condition
    assert sched.status("tj-budget").state == "FAILED"


def test_pytorchjob_records_exit_codes_that_outlive_the_pods(standin: TrainerStandIn) -> None:
    """training-operator v1 records "Pod: NS.POD exited with code N" (event ExitedWithCode on the job) whenever it
    finds the `pytorch` container terminated; after the job fails at its backoff limit and cleanPodPolicy Running took
    the restarting pod, `status` still gives the code from that event."""
    from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
    from hpctrain.schedulers.kubernetes.scheduler import KubernetesScheduler

    create(standin, pytorchjob("pj-exit", workers=0, run_policy={"backoffLimit": 1, "cleanPodPolicy": "Running"}))
    standin.reconcile()
    master = "pj-exit-master-0"
    container = {"name": "pytorch", "image": IMAGE, "imageID": "", "ready": False}
    standin.core.patch_namespaced_pod_status(
        master,
        standin.namespace,
        {
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    dict(container, restartCount=0, state={"terminated": {"exitCode": 3, "reason": "Error"}})
                ],
            }
        },
    )
    standin.reconcile()  # between the exit and the kubelet's restart: the operator records the code
    standin.core.patch_namespaced_pod_status(
        master,
        standin.namespace,
        {
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    dict(container, restartCount=1, state={"waiting": {"reason": "CrashLoopBackOff"}})
                ],
            }
        },
    )
    standin.reconcile()  # the restart reaches the backoff limit: Failed, the running pod deleted
    assert last_condition(standin, "PyTorchJob", "pj-exit")["type"] == "Failed"
    assert not pods(standin)
    events = standin.core.list_namespaced_event(standin.namespace, field_selector="reason=ExitedWithCode").items
    assert [(e.type, e.message) for e in events] == [
        ("Normal", f"Pod: {standin.namespace}.{master} exited with code 3")
    ]
    sched = KubernetesScheduler(KubernetesOptions(namespace=standin.namespace), api_client=standin.custom.api_client)
    status = sched.status("pj-exit")
    assert (status.state, status.replicas, status.exit_code) == ("FAILED", (), 3)


@pytest.mark.parametrize("module, distribution", [("celpy", "cel-python"), ("jsonschema", "jsonschema")])
def test_run_standins_stops_at_start_naming_what_to_install(module: str, distribution: str) -> None:
    """docs/kubernetes.md's `python tests/run_standins.py` without cel-python (or jsonschema): before, it started and
    logged the same import error every second while `submit --wait` waited for ever; now it stops at once, exit
    status 2, with the install line. The module is made unimportable in the child (sys.modules[NAME] = None, what
    Python does for a package that is not there); everything else is the script as documented."""
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    code = (
        f"import runpy, sys; sys.modules[{module!r}] = None; sys.path.insert(0, {str(tests)!r}); "
        f"sys.argv = ['run_standins.py', '--context', 'hpctrain-local']; "
        f"runpy.run_path({str(tests / 'run_standins.py')!r}, run_name='__main__')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc
    assert proc.stderr.strip() == (
        f"run_standins: the stand-ins need {distribution}, not installed here (they check every job as Kubeflow's "
        "webhooks and CRD rules would): pip install -e '.[k8s,dev]'"
    )
    assert proc.stdout == ""


def elastic_pytorchjob(name: str) -> dict[str, Any]:
    """Workers only under an elasticPolicy, as hpctrain renders an elastic job (--nodes 1:2 --max-restarts 3)."""
    template = {"spec": {"containers": [CONTAINER]}}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PyTorchJob",
        "metadata": {"name": name},
        "spec": {
            "elasticPolicy": {"minReplicas": 1, "maxReplicas": 2, "maxRestarts": 3, "rdzvBackend": "c10d"},
            "nprocPerNode": "1",
            "runPolicy": {"backoffLimit": 10},
            "pytorchReplicaSpecs": {"Worker": {"replicas": 2, "restartPolicy": "OnFailure", "template": template}},
        },
    }


def test_pytorchjob_elastic_policy(standin: TrainerStandIn) -> None:
    """training-operator v1.9.4 under an elasticPolicy: torchrun's PET_* and no MASTER_ADDR/WORLD_SIZE/RANK
    (elastic.go, envvar.go); the rendezvous at worker-0, whose address the other worker gets once it is Ready; a
    deleted worker made again; Succeeded once any worker has (pytorchjob_controller.go UpdateJobStatus)."""
    create(standin, elastic_pytorchjob("ej"))
    standin.reconcile()
    assert sorted(pods(standin)) == ["ej-worker-0"]  # worker-1 waits for the rendezvous host's address
    set_phase(standin, "ej-worker-0", "Running")
    standin.reconcile()
    assert sorted(pods(standin)) == ["ej-worker-0", "ej-worker-1"]
    env = {e.name: e.value for e in pods(standin)["ej-worker-1"].spec.containers[0].env}
    assert env == {
        "PYTHONUNBUFFERED": "1",
        "PET_NPROC_PER_NODE": "1",
        "PET_RDZV_ENDPOINT": "ej-worker-0:23456",
        "PET_RDZV_BACKEND": "c10d",
        "PET_NNODES": "1:2",
        "PET_MAX_RESTARTS": "3",
    }
    [alias] = pods(standin)["ej-worker-1"].spec.host_aliases
    assert alias.hostnames == ["ej-worker-0"] and alias.ip == "10.0.0.9"
    set_phase(standin, "ej-worker-1", "Running")
    standin.reconcile()
    assert last_condition(standin, "PyTorchJob", "ej")["type"] == "Running"

    standin.core.delete_namespaced_pod("ej-worker-1", standin.namespace, grace_period_seconds=0)
    standin.reconcile()
    assert sorted(pods(standin)) == ["ej-worker-0", "ej-worker-1"]  # made again: it asks to join the group
    set_phase(standin, "ej-worker-0", "Succeeded")
    standin.reconcile()
    assert last_condition(standin, "PyTorchJob", "ej")["type"] == "Succeeded"  # one worker done: the job is
    assert not standin.errors, standin.errors
