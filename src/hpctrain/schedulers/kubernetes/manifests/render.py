"""Render a JobSpec as a Kubeflow PyTorchJob (kubeflow.org/v1) or Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1).

Pure: the manifest depends only on the JobSpec and the KubernetesOptions, never on a cluster, a clock or this
machine. What Kubernetes cannot express (--mem 0) is a UserError naming the Kubernetes way; Slurm's own fields
(shards, a GPU type, a software environment) are SlurmOptions' and never reach this backend.

Mapping (one pod per --nodes; the pod runs --nproc-per-node processes):
  resources       requests = limits: cpu = cpus_per_task x nproc_per_node, memory = --mem, nvidia.com/gpu =
                  --gpus-per-node (a Guaranteed pod with --mem, except a PyTorchJob worker: see INIT below)
  --time          training time per attempt, as on Slurm: HPCTRAIN_TIME_LIMIT_S and HPCTRAIN_TIME_WARNING_S (=
                  --signal-grace) tell the job's own timer (hpctrain.training.stopping) when to checkpoint and stop;
                  activeDeadlineSeconds is only a backstop (backstop_deadline_s), with room for the queue
  --max-restarts  N whole-job incidents: runPolicy.backoffLimit N x pods + 1 (PyTorchJob; 0 for 0; restart_budget);
                  a TrainJob runs on hpctrain's own TrainingRuntime with JobSet failurePolicy.maxRestarts N (runtime.py)
  --signal-grace  terminationGracePeriodSeconds: the time a pod has after SIGTERM (cancel, eviction) to checkpoint
  --shm           an emptyDir with medium Memory at /dev/shm (the container default of 64M kills DataLoader
                  workers with "Bus error")
  --run-dir       HPCTRAIN_RUN_DIR (%j becomes the job name); it must lie on a volume every replica mounts

Restarts. Exit status 75 is hpctrain's "preempted, resume me" (EX_TEMPFAIL); 143 is SIGTERM (a pod eviction or
a cancel). Kubeflow's restartPolicy ExitCode treats only exit codes >= 128 as retryable and 1-127 as permanent
(training-operator v1.x, pkg/util/train/train_util.go: IsRetryableExitCode returns exitCode >= 128), so it
would end a preempted job (75) for good. We therefore render restartPolicy OnFailure: every non-zero exit
restarts the replica, within backoffLimit (restart_budget), and the restarted process resumes from the newest
checkpoint in the run directory. The price: a bad argument (exit 2) is retried too, until the budget is spent; that
budget is --max-restarts (default 0: the job fails at the first restart). An evicted pod (preemption) is made
again by the controller, a new pod with no restarts, so it costs nothing.

Processes. A pod runs the command once. `hpctrain ...` commands fan out themselves: they read RANK, WORLD_SIZE
and PET_NPROC_PER_NODE (PyTorchJob) and start the local workers (hpctrain.distributed.kubeflow_node_plan).
Other commands with several processes per pod, and every multi-process TrainJob (whose runtime sets only the
PET_* variables), run under `torchrun --no-python`, which takes --nnodes, --nproc-per-node, --node-rank and the
master address from the PET_* variables Kubeflow sets.

Ended jobs. runPolicy.cleanPodPolicy Running: when a PyTorchJob ends (succeeded, failed, past its backoffLimit or
activeDeadlineSeconds) the controller deletes its running and pending pods, so nothing keeps a GPU, and keeps the
Succeeded/Failed ones, whose logs stay readable (training-operator v1.9, pkg/controller.v1/common/job.go
DeletePodsAndServices; the defaulter's None, pkg/apis/kubeflow.org/v1/pytorch_defaults.go, deletes nothing, and from
v1.9.4 a job failed at its deadline or backoff limit is left with its OnFailure pods running on their GPUs). The
pods of a job that failed at its backoff limit are restarting in place, so they are running and go, logs and all, as
every pod of such a job did up to v1.9.3 whatever the policy (ReconcileJobs deleted them before the job was marked
Failed, when DeletePodsAndServices ignores the policy): `status` then knows no exit status.

Logs. Since pods and their logs can go with the job, each replica's output is kept where it outlives them: with a
run directory the command runs under replica_logs.KEEP_LOG, which appends it to RUN_DIR/pod-logs/HOST.log as well
as the container's log, and the training container's terminationMessagePolicy FallbackToLogsOnError keeps a failed
container's last lines in its pod's status (replica_logs.py).

INIT. training-operator v1 adds an init container `init-pytorch` to every Worker pod (pkg/controller.v1/pytorch/
initcontainer.go, v1.7-v1.9): the operator's --pytorch-init-container-image (default alpine:3.10), requests below its
limits (so the worker pod is Burstable), looping `nslookup JOB-master-0` --pytorch-init-container-max-tries times (100,
about 200 s), then failing. A failed init container restarts, and once the pod runs its restarts count in the backoff
limit (pkg/core/job.go PastBackoffLimit sums init and main containers of running pods), so a worker that waits longer
for a master still Pending would fail a job with --max-restarts 0. hpctrain's worker template therefore starts with
its own init container `wait-for-master` (the job's image, requests = limits) that waits for the master's name as
long as the job's time limit (MASTER_WAIT_S without one) and then says what it waited for; the operator's then
resolves it at its first try.
"""

