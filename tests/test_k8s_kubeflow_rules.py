"""What real Kubeflow accepts and how it runs what hpctrain renders (issue 31, items 1-11): each test re-expresses one
rule of the real projects, citing the source file and release it comes from, and checks the rendered objects (or
`check`) against it. The rules were read in kubeflow/training-operator v1.9.0 (v1.9.4 for the cleanPodPolicy change),
kubeflow/trainer v2.1.0, v2.2.1 and v2.3.0, and kubernetes-sigs/jobset v0.12.0. No Kubeflow controller runs here;
the conformance oracle (vendored CRDs with CEL, webhook validators) and the stand-ins' modelling live elsewhere in
tests/.
"""

from __future__ import annotations

import copy
import re
import threading
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpctrain.errors import UserError
from hpctrain.jobs.spec import JobSpec, Resources
from hpctrain.jobs.values import parse_time_limit
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions
from hpctrain.schedulers.kubernetes.manifests.render import container_command, render
from hpctrain.schedulers.kubernetes.scheduler import KubernetesScheduler
from hpctrain.schedulers.kubernetes.manifests.validate import unknown_fields, validate_manifest
from hpctrain.training.stopping import StopReason, StopRequest

IMAGE = "registry.example/hpctrain:1"


def job(nodes: int = 1, **kw: Any) -> JobSpec:
    if "time" in kw:  # as typed
        kw["time_limit_s"] = parse_time_limit(kw.pop("time"))
    return JobSpec(
        command=kw.pop("command", ("hpctrain", "train", "mnist")),
        name=kw.pop("name", "mnist"),
        resources=Resources(nodes=nodes, cpus_per_task=2, mem_bytes=4 << 30),
        **kw,
    )


def options(api: str = "pytorchjob", **kw: Any) -> KubernetesOptions:
    return KubernetesOptions(api=api, image=IMAGE, **kw)


