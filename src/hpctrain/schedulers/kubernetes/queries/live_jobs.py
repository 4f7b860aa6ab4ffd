"""The Kubernetes backend's jobs on the live cluster, a part of KubernetesScheduler (status, list, logs, cancel):
one job's object and pods, its state, exit code and restarts, why it waits (the warnings among the namespace's
events), the namespace's jobs, a pod's log, and deleting a job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from hpctrain.errors import UserError
from hpctrain.schedulers import base
from hpctrain.schedulers.base import JobStatus, JobSummary
from hpctrain.schedulers.kubernetes.checks.live import _api_error
from hpctrain.schedulers.kubernetes.api.logstream import log_lines
from hpctrain.schedulers.kubernetes.queries.kubeflow_objects import (
    EXITED_WITH_CODE,
    PYTORCHJOB_SELECTOR,
    TRAINJOB_SELECTOR,
    job_summary,
    jobset_restarts,
    object_state,
    recorded_exit_code,
    replica_key,
    replica_name,
    replica_status,
)
from hpctrain.schedulers.kubernetes.queries.replica_logs import (
    TAIL_LINES,
    failed_tails,
    kept_dir,
    kept_lines,
    kept_logs,
)
from hpctrain.schedulers.kubernetes.api.rest import path
from hpctrain.schedulers.kubernetes.manifests import render as r


class LiveJobs:
    """KubernetesScheduler's job methods: they read self.raw (the API server's JSON and a pod's log), write through
    self.custom (the client's generated API), and read self.options and
    self.namespace, self.group, self.version, self.plural and self.kind (the job API), self.command (the commands it
    suggests) and LiveChecks' _namespace_problems (a namespace that does not exist lists no jobs)."""

    def get_object(self, job_id: str) -> dict[str, Any]:
        from kubernetes.client.rest import ApiException

        try:
            return self.raw.get(self._jobs_path(job_id), f"reading {self.kind} {job_id}")
        except ApiException as err:
            if err.status == 404:
                raise base.JobNotFound(
                    f"no {self.kind} named {job_id!r} in namespace {self.namespace}: check the name "
                    f"and --namespace (`{self.command('status')}` lists the jobs)"
                ) from None
            raise _api_error(err, f"reading {self.kind} {job_id}") from None

    def _jobs_path(self, *name: str) -> str:
        return path("apis", self.group, self.version, "namespaces", self.namespace, self.plural, *name)

    def _namespaced(self, *kind: str) -> str:
        return path("api", "v1", "namespaces", self.namespace, *kind)

    def pods_of(self, job_id: str) -> list[dict[str, Any]]:
        """The job's pods, as JSON, in replica order (master, nodes, workers)."""
        selector = PYTORCHJOB_SELECTOR if self.options.api == "pytorchjob" else TRAINJOB_SELECTOR
        pods = self.raw.list(self._namespaced("pods"), "listing the pods", labelSelector=f"{selector}={job_id}")
        return sorted(pods, key=lambda p: replica_key(replica_name(p)))

    def access(self, job_id: str) -> base.JobAccess:
        """`kubectl exec` into the job's first pod (rank 0's: master-0, node-0), each pod's log apart."""
        self.get_object(job_id)  # JobNotFound for an unknown job
        pods = self.pods_of(job_id)
        target = pods[0]["metadata"]["name"] if pods else f"POD-OF-{job_id}"
        shell = self.kubectl("exec", "-it", "-n", self.namespace, target, "--", "bash")
        return base.JobAccess(shell, tuple(replica_name(p) for p in pods))

    def status(self, job_id: str) -> JobStatus:
        obj = self.get_object(job_id)
        pods = self.pods_of(job_id)
        replicas = tuple(replica_status(p) for p in pods)
        state, message = object_state(obj, self.options.api)
        if state == base.PENDING and any(p.phase == "Running" for p in replicas):
            state = base.RUNNING
        exit_code = None
        if state in (base.SUCCEEDED, base.FAILED):
            codes = [p.exit_code for p in replicas if p.exit_code is not None]
            exit_code = next((c for c in codes if c), codes[0] if codes else (0 if state == base.SUCCEEDED else None))
        if exit_code is None and state == base.FAILED and self.options.api == "pytorchjob":
            # Its pods went (cleanPodPolicy): the operator's ExitedWithCode events on it (objects.recorded_exit_code).
            exit_code = recorded_exit_code(
                self.raw.list(
                    self._namespaced("events"),
                    "listing the events",
                    fieldSelector=f"involvedObject.uid={obj['metadata'].get('uid', '')},reason={EXITED_WITH_CODE}",
                )
            )
        waiting = state in (base.PENDING, base.RESTARTING) or any(p.phase == "Pending" for p in replicas)
        reasons = self._pending_reasons(job_id, pods) if waiting and state not in base.FINISHED_STATES else ()
        if state == base.PENDING and not pods and not any(": FailedCreatePod: " in r for r in reasons):
            conditions = [
                f"{c.get('type')}={c.get('status')}" for c in (obj.get("status") or {}).get("conditions") or []
            ]
            seen = f"its conditions: {', '.join(conditions)}" if conditions else "no controller has set a condition"
            reasons = reasons + (
                f"no pods yet ({seen}): the Kubeflow controller creates them (is the {self.kind} operator running?)",
            )
        restarts = sum(p.restarts for p in replicas) + jobset_restarts(pods)
        last_lines = self._last_lines(obj, job_id, replicas) if state == base.FAILED else ()
        return JobStatus(
            job_id=job_id,
            state=state,
            exit_code=exit_code,
            restarts=restarts,
            replicas=replicas,
            pending_reasons=reasons,
            message=message,
            last_lines=last_lines,
        )

    def _last_lines(
        self, obj: dict[str, Any], job_id: str, replicas: tuple[base.ReplicaStatus, ...]
    ) -> tuple[str, ...]:
        """The failed replicas' last lines: from the run directory when this machine reaches it (the whole log, the
        pods may be gone), else from their pods' termination messages (render.py: FallbackToLogsOnError)."""
        kept = failed_tails(kept_dir(obj, self._path_here), job_id)
        if kept:
            return kept
        out: list[str] = []
        for rep in replicas:
            if rep.exit_code and rep.message:
                out += [f"{rep.name}: {line}" for line in rep.message.splitlines()[-TAIL_LINES:]]
        return tuple(out)

    def _path_here(self, pod_path: str, volumes: list[Any]) -> tuple[str | None, str]:
        from hpctrain.schedulers.kubernetes.checks.submit_host import path_here

        return path_here(pod_path, volumes)

    def _pending_reasons(self, job_id: str, pods: list[dict[str, Any]]) -> tuple[str, ...]:
        waiting = {p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") in (None, "Pending")}
        # Only warnings (the server filters), a page at a time: a busy namespace keeps thousands of events.
        events = self.raw.list(self._namespaced("events"), "listing the events", fieldSelector="type=Warning")
        lines = []
        for e in sorted(events, key=_when):
            obj = e.get("involvedObject") or {}
            name, said = obj.get("name"), e.get("message")
            if e.get("type") == "Warning" and (name in waiting or (obj.get("kind") == self.kind and name == job_id)):
                line = f"{name}: {e.get('reason')}: {said}"
                if "exceeded quota" in (said or ""):  # the API server's quota admission refused the controller
                    line += (
                        " -- the namespace's ResourceQuota refuses the pods: wait for the quota to free, submit "
                        "with less (fewer --nodes or less per pod) or ask for a larger quota "
                        f"(`{self.command('cluster')}` shows its use)"
                    )
                if line not in lines:
                    lines.append(line)
        return tuple(lines)

    def list_jobs(self, all_users: bool = False) -> list[JobSummary]:
        """The namespace's jobs (a namespace's are everyone's who can read it: `all_users` changes nothing) and, where
        there are any, the namespace's pods of jobs of this kind (their restarts): two listings, a page at a time."""
        return self.summaries(restarts=True)

    def summaries(self, restarts: bool) -> list[JobSummary]:
        """list_jobs; without `restarts`, the jobs' listing alone (`hpctrain status`'s table: no restarts in it)."""
        items = self.raw.list(self._jobs_path(), f"listing the {self.kind}s")
        if not items:  # the API lists nothing, not an error, in a namespace that does not exist
            problems: list[str] = []
            self._namespace_problems(problems)
            if problems:
                raise UserError(problems[0])
            return []
        if not restarts:
            return sorted((job_summary(obj, self.options.api, []) for obj in items), key=lambda s: s.created or "")
        selector = PYTORCHJOB_SELECTOR if self.options.api == "pytorchjob" else TRAINJOB_SELECTOR
        pods: dict[str, list[dict[str, Any]]] = {}
        for pod in self.raw.list(self._namespaced("pods"), "listing the pods", labelSelector=selector):
            pods.setdefault((pod["metadata"].get("labels") or {}).get(selector, ""), []).append(pod)
        out = [job_summary(obj, self.options.api, pods.get(obj["metadata"]["name"], [])) for obj in items]
        return sorted(out, key=lambda s: s.created or "")

    def logs(
        self,
        job_id: str,
        follow: bool = False,
        replica: str | None = None,
        stream: str = "stdout",
        say: Callable[[str], None] | None = None,
    ) -> Iterator[str]:
        from kubernetes.client.rest import ApiException

        if stream != "stdout":
            raise UserError("a container's log holds its stdout and stderr together: drop --err")
        obj = self.get_object(job_id)
        pods = self.pods_of(job_id)
        names = [replica_name(p) for p in pods]
        if not pods:
            kept = kept_dir(obj, self._path_here)
            logs = kept_logs(kept, job_id) if kept is not None else {}
            if logs:  # the pods went (or are still to come again): what the replicas wrote, kept in the run directory
                name = replica if replica is not None else next(iter(logs))
                if name not in logs:
                    raise UserError(f"{job_id} kept no log of replica {name!r}: use one of {', '.join(logs)}")
                if say is not None:
                    say(f"{job_id} has no pods: the log {name} kept in its run directory ({logs[name]})")
                return kept_lines(logs[name], kept.parent)
            raise UserError(f"{job_id} has no pods yet: see `{self.command('status', job_id)}` for why")
        pod = pods[0] if replica is None else next((p for p in pods if replica_name(p) == replica), None)
        if pod is None:
            raise UserError(f"{job_id} has no replica {replica!r}: use one of {', '.join(names)}")
        container = r.CONTAINER_PYTORCHJOB if self.options.api == "pytorchjob" else r.CONTAINER_TRAINJOB
        name = pod["metadata"]["name"]
        try:  # a followed log has no read timeout (client._BoundedPool): it may stay quiet as long as the job runs
            resp = self.raw.stream(
                self._namespaced("pods", name, "log"),
                f"reading the log of {name}",
                container=container,
                **({"follow": "true"} if follow else {}),
            )
        except ApiException as err:
            raise UserError(
                f"no logs for {name} yet ({err.status} {err.reason}): its container may not "
                f"have started; see `{self.command('status', job_id)}`"
            ) from None
        return log_lines(resp, name)

    def cancel(self, job_id: str) -> None:
        """Delete the job; its pods get SIGTERM and their terminationGracePeriodSeconds (--signal-grace, rendered
        into the pod template) to write a checkpoint before SIGKILL. Foreground: the job object stays, shown as
        CANCELLED, until its pods are gone."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        try:
            self.custom.delete_namespaced_custom_object(
                self.group,
                self.version,
                self.namespace,
                self.plural,
                job_id,
                body=client.V1DeleteOptions(propagation_policy="Foreground"),
            )
        except ApiException as err:
            if err.status == 404:
                raise UserError(
                    f"no {self.kind} named {job_id!r} in namespace {self.namespace}: nothing to cancel"
                ) from None
            raise _api_error(err, f"cancelling {self.kind} {job_id}") from None


def _when(event: dict[str, Any]) -> str:
    """When an event (its JSON) last happened, as the API server writes times (they sort as text)."""
    return str(event.get("lastTimestamp") or event["metadata"].get("creationTimestamp") or "")