from __future__ import annotations

import os
from typing import Any

import yaml

from hpctrain import program_text
from hpctrain.distributed.probes import AUTO_RESUME_VAR
from hpctrain.errors import UserError
from hpctrain.health.preflight import NODE_NAME_ENV
from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers.base import Rendered
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions, check_dns1035_label, check_dns_subdomain
from hpctrain.schedulers.kubernetes.manifests.pod_template import pod_extras, pod_volumes, resources_per_pod
from hpctrain.schedulers.kubernetes.manifests.ranges import check_integers
from hpctrain.schedulers.kubernetes.queries.replica_logs import keep_log
from hpctrain.schedulers.kubernetes.manifests.runtime import own_runtime, runtime_name
from hpctrain.stops import TIME_LIMIT_ENV, TIME_WARNING_ENV

PYTORCHJOB_API = ("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
TRAINJOB_API = ("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob")
MANAGED_BY = {"app.kubernetes.io/managed-by": "hpctrain"}
CONTAINER_PYTORCHJOB = "pytorch"  # the PyTorchJob controller finds the training container by this name
CONTAINER_TRAINJOB = "node"  # the torch-distributed runtime's replicated job and container are called `node`
# A failed container's termination message is the end of its log unless it wrote one (hpctrain's preflight does):
# the last lines outlive the container, as long as the pod (replica_logs.py).
TERMINATION_MESSAGE_POLICY = "FallbackToLogsOnError"
RESTART_POLICY = "OnFailure"  # see the module docstring: ExitCode would treat exit 75 as permanent
CLEAN_POD_POLICY = "Running"  # see the module docstring: frees the GPUs of an ended job, keeps its logs
# Trainer's JobSet plugin refuses a runtime patch whose manager is not a domain-prefixed path such as acme.io/foo
# (kubeflow/trainer v2.2.0+, pkg/runtime/framework/plugins/jobset/jobset.go: validation.IsDomainPrefixedPath).
PATCH_MANAGER = "hpctrain.io/hpctrain"
QUEUE_SLACK_S = 24 * 3600  # the backstop deadline's room for queueing (PyTorchJob: from the first reconcile)
INIT_CONTAINER = "wait-for-master"
INIT_RESOURCES = {"cpu": "100m", "memory": "64Mi"}
# Waits until the master's name (argv[1]) resolves: a Python every training image has, and no shell, so the job name
# is an argument, never code. A program of its own, programs/wait_for_master.py (ruff checks it), less its comments.
WAIT_FOR_MASTER = program_text.without_comments(program_text.template(__package__, "wait_for_master.py"))
MASTER_WAIT_S = 3600
"""How long a worker's init container waits for the master's name when the job has no time limit (with one: that
limit, since a job that waited it out could not have run anyway)."""
# The longest names Kubeflow derives from a job's name must stay DNS labels (at most 63 characters):
# PyTorchJob: pods and Services JOB-master-0, JOB-worker-N (training-operator v1, common/util replica names);
# TrainJob: JobSet's webhook checks JOB-node-0-<numNodes - 1> plus a 5-character random suffix (kubernetes-sigs/jobset
# v0.12.0, pkg/webhooks/jobset_webhook.go, placement.GenPodName + "-abcde").
MAX_NAME = 63


def api_of(options: KubernetesOptions) -> tuple[str, str, str, str]:
    """(group, version, plural, kind) of the custom resource the options ask for."""
    return PYTORCHJOB_API if options.api == "pytorchjob" else TRAINJOB_API


def render(job: JobSpec, options: KubernetesOptions) -> dict[str, Any]:
    """The manifest for `job`, as plain data."""
    _check_expressible(job, options)
    return _pytorchjob(job, options) if options.api == "pytorchjob" else _trainjob(job, options)


class _Dumper(yaml.SafeDumper):
    """Writes shared sub-trees (the Master and Worker template) out in full, without YAML anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render_yaml(manifest: dict[str, Any]) -> str:
    return yaml.dump(manifest, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)


def rendered(job: JobSpec, options: KubernetesOptions) -> Rendered:
    """The manifest; a TrainJob with --max-restarts has its own TrainingRuntime first in the text (runtime.py). Each
    whole number in them fits its field (ranges.py), or nothing is created."""
    manifest = render(job, options)
    runtime = own_runtime(job, options)
    for obj in (manifest, runtime or {}):
        check_integers(obj)
    text = render_yaml(manifest) if runtime is None else render_yaml(runtime) + "---\n" + render_yaml(manifest)
    return Rendered(text=text, filename=f"{manifest['kind'].lower()}.yaml", payload=manifest)


def run_dir(job: JobSpec) -> str | None:
    """The run directory as the pods see it: %j (Slurm's job id) becomes the job name, unique in its namespace."""
    return None if job.run_dir is None else job.run_dir.replace("%j", job.name)


def is_hpctrain_command(command: tuple[str, ...]) -> bool:
    """`hpctrain ...` or `PYTHON -m hpctrain ...`: a command that starts its own local workers."""
    return os.path.basename(command[0]) == "hpctrain" or tuple(command[1:3]) == ("-m", "hpctrain")


def container_command(job: JobSpec, options: KubernetesOptions) -> list[str]:
    r = job.resources
    if options.api == "pytorchjob" and r.elastic:
        wrap = True  # an elastic pod gets only torchrun's PET_* (rendezvous, MIN:MAX), no RANK or WORLD_SIZE
    elif options.api == "pytorchjob":
        wrap = r.nproc_per_node > 1 and not is_hpctrain_command(job.command)
    else:
        wrap = r.nodes * r.nproc_per_node > 1
    return (["torchrun", "--no-python"] if wrap else []) + _recipe_command(job)


def _recipe_command(job: JobSpec) -> list[str]:
    """The command, with a recipe's --run-dir expanded as the pods see it (%j: the job name), as the Slurm renderer
    expands it to the job id: the recipe then trains where HPCTRAIN_RUN_DIR, `status` and resubmission look."""
    command = list(job.command)
    directory = run_dir(job)
    if not job.is_recipe or directory is None:
        return command
    out = command[:2]
    args = iter(command[2:])
    for arg in args:
        if arg == "--run-dir":
            out += [arg, directory]
            next(args, None)
        elif arg.startswith("--run-dir="):
            out.append(f"--run-dir={directory}")
        else:
            out.append(arg)
    return out


def _check_expressible(job: JobSpec, options: KubernetesOptions) -> None:
    # PyTorchJob: the webhook's NameIsDNS1035Label (training-operator v1.9, pkg/webhooks/pytorch/pytorchjob_webhook.go);
    # TrainJob: the CRD's CEL rule `self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')` (Trainer v2.3.0).
    check_dns1035_label("--job-name", job.name, "pick a name such as mnist-run-1")
    for node in job.exclude_nodes:  # the API server takes only a Node's name (a DNS subdomain) in a node affinity
        check_dns_subdomain(
            "--exclude-nodes", node, "Kubernetes node names are lower-case; give them as `kubectl get nodes` shows them"
        )
    longest = longest_derived_name(job.name, options.api, job.resources.nodes, job.resources.elastic)
    if len(longest) > MAX_NAME:
        limit = len(job.name) - (len(longest) - MAX_NAME)
        raise UserError(
            f"--job-name {job.name!r} is {len(job.name)} characters; Kubeflow names this job's pods like "
            f"{longest} ({len(longest)} characters, at most {MAX_NAME} allowed): use at most {limit}"
        )
    if options.image is None:
        raise UserError(
            "Kubernetes runs every replica in a container: give --image (an image with PyTorch and hpctrain)"
        )
    r = job.resources
    if r.mem_bytes == 0:
        raise UserError("--mem 0 (a whole node's memory) has no Kubernetes form: give a size, e.g. --mem 64G")
    if r.gpus_per_node and r.nproc_per_node != r.gpus_per_node:
        raise UserError(
            f"--nproc-per-node {r.nproc_per_node} does not match --gpus-per-node {r.gpus_per_node}: "
            f"DDP wants one process per GPU, so set --nproc-per-node {r.gpus_per_node}"
        )
    if r.elastic and not job.max_restarts:
        raise UserError(
            f"--nodes {r.node_range} continues after a lost pod by restarting torchrun's worker group: give the "
            "budget of such membership changes with --max-restarts N (e.g. --max-restarts 3)"
        )
    if options.api == "trainjob":
        if r.elastic:
            raise UserError(
                f"--nodes {r.node_range}: a TrainJob (Trainer v2.3) has no elastic policy; use --k8s-api pytorchjob "
                f"(its elasticPolicy), or a fixed --nodes {r.nodes}"
            )
        if options.priority_class is not None:
            raise UserError(
                "a TrainJob (Trainer v2.3) has no per-job priority class: set it in the runtime, "
                "or use --k8s-api pytorchjob"
            )
        if job.max_restarts and options.runtime != KubernetesOptions.runtime:
            raise UserError(
                f"--max-restarts runs a TrainJob on hpctrain's own TrainingRuntime (the restart budget is "
                f"the runtime's), not on --runtime {options.runtime}: drop one of them"
            )
        reserved = sorted(k for k, _ in job.env if k.startswith("PET_"))
        if reserved:
            raise UserError(
                f"--setenv {', '.join(reserved)}: PET_* variables are set by the Trainer runtime; drop them"
            )
    elif options.runtime != KubernetesOptions.runtime:
        raise UserError(
            f"--runtime {options.runtime} (runtime in a job file) names a TrainJob's ClusterTrainingRuntime; "
            "a PyTorchJob has none: drop it, or use --k8s-api trainjob"
        )


def longest_derived_name(name: str, api: str, nodes: int, elastic: bool = False) -> str:
    """The longest pod or Service name Kubeflow derives from the job name (see MAX_NAME)."""
    if api == "pytorchjob" and elastic:
        return f"{name}-worker-{nodes - 1}"  # workers only: see _pytorchjob
    if api == "pytorchjob":
        return f"{name}-worker-{nodes - 2}" if nodes > 1 else f"{name}-master-0"
    return f"{name}-{CONTAINER_TRAINJOB}-0-{nodes - 1}-xxxxx"  # xxxxx: the pod name's random suffix


def restart_budget(job: JobSpec) -> int:
    """runPolicy.backoffLimit for --max-restarts N whole-job incidents. training-operator v1 compares the limit
    with the restart counts summed over every container of every running pod and fails the job when the sum *reaches*
    it (v1.9, pkg/core/job.go PastBackoffLimit: `result >= backoffLimit`, `> 0` for 0). One incident (a rank dies,
    the others' collectives fail) restarts every pod once: N incidents are N x pods restarts, which must stay below
    the limit. An incident that restarts fewer pods costs less, so at least N incidents fit."""
    return job.max_restarts * job.resources.nodes + 1 if job.max_restarts else 0


def backstop_deadline_s(job: JobSpec) -> int | None:
    """activeDeadlineSeconds: a backstop behind the job's own timer, never the time limit itself. Kubernetes counts
    it from the job's start (PyTorchJob: status.startTime, set at the first reconcile, before any pod is scheduled;
    TrainJob: its creation), queueing included; each attempt (the first and one per allowed restart) may train for
    --time, and QUEUE_SLACK_S leaves room for the queue."""
    if job.time_limit_s is None:
        return None
    return job.time_limit_s * (job.max_restarts + 1) + QUEUE_SLACK_S


def _env(job: JobSpec) -> list[dict[str, Any]]:
    env = [{"name": k, "value": v} for k, v in job.env]
    directory = run_dir(job)
    if directory is not None:
        env.append({"name": "HPCTRAIN_RUN_DIR", "value": directory})
    # A container restarted in place (restartPolicy OnFailure) is told nothing: let it resume from its checkpoint.
    env.append({"name": AUTO_RESUME_VAR, "value": "1"})
    # The pod's host name is the pod's own: the preflight names a sick node by this (what --exclude-nodes takes).
    env.append({"name": NODE_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    if job.time_limit_s is not None:  # the job's own timer: warn --signal-grace before the end of --time
        env.append({"name": TIME_LIMIT_ENV, "value": str(job.time_limit_s)})
        env.append({"name": TIME_WARNING_ENV, "value": str(job.signal_grace)})
    return env


def _metadata(job: JobSpec, options: KubernetesOptions) -> dict[str, Any]:
    return {"name": job.name, "namespace": options.namespace, "labels": {**MANAGED_BY, **options.label_map}}


def _pytorchjob(job: JobSpec, options: KubernetesOptions) -> dict[str, Any]:
    r = job.resources
    group, version, _, kind = PYTORCHJOB_API
    volumes, mounts = pod_volumes(options)
    container: dict[str, Any] = {
        "name": CONTAINER_PYTORCHJOB,
        "image": options.image,
        "command": keep_log(container_command(job, options), run_dir(job)),
        "resources": {"requests": resources_per_pod(job), "limits": resources_per_pod(job)},
        "terminationMessagePolicy": TERMINATION_MESSAGE_POLICY,
    }
    env = _env(job)
    if env:
        container["env"] = env
    if mounts:
        container["volumeMounts"] = mounts
    pod_spec: dict[str, Any] = {"containers": [container], **pod_extras(job, options)}
    if volumes:
        pod_spec["volumes"] = volumes
    if options.priority_class:
        pod_spec["priorityClassName"] = options.priority_class
    template = {"metadata": {"labels": {**MANAGED_BY, **options.label_map}}, "spec": pod_spec}
    replicas = {"Master": {"replicas": 1, "restartPolicy": RESTART_POLICY, "template": template}}
    elastic: dict[str, Any] = {}
    if r.elastic:
        # Workers only, as training-operator's elastic examples: every pod runs torchrun with PET_NNODES MIN:MAX
        # and the c10d rendezvous at JOB-worker-0 (v1.9 pkg/controller.v1/pytorch/elastic.go); a lost pod's
        # survivors re-form without it within maxRestarts, and the controller makes the pod again.
        replicas = {"Worker": {"replicas": r.nodes, "restartPolicy": RESTART_POLICY, "template": template}}
        elastic = {
            "elasticPolicy": {
                "minReplicas": r.min_nodes,
                "maxReplicas": r.nodes,
                "maxRestarts": job.max_restarts,
                "rdzvBackend": "c10d",
            }
        }
    elif r.nodes > 1:
        worker = {
            "metadata": template["metadata"],
            "spec": {"initContainers": [_wait_for_master(job, options)], **pod_spec},
        }
        replicas["Worker"] = {"replicas": r.nodes - 1, "restartPolicy": RESTART_POLICY, "template": worker}
    run_policy: dict[str, Any] = {"cleanPodPolicy": CLEAN_POD_POLICY, "backoffLimit": restart_budget(job)}
    deadline = backstop_deadline_s(job)
    if deadline is not None:
        run_policy["activeDeadlineSeconds"] = deadline
    return {
        "apiVersion": f"{group}/{version}",
        "kind": kind,
        "metadata": _metadata(job, options),
        "spec": {
            **elastic,
            "nprocPerNode": str(r.nproc_per_node),
            "runPolicy": run_policy,
            "pytorchReplicaSpecs": replicas,
        },
    }


def _wait_for_master(job: JobSpec, options: KubernetesOptions) -> dict[str, Any]:
    """A worker's first init container: waits for the master's name (see INIT in the module docstring)."""
    return {
        "name": INIT_CONTAINER,
        "image": options.image,
        "command": ["python3", "-c", WAIT_FOR_MASTER, f"{job.name}-master-0", str(job.time_limit_s or MASTER_WAIT_S)],
        "resources": {"requests": dict(INIT_RESOURCES), "limits": dict(INIT_RESOURCES)},
    }


def _trainjob(job: JobSpec, options: KubernetesOptions) -> dict[str, Any]:
    r = job.resources
    group, version, _, kind = TRAINJOB_API
    volumes, mounts = pod_volumes(options)
    trainer: dict[str, Any] = {
        "image": options.image,
        "command": keep_log(container_command(job, options), run_dir(job)),
        "numNodes": r.nodes,
        "numProcPerNode": r.nproc_per_node,
        "resourcesPerNode": {"requests": resources_per_pod(job), "limits": resources_per_pod(job)},
    }
    env = _env(job)
    if env:
        trainer["env"] = env
    # v2.3 has no podSpecOverrides: per-job pod settings go in a runtime patch, keyed by its manager.
    pod_spec: dict[str, Any] = dict(pod_extras(job, options))
    if volumes:
        pod_spec["volumes"] = volumes
        pod_spec["containers"] = [{"name": CONTAINER_TRAINJOB, "volumeMounts": mounts}]
    spec: dict[str, Any] = {
        "runtimeRef": (
            {"apiGroup": group, "kind": "ClusterTrainingRuntime", "name": options.runtime}
            if not job.max_restarts
            else {"apiGroup": group, "kind": "TrainingRuntime", "name": runtime_name(job.name)}
        ),
        "trainer": trainer,
        "runtimePatches": [
            {
                "manager": PATCH_MANAGER,
                "trainingRuntimeSpec": {
                    "template": {
                        "spec": {
                            "replicatedJobs": [
                                {
                                    "name": CONTAINER_TRAINJOB,
                                    "template": {
                                        "spec": {
                                            "template": {
                                                "metadata": {"labels": {**MANAGED_BY, **options.label_map}},
                                                "spec": pod_spec,
                                            }
                                        }
                                    },
                                },
                            ]
                        }
                    }
                },
            }
        ],
    }
    deadline = backstop_deadline_s(job)
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    return {"apiVersion": f"{group}/{version}", "kind": kind, "metadata": _metadata(job, options), "spec": spec}