def pod_specs(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Replica (or the TrainJob's runtime patch) -> its pod spec."""
    if manifest["kind"] == "PyTorchJob":
        return {k: v["template"]["spec"] for k, v in manifest["spec"]["pytorchReplicaSpecs"].items()}
    patch = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    return {"node": patch["template"]["spec"]["template"]["spec"]}


# ---- 1. runtimePatches[].manager ------------------------------------------------------------------------------------

# apimachinery IsDomainPrefixedPath (k8s.io/apimachinery/pkg/util/validation/field... validation.go): "HOST/PATH",
# HOST a DNS-1123 subdomain, PATH an HTTP path; Trainer's JobSet plugin applies it to every runtime patch's manager
# since v2.2.0 (kubeflow/trainer pkg/runtime/framework/plugins/jobset/jobset.go, Validate), under a failurePolicy:
# Fail webhook.
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_HTTP_PATH = re.compile(r"^[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$")


def is_domain_prefixed_path(value: str) -> bool:
    host, slash, path = value.partition("/")
    return bool(slash and host and path and len(host) <= 253 and _SUBDOMAIN.match(host) and _HTTP_PATH.match(path))


def test_the_runtime_patch_manager_is_a_domain_prefixed_path() -> None:
    assert not is_domain_prefixed_path("hpctrain") and is_domain_prefixed_path("acme.io/foo")  # the rule itself
    manifest = render(job(nodes=2, exclude_nodes=("gpu07",)), options("trainjob"))
    [patch] = manifest["spec"]["runtimePatches"]
    assert is_domain_prefixed_path(patch["manager"]), patch["manager"]


# ---- 2. cleanPodPolicy --------------------------------------------------------------------------------------------


def test_an_ended_pytorchjob_frees_its_pods_and_keeps_finished_ones() -> None:
    """The defaulter sets cleanPodPolicy None (training-operator v1.9, pkg/apis/kubeflow.org/v1/pytorch_defaults.go),
    which deletes nothing when the job ends (pkg/controller.v1/common/job.go): from v1.9.4 a job failed at its
    deadline or backoff limit keeps its OnFailure pods running on their GPUs. Running deletes the running and pending
    pods and keeps the Succeeded/Failed ones, whose logs stay readable."""
    for nodes in (1, 3):
        assert render(job(nodes=nodes), options())["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"


# ---- 3. backoffLimit: whole-job incidents ---------------------------------------------------------------------------


def past_backoff_limit(limit: int, restarts_per_running_pod: list[int]) -> bool:
    """training-operator v1.9.0 pkg/core/job.go PastBackoffLimit: the restart counts of every init and main container
    of every *running* pod of an OnFailure replica, summed; `> 0` for a limit of 0, else `>= limit`."""
    total = sum(restarts_per_running_pod)
    return total > 0 if limit == 0 else total >= limit


@pytest.mark.parametrize("nodes", [1, 2, 4, 16])
@pytest.mark.parametrize("max_restarts", [0, 1, 3])
def test_max_restarts_counts_incidents_that_restart_every_pod(nodes: int, max_restarts: int) -> None:
    limit = render(job(nodes=nodes, max_restarts=max_restarts), options())["spec"]["runPolicy"]["backoffLimit"]
    # N incidents, each restarting every pod once (one rank dies, the others' collectives fail): the job lives on ...
    assert not past_backoff_limit(limit, [max_restarts] * nodes)
    # ... and one more ends it.
    assert past_backoff_limit(limit, [max_restarts + 1] * nodes)


@pytest.mark.parametrize("nodes", [1, 4])
@pytest.mark.parametrize("max_restarts", [1, 3])
def test_trainjob_max_restarts_is_its_own_runtimes_jobset_restart_limit(nodes: int, max_restarts: int) -> None:
    """A TrainJob's --max-restarts N: the job runs on hpctrain's own TrainingRuntime, whose JobSet restarts the whole
    set on any failed pod (the node Job's backoffLimit 0, pods never restarted in place) while fewer than N restarts
    were made, and fails after (JobSet v0.12.0 pkg/controllers/failure_policy.go restartJobSetActionApplier:
    `RestartsCountTowardsMax >= MaxRestarts` fails the set): one incident, however many pods it took, costs one."""
    from hpctrain.schedulers.kubernetes.manifests.render import rendered
    from hpctrain.schedulers.kubernetes.manifests.runtime import own_runtime

    spec = job(nodes=nodes, max_restarts=max_restarts, command=("python", "train.py"))
    out = rendered(spec, options("trainjob", namespace="team-a"))
    runtime, trainjob = yaml.safe_load_all(out.text)
    assert runtime == own_runtime(spec, options("trainjob", namespace="team-a")) and trainjob == out.payload
    assert trainjob["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
        "name": "hpctrain-mnist",
    }
    assert runtime["metadata"] == {
        "name": "hpctrain-mnist",
        "namespace": "team-a",
        "labels": {
            "app.kubernetes.io/managed-by": "hpctrain",
            "hpctrain.io/job": "mnist",
            "trainer.kubeflow.org/framework": "torch",
        },
    }
    jobset = runtime["spec"]["template"]["spec"]
    assert jobset["failurePolicy"] == {"maxRestarts": max_restarts}
    node = jobset["replicatedJobs"][0]["template"]["spec"]
    assert (node["backoffLimit"], node["template"]["spec"]["restartPolicy"]) == (0, "Never")
    # Each attempt may train for --time: the backstop deadline grows with the budget, as a PyTorchJob's does.
    timed = render(spec.replace(time_limit_s=3600), options("trainjob"))
    assert timed["spec"]["activeDeadlineSeconds"] == 3600 * (max_restarts + 1) + 24 * 3600
    # Without a budget the job stays on the cluster's runtime, and the text is the TrainJob alone.
    plain = rendered(spec.replace(max_restarts=0), options("trainjob"))
    assert plain.payload["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime" and "---" not in plain.text
    with pytest.raises(
        UserError,
        match="--max-restarts runs a TrainJob on hpctrain's own TrainingRuntime .* not on "
        "--runtime torch-gpu: drop one of them",
    ):
        render(spec, options("trainjob", runtime="torch-gpu"))


def test_a_namespace_that_forbids_runtimes_is_said_with_the_way_out() -> None:
    """A shared cluster may let its users create TrainJobs but not TrainingRuntimes: the API server's 403 (a recorded
    answer) is one line naming --max-restarts, and no TrainJob is created."""
    from types import SimpleNamespace

    from kubernetes.client.rest import ApiException

    from hpctrain.schedulers.kubernetes.manifests.runtime import own_runtime, submit_with

    def forbidden(*args: Any) -> None:
        raise ApiException(status=403, reason="Forbidden")

    # No _create on it: a TrainJob create would fail the test with an AttributeError.
    sched = SimpleNamespace(namespace="team-a", custom=SimpleNamespace(create_namespaced_custom_object=forbidden))
    spec = job(max_restarts=1)
    with pytest.raises(
        UserError,
        match=r"^creating the TrainJob's own TrainingRuntime hpctrain-mnist \(its --max-restarts "
        r"budget\) in namespace team-a is forbidden \(403\): .* or drop --max-restarts",
    ):
        submit_with(sched, spec, own_runtime(spec, options("trainjob", namespace="team-a")), {"spec": {}})


# ---- 4. older Trainer releases: `check` reads the served schema ------------------------------------------------------


def _served_crd(drop: tuple[str, ...]) -> Any:
    """The TrainJob CRD as a cluster with an older Trainer serves it: hpctrain's vendored v2.3.0 copy less the fields
    that release lacks (kubeflow/trainer manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml at v2.1.0 has neither
    spec.runtimePatches nor spec.activeDeadlineSeconds; at v2.2.1 the patch's pod spec lacks
    terminationGracePeriodSeconds), as the API server's JSON."""
    text = (
        resources.files("hpctrain.schedulers.kubernetes")
        .joinpath("crds/trainer.kubeflow.org_trainjobs.yaml")
        .read_text()
    )
    crd = yaml.safe_load(text)
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    for field in drop:
        if field == "terminationGracePeriodSeconds":
            replicated = spec["runtimePatches"]["items"]["properties"]["trainingRuntimeSpec"]["properties"]["template"][
                "properties"
            ]["spec"]["properties"]["replicatedJobs"]["items"]["properties"]
            del replicated["template"]["properties"]["spec"]["properties"]["template"]["properties"]["spec"][
                "properties"
            ][field]
        else:
            del spec[field]
    crd["status"] = {"conditions": [{"type": "Established", "status": "True"}]}
    return crd


class _Raw:
    """Stands in for rest.RawApi (no API server): the served CRD, and any ClusterTrainingRuntime asked for."""

    def __init__(self, crd: dict[str, Any]) -> None:
        self.crd = crd

    def get(self, where: str, what: str, **query: Any) -> dict[str, Any]:
        if "/customresourcedefinitions/" in where:
            return self.crd
        return {"metadata": {"name": where.rsplit("/", 1)[-1]}}


def _crd_check(drop: tuple[str, ...], spec: JobSpec) -> list[str]:
    sched = KubernetesScheduler(options("trainjob"))
    sched.__dict__["raw"] = _Raw(_served_crd(drop))  # no API server: a stub
    return sched._crd_problems(sched.render(spec).payload)


@pytest.mark.parametrize(
    "drop,spec,release",
    [
        (("runtimePatches", "activeDeadlineSeconds"), job(), "Kubeflow Trainer v2.2.0 or later"),  # v2.0.x / v2.1.x
        (("activeDeadlineSeconds",), job(time="01:00:00"), "Kubeflow Trainer v2.2.0 or later"),
        (("terminationGracePeriodSeconds",), job(), "Kubeflow Trainer v2.3.0 or later"),  # v2.2.x
    ],
)
def test_check_refuses_a_trainjob_whose_fields_the_clusters_trainer_would_drop(drop, spec, release) -> None:
    [line] = _crd_check(drop, spec)
    assert line.startswith("the cluster's TrainJob CRD (trainjobs.trainer.kubeflow.org) has no field spec."), line
    assert f"the job needs {release}; ask the admin to upgrade" in line


def test_check_accepts_a_trainjob_the_served_schema_holds() -> None:
    assert _crd_check((), job(time="01:00:00")) == []
    # a job without --time renders no activeDeadlineSeconds: a release without it is enough for that part
    assert _crd_check(("activeDeadlineSeconds",), job()) == []


def test_unknown_fields_follow_the_schema() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "integer"}}},
            "l": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "string"}}}},
            "m": {"type": "object", "additionalProperties": {"type": "string"}},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "meta": {"type": "object"},
        },
    }
    manifest = {
        "a": {"b": 1, "c": 2},
        "l": [{"x": "1"}, {"y": "2"}],
        "m": {"k": "v"},
        "free": {"z": 1},
        "meta": {"name": "n"},
        "top": 1,
    }
    assert unknown_fields(manifest, schema) == ["a.c", "l[1].y", "top"]


