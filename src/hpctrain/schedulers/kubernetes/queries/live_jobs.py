"""The Kubernetes backend's jobs on the live cluster, a part of KubernetesScheduler (status, list, logs, cancel):
one job's object and pods, its state, exit code and restarts, why it waits (the warnings among the namespace's
events), the namespace's jobs, a pod's log, and deleting a job.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.schedulers import base
from hpctrain.schedulers.base import JobStatus, JobSummary
from hpctrain.schedulers.kubernetes.checks.live import _api_error
from hpctrain.schedulers.kubernetes.api.logstream import LogGone, log_lines
from hpctrain.schedulers.kubernetes.queries.kubeflow_objects import (
    EXITED_WITH_CODE,
    PYTORCHJOB_SELECTOR,
    TRAINJOB_SELECTOR,
    elastic_range,
    job_summary,
    jobset_restarts,
    object_state,
    recorded_exit_code,
    replica_key,
    replica_name,
    replica_status,
    running_pod,
)
from hpctrain.schedulers.kubernetes.queries.replica_logs import (
    TAIL_LINES,
    failed_tails,
    kept_dir,
    kept_lines,
    kept_logs,
    run_dir_here,
)
from hpctrain.schedulers.kubernetes.api.rest import path
from hpctrain.schedulers.kubernetes.manifests import render as r

LOG_WAIT_POLL_S = 1.0  # `logs -f` of a job whose pod has not started: how often it looks again


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
        return self._status(job_id, self.get_object(job_id), self.pods_of(job_id))

    def status_lines(self, job_id: str) -> tuple[JobStatus, Path | None, list[str]]:
        """The job's status, its run directory as this machine sees it (or None), and for an elastic PyTorchJob
        its running worker pods against its elasticPolicy's minReplicas:maxReplicas."""
        from hpctrain.health.view import node_count

        obj, pods = self.get_object(job_id), self.pods_of(job_id)
        status = self._status(job_id, obj, pods)
        found = run_dir_here(obj, self._path_here)
        run_dir = found if found is not None and found.is_dir() else None
        requested = elastic_range(obj) if self.options.api == "pytorchjob" else None
        if requested is None:
            return status, run_dir, []
        running = node_count(sum(map(running_pod, pods)), requested)
        return status, run_dir, [f"{'workers:':12} {running} running (elasticPolicy minReplicas:maxReplicas)"]

    def _status(self, job_id: str, obj: dict[str, Any], pods: list[dict[str, Any]]) -> JobStatus:
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

    def run_dir_here(self, job_id: str) -> Path | None:
        """The job's run directory as this machine sees it through the pods' volumes, or None (a volume not seen
        here, or no run directory): where `status JOB` reads each rank's progress, the web console its plots."""
        found = run_dir_here(self.get_object(job_id), self._path_here)
        return found if found is not None and found.is_dir() else None

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
        return self.summaries(self._listed(), restarts=True)

    def job_listing(self) -> tuple[list[JobSummary], dict[str, str]]:
        """`hpctrain status`'s table: the namespace's jobs, oldest first, and each elastic PyTorchJob's running
        worker pods against its elasticPolicy's minReplicas:maxReplicas ("1 of 1:2"), by job name: one list of the
        jobs and, only when one of them is elastic, one of the namespace's running Kubeflow pods."""
        from hpctrain.health.view import node_count

        items = self._listed()
        ranges: dict[str, str] = {}
        if self.options.api == "pytorchjob":
            for obj in items:
                requested = elastic_range(obj)
                if requested is not None:
                    ranges[obj["metadata"]["name"]] = requested
        running: dict[str, int] = {}
        if ranges:
            pods = self.raw.list(
                self._namespaced("pods"),
                "listing the pods",
                labelSelector=PYTORCHJOB_SELECTOR,
                fieldSelector="status.phase=Running",
            )
            for pod in filter(running_pod, pods):
                job = (pod["metadata"].get("labels") or {}).get(PYTORCHJOB_SELECTOR)
                running[job] = running.get(job, 0) + 1
        nodes = {name: node_count(running.get(name, 0), requested) for name, requested in ranges.items()}
        return self.summaries(items, restarts=False), nodes

    def _listed(self) -> list[dict[str, Any]]:
        """The namespace's jobs of this kind, a page at a time; a namespace that does not exist is a UserError."""
        items = self.raw.list(self._jobs_path(), f"listing the {self.kind}s")
        if not items:  # the API lists nothing, not an error, in a namespace that does not exist
            problems: list[str] = []
            self._namespace_problems(problems)
            if problems:
                raise UserError(problems[0])
        return items

    def summaries(self, items: list[dict[str, Any]], restarts: bool) -> list[JobSummary]:
        """The jobs `items` as neutral summaries, oldest first; with `restarts`, their pods' restarts (one listing of
        the namespace's pods of jobs of this kind), without, the jobs' listing alone."""
        if not items:
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
        ended: Callable[[], bool] | None = None,  # a pod's log stream ends with its container: nothing to ask
    ) -> Iterator[str]:
        from kubernetes.client.rest import ApiException

        if stream != "stdout":
            raise UserError("a container's log holds its stdout and stderr together: drop --err")
        if follow:
            self._wait_for_the_pod(job_id, replica, say)
        obj = self.get_object(job_id)
        pods = self.pods_of(job_id)
        names = [replica_name(p) for p in pods]
        pod = next(iter(pods), None) if replica is None else next((p for p in pods if replica_name(p) == replica), None)
        # What each replica wrote, kept in the run directory where this machine sees it: the log of a replica whose
        # pod went (cleanPodPolicy deletes a finished job's running ones; an elastic job's lost worker) or goes as
        # it is read.
        kept = kept_dir(obj, self._path_here)
        logs = kept_logs(kept, job_id) if kept is not None else {}

        def kept_log(name: str, went: str) -> Iterator[str]:
            if say is not None:
                say(f"{job_id} {went}: the log {name} kept in its run directory ({logs[name]})")
            return kept_lines(logs[name], kept.parent)

        if pod is None:
            name = replica if replica is not None else next(iter(logs), None)
            if name in logs:
                return kept_log(name, "has no pods" if not pods else f"has no pod {name} now")
            if not pods and not logs:
                raise UserError(f"{job_id} has no pods yet: see `{self.command('status', job_id)}` for why")
            known = names or list(logs)  # the replicas as their pods name them while any is there
            raise UserError(f"{job_id} has no replica {replica!r}: use one of {', '.join(known)}")
        container = r.CONTAINER_PYTORCHJOB if self.options.api == "pytorchjob" else r.CONTAINER_TRAINJOB
        name, shown = pod["metadata"]["name"], replica_name(pod)
        try:  # a followed log has no read timeout (client._BoundedPool): it may stay quiet as long as the job runs
            resp = self.raw.stream(
                self._namespaced("pods", name, "log"),
                f"reading the log of {name}",
                container=container,
                **({"follow": "true"} if follow else {}),
            )
        except ApiException as err:
            if err.status == 404 and shown in logs:  # deleted since it was listed
                return kept_log(shown, f"has no pod {shown} now")
            raise UserError(
                f"no logs for {name} yet ({err.status} {err.reason}): its container may not "
                f"have started; see `{self.command('status', job_id)}`"
            ) from None
        if shown not in logs:
            return log_lines(resp, name)
        return _or_kept(log_lines(resp, name), lambda: kept_log(shown, f"replica {shown}'s pod went as it was read"))

    def _wait_for_the_pod(self, job_id: str, replica: str | None, say: Callable[[str], None] | None) -> None:
        """`logs -f` of a job whose pods are still to come, or still starting (a job just submitted, as the web
        console's page of a new job follows it): wait until the replica's pod has left Pending, or the job has
        ended (then what is left of its log is read), saying once what it waits for, as `logs -f` of a queued Slurm
        job waits for its output. A job deleted meanwhile is JobNotFound."""
        said = False
        while True:
            state, _ = object_state(self.get_object(job_id), self.options.api)
            pods = self.pods_of(job_id)
            pod = pods[0] if pods and replica is None else next((p for p in pods if replica_name(p) == replica), None)
            if state in base.FINISHED_STATES or (pods and pod is None):  # ended, or no such replica: said below
                return
            if pod is not None and (pod.get("status") or {}).get("phase") not in (None, "Pending"):
                return
            if not said and say is not None:
                what = f"pod {pod['metadata']['name']} to start" if pod is not None else "its pods to be created"
                say(f"{job_id} is {state}: waiting for {what} (`{self.command('status', job_id)}` says why it waits)")
                said = True
            time.sleep(LOG_WAIT_POLL_S)

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


def _or_kept(lines: Iterator[str], kept: Callable[[], Iterator[str]]) -> Iterator[str]:
    """A pod's log lines, or, where the log went with its pod before its first line (LogGone), the kept log."""
    try:
        first = next(lines, None)
    except LogGone:
        yield from kept()
        return
    if first is not None:
        yield first
        yield from lines