def test_submit_asks_the_api_server_for_strict_field_validation() -> None:
    """fieldValidation=Strict (Kubernetes 1.25+) makes a field the cluster's CRD lacks an error, not a silent loss.
    The local API server (1.20) predates it and ignores the parameter, so this records the call (test_k8s_live.py
    creates jobs on the real server with it)."""
    calls: list[dict[str, Any]] = []

    class Custom:
        def create_namespaced_custom_object(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            calls.append(kwargs)
            return {"metadata": {"name": args[-1]["metadata"]["name"]}}

    sched = KubernetesScheduler(options())
    sched.__dict__["custom"] = Custom()
    spec = job()
    assert sched.submit(spec, sched.render(spec)) == "mnist"
    assert calls == [{"field_validation": "Strict"}]


# ---- 5./6. job names ------------------------------------------------------------------------------------------------


def jobset_pod_name_ok(name: str, num_nodes: int) -> bool:
    """kubernetes-sigs/jobset v0.12.0 pkg/webhooks/jobset_webhook.go: for an indexed replicated job, GenPodName(
    jobset, rjob, replicas - 1, completions - 1) + "-abcde" must be a DNS-1035 label (<= 63). Trainer's
    torch-distributed runtime has one replicated job `node` (replicas 1) with completions = numNodes."""
    return len(f"{name}-node-0-{num_nodes - 1}-abcde") <= 63


@pytest.mark.parametrize("nodes", [1, 10, 11, 100])
def test_trainjob_names_are_refused_where_jobsets_webhook_would_refuse_the_pod_names(nodes: int) -> None:
    longest = max(n for n in range(1, 64) if jobset_pod_name_ok("a" * n, nodes))
    assert longest < 50  # 49 and 50 used to pass hpctrain
    render(job(nodes=nodes, name="a" * longest), options("trainjob"))
    with pytest.raises(UserError) as err:
        render(job(nodes=nodes, name="a" * (longest + 1)), options("trainjob"))
    assert str(err.value).endswith(f"characters, at most 63 allowed): use at most {longest}")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("nodes", [1, 2, 12])
def test_pytorchjob_names_are_refused_where_a_replica_name_would_exceed_63(nodes: int) -> None:
    """training-operator v1 names each replica's pod and Service JOB-master-0 / JOB-worker-INDEX, and a Service name
    must be a DNS-1035 label (<= 63)."""
    longest = 63 - len("-master-0") if nodes == 1 else 63 - len(f"-worker-{nodes - 2}")
    render(job(nodes=nodes, name="a" * longest), options())
    with pytest.raises(UserError, match=f"use at most {longest}$"):
        render(job(nodes=nodes, name="a" * (longest + 1)), options())


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_a_name_starting_with_a_digit_is_refused(api: str) -> None:
    """PyTorchJob: the webhook's NameIsDNS1035Label (training-operator v1.9.0
    pkg/webhooks/pytorch/pytorchjob_webhook.go); TrainJob: the CRD's CEL rule
    self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') (Trainer v2.3.0)."""
    with pytest.raises(UserError, match=r"--job-name '1run' is not a valid Kubeflow job name .*starting with a letter"):
        render(job(name="1run"), options(api))


# ---- 7. the operator's init container ------------------------------------------------------------------------------


def test_workers_wait_for_the_master_in_their_own_init_container() -> None:
    """training-operator v1.9.0 pkg/controller.v1/pytorch/initcontainer.go appends `init-pytorch` to every Worker pod:
    `nslookup JOB-master-0` at most --pytorch-init-container-max-tries (100) times, 2 s apart, then exit 1; a failed
    init container restarts, and pkg/core/job.go PastBackoffLimit counts init containers' restarts once the pod runs.
    An init container of ours, placed before it, waits as long as the job's time limit (an hour without one), so
    theirs resolves the name at once; it gives up then, saying what it waited for (issue 39 §12)."""
    manifest = render(job(nodes=3), options())
    specs = pod_specs(manifest)
    assert "initContainers" not in specs["Master"]  # the master must not wait for itself
    [init] = specs["Worker"]["initContainers"]
    assert init["name"] == "wait-for-master" and init["image"] == IMAGE
    assert init["command"][:2] == ["python3", "-c"] and init["command"][3:] == ["mnist-master-0", "3600"]
    [timed] = pod_specs(render(job(nodes=3, time="04:00:00"), options()))["Worker"]["initContainers"]
    assert timed["command"][3:] == ["mnist-master-0", "14400"]
    assert "mnist" not in init["command"][2]  # the name is an argument, never code
    assert init["resources"]["requests"] == init["resources"]["limits"]
    assert validate_manifest(manifest) == []
    assert (
        "initContainers"
        not in render(job(nodes=1), options())["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    )


def test_the_wait_for_master_code_resolves_and_waits() -> None:
    """The init container's program, run here: it ends once the name resolves (localhost does)."""
    import subprocess
    import sys

    [init] = pod_specs(render(job(nodes=2), options()))["Worker"]["initContainers"]
    code = init["command"][2]
    done = subprocess.run([sys.executable, "-c", code, "localhost", "60"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == ""
    # a name that never resolves: it waits, says for what, and gives up at its deadline (here 1 s), saying so
    gave_up = subprocess.run(
        [sys.executable, "-c", code, "mnist-master-0.invalid", "1"], capture_output=True, text=True, timeout=60
    )
    assert gave_up.returncode == 1 and gave_up.stdout.splitlines() == [
        "hpctrain: waiting for the master pod mnist-master-0.invalid to have a name (at most 1 s)",
        "hpctrain: gave up after 1 s waiting for the master pod mnist-master-0.invalid to have a name: it never "
        "started (see hpctrain status) or its Service is missing",
    ]


# ---- 8. --time: the job's own timer, and a backstop deadline --------------------------------------------------------


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_time_is_training_time_with_a_warning_and_the_deadline_only_a_backstop(api: str) -> None:
    manifest = render(job(nodes=2, time="04:00:00", signal_grace=300), options(api))
    env = {
        e["name"]: e.get("value")
        for e in (
            manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
            if api == "pytorchjob"
            else manifest["spec"]["trainer"]["env"]
        )
    }
    assert (env["HPCTRAIN_TIME_LIMIT_S"], env["HPCTRAIN_TIME_WARNING_S"]) == ("14400", "300")
    # PyTorchJob counts activeDeadlineSeconds from status.startTime (set at the first reconcile, before scheduling),
    # a TrainJob from its creation: either way queue time is in it, so the deadline leaves a day for the queue.
    deadline = (manifest["spec"]["runPolicy"] if api == "pytorchjob" else manifest["spec"])["activeDeadlineSeconds"]
    assert deadline == 14400 + 24 * 3600


def test_the_backstop_deadline_leaves_each_allowed_attempt_its_time() -> None:
    manifest = render(job(nodes=2, time="01:00:00", max_restarts=2), options())
    assert manifest["spec"]["runPolicy"]["activeDeadlineSeconds"] == 3 * 3600 + 24 * 3600


def _wait_for(predicate, limit_s: float = 30.0) -> bool:
    event = threading.Event()
    for _ in range(int(limit_s * 20)):
        if predicate():
            return True
        event.wait(0.05)
    return predicate()


def test_the_jobs_own_timer_asks_for_a_checkpoint_and_stop_before_the_limit(capfd) -> None:
    import time

    stop = StopRequest()
    env = {"HPCTRAIN_TIME_LIMIT_S": "3600", "HPCTRAIN_TIME_WARNING_S": "120"}
    try:
        # a process that started 3480 s ago has reached its warning: the stop request comes at once
        assert stop.arm_time_limit(env, started=time.time() - 3480) == 0.0
        assert _wait_for(lambda: stop.reason is StopReason.PREEMPTED)
    finally:
        stop.uninstall()
    assert (
        "hpctrain: the time limit (3600 s of training, HPCTRAIN_TIME_LIMIT_S) ends in 120 s: checkpointing and stopping"
        in capfd.readouterr().err
    )
    later = StopRequest()
    try:
        delay = later.arm_time_limit(env, started=time.time())
        assert delay is not None and 3400 < delay <= 3480  # armed for the warning, not the end
        assert later.reason is StopReason.NONE
    finally:
        later.uninstall()
    assert later._timer is None  # uninstall disarms it
    for quiet in (
        {},
        {"HPCTRAIN_TIME_LIMIT_S": "3600", "HPCTRAIN_TIME_WARNING_S": "0"},
    ):
        assert StopRequest().arm_time_limit(quiet) is None  # no limit, or --signal-grace 0: no warning, as on Slurm


REFUSED_TIME_LIMITS = {
    "not a number": ({"HPCTRAIN_TIME_LIMIT_S": "abc"}, "HPCTRAIN_TIME_LIMIT_S='abc' is not a number of seconds"),
    "negative": ({"HPCTRAIN_TIME_LIMIT_S": "-5"}, "HPCTRAIN_TIME_LIMIT_S='-5' is not a number of seconds"),
    "zero": ({"HPCTRAIN_TIME_LIMIT_S": "0"}, "HPCTRAIN_TIME_LIMIT_S=0: a time limit of no time"),
    "past threading's maximum": (
        {"HPCTRAIN_TIME_LIMIT_S": str(int(threading.TIMEOUT_MAX) * 4), "HPCTRAIN_TIME_WARNING_S": "60"},
        "is more seconds than a timer can wait",
    ),
    "infinite": ({"HPCTRAIN_TIME_LIMIT_S": "1e999"}, "is more seconds than a timer can wait"),
    "a warning as long as the limit": (
        {"HPCTRAIN_TIME_LIMIT_S": "600", "HPCTRAIN_TIME_WARNING_S": "600"},
        "HPCTRAIN_TIME_WARNING_S=600 is not shorter than HPCTRAIN_TIME_LIMIT_S=600",
    ),
    "a warning that is not a number": (
        {"HPCTRAIN_TIME_LIMIT_S": "600", "HPCTRAIN_TIME_WARNING_S": "soon"},
        "HPCTRAIN_TIME_WARNING_S='soon' is not a number of seconds",
    ),
}


@pytest.mark.parametrize("how", list(REFUSED_TIME_LIMITS))
def test_a_time_limit_the_timer_cannot_take_is_refused_in_one_line_not_ignored(how: str) -> None:
    """Issue 39, item 8: past threading.TIMEOUT_MAX the timer's thread died (OverflowError) and no warning ever came;
    `abc` armed no timer and said nothing; a warning as long as the limit checkpointed and stopped at every start."""
    environ, expected = REFUSED_TIME_LIMITS[how]
    stop = StopRequest()
    with pytest.raises(UserError, match=re.escape(expected)) as refused:
        stop.arm_time_limit(environ)
    assert "\n" not in str(refused.value) and stop._timer is None


def test_a_time_limit_written_as_a_decimal_number_arms_the_timer() -> None:
    """`1e3` seconds is a time limit (it used to arm nothing, silently)."""
    import time

    stop = StopRequest()
    try:
        delay = stop.arm_time_limit({"HPCTRAIN_TIME_LIMIT_S": "1e3", "HPCTRAIN_TIME_WARNING_S": "60.5"}, time.time())
        assert delay is not None and 900 < delay <= 939.5
    finally:
        stop.uninstall()


def test_train_refuses_a_bad_time_limit_before_anything_starts(tmp_path: Path) -> None:
    from training_helpers import hpctrain

    result = hpctrain(
        "train",
        "mnist",
        "--threads",
        "1",
        "--run-dir",
        str(tmp_path / "run"),
        env={"HPCTRAIN_TIME_LIMIT_S": "3600", "HPCTRAIN_TIME_WARNING_S": "7200"},
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("hpctrain train: error: HPCTRAIN_TIME_WARNING_S=7200 is not shorter than"), line
    assert not (tmp_path / "run").exists()


# ---- 9. --exclude-nodes ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
def test_excluded_nodes_are_matched_by_node_name_not_a_label(api: str) -> None:
    long_name = "ip-10-0-12-34.eu-west-1.compute.internal.example-cluster-with-a-long-name"  # > 63: no label value
    manifest = render(job(nodes=2, exclude_nodes=(long_name,)), options(api))
    for spec in pod_specs(manifest).values():
        [term] = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert term == {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [long_name]}]}


# ---- 10. --run-dir DIR/%j -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("form", [("--run-dir", "/mnt/runs/%j"), ("--run-dir=/mnt/runs/%j",)])
def test_a_recipes_run_dir_is_expanded_in_the_command(api: str, form: tuple[str, ...]) -> None:
    spec = job(
        nodes=2, name="mnist-7", command=("hpctrain", "train", "mnist", *form, "--epochs", "1"), run_dir="/mnt/runs/%j"
    )
    command = container_command(spec, options(api))
    assert "%j" not in " ".join(command)
    expanded = ["--run-dir", "/mnt/runs/mnist-7"] if len(form) == 2 else ["--run-dir=/mnt/runs/mnist-7"]
    assert command[command.index("mnist") + 1 :] == [*expanded, "--epochs", "1"]
    # a user's own command is passed as given (Slurm's renderer expands %j only in a recipe's --run-dir too)
    own = job(command=("python", "train.py", "--out", "/mnt/runs/%j"), run_dir="/mnt/runs/%j")
    assert container_command(own, options(api))[-1] == "/mnt/runs/%j"


# ---- 11. params file priority=N -------------------------------------------------------------------------------------


class _PriorityClasses:
    """Stands in for rest.RawApi: the PriorityClasses, as the API server's JSON."""

    def __init__(self, classes: dict[str, int]) -> None:
        self.items = [{"metadata": {"name": n}, "value": v} for n, v in classes.items()]

    def list(self, where: str, what: str, **query: Any) -> list[dict[str, Any]]:
        assert where == "/apis/scheduling.k8s.io/v1/priorityclasses", where
        return self.items


def _priority_check(classes: dict[str, int], **kw: Any) -> list[str]:
    sched = KubernetesScheduler(options(**kw))
    sched.__dict__["raw"] = _PriorityClasses(classes)  # test_k8s_live.py asks the real API server
    return sched._priority_problems()


def test_a_params_priority_is_a_label_and_check_names_the_clusters_priority_classes() -> None:
    from hpctrain.schedulers.kubernetes.manifests.params import parse_params_text

    _, opts = parse_params_text("priority=3\n")
    [line] = _priority_check({"batch-low": 10, "batch-high": 1000}, **opts)
    assert line == (
        "warning: priority=3 (the params file) is only the label hpctrain.io/priority: it does not change "
        "scheduling; to schedule by priority add --priority-class NAME (this cluster has: batch-high (1000), "
        "batch-low (10))"
    )
    assert _priority_check({"batch-low": 10}, **opts, priority_class="batch-low") == []
    [refused] = _priority_check({"batch-low": 10}, priority_class="urgent")
    assert refused == (
        "PriorityClass 'urgent' does not exist (the cluster has: batch-low (10)): the API server would "
        "refuse every pod of the job; pick one of these with --priority-class"
    )
    assert _priority_check({}) == []


def test_master_and_worker_templates_differ_only_by_the_init_container() -> None:
    """The Worker template is the Master's plus the init container (the Master must not wait for itself)."""
    manifest = render(job(nodes=2), options())
    master, worker = (copy.deepcopy(s) for s in pod_specs(manifest).values())
    worker.pop("initContainers")
    assert master == worker
