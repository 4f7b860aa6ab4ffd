"""`hpctrain dev save NAME IMAGE` on Kubernetes: a new image made of the session's base image plus the Python
packages installed in the session, built and pushed by a BuildKit Job in the session's namespace.

- What was installed: the session's pod records `pip freeze` of its image when it starts (BASE_PACKAGES, written
  before JupyterLab starts: service_pod's command); `dev save` reads that and the session's `pip freeze` now
  through the API server's exec, and keeps the lines that are new (hence installed or upgraded in the session).
  Editable installs and local file URLs cannot be rebuilt elsewhere: they are left out and named.
- The build: a ConfigMap holding a Dockerfile (`FROM base`, `pip install -r requirements.txt`) and the packages,
  and a Job running BuildKit rootless as buildkit's own example does (moby/buildkit, examples/kubernetes/
  job.rootless.yaml: `buildctl-daemonless.sh build --frontend dockerfile.v0`, BUILDKITD_FLAGS
  --oci-worker-no-process-sandbox, runAsUser 1000, unconfined seccomp and AppArmor), which pushes the image
  (`--output type=image,name=IMAGE,push=true`) with the registry credentials of the Secret REGISTRY_SECRET when it
  exists (`kubectl create secret docker-registry hpctrain-registry ...`). The ConfigMap is made owned by the Job,
  so deleting the Job removes both.

`render_build` is pure (what `--dry-run` prints); `save` reads the pod, renders and creates.
"""

from __future__ import annotations

import re
from typing import Any

from hpctrain.errors import UserError
from hpctrain.images import parse_ref
from hpctrain.servers.sessions import SAVE_ADVICE, SaveOutcome

BASE_PACKAGES = "/tmp/hpctrain-base-packages.txt"
RECORD_BASE = f"python3 -m pip freeze > {BASE_PACKAGES} 2>/dev/null || true; "
"""Prefixed to the session pod's shell command: the image's own packages, before anything is installed."""
BUILDER_IMAGE = "moby/buildkit:v0.16.0-rootless"
REGISTRY_SECRET = "hpctrain-registry"
MARK = "----hpctrain-now----"
READ_PACKAGES = f"cat {BASE_PACKAGES} 2>/dev/null; echo {MARK}; python3 -m pip freeze 2>/dev/null"
BUILD_LABEL = "hpctrain.io/build-of"
_UNBUILDABLE = re.compile(r"^-e\s|\s@\s+file:|^file:")


def check_image(image: str) -> str:
    """IMAGE as BuildKit pushes it: [REGISTRY/]NAME[:TAG] (a docker:// prefix is dropped); refused with the fix."""
    text = image.removeprefix("docker://")
    try:
        ref = parse_ref("docker://" + text)
    except UserError:
        ref = None
    if ref is None or ref.digest or "#" in text:
        raise UserError(
            f"dev save: {image!r} is not an image name to push to: use REGISTRY/NAME:TAG with a lower-case name, "
            "e.g. registry.example.org/me/explore:1"
        )
    return text


def packages_added(base: str, now: str) -> tuple[list[str], list[str]]:
    """(requirement lines in `now` that `base` lacks, those left out because no build can install them)."""
    had = {line.strip() for line in base.splitlines()}
    added, skipped = [], []
    for line in now.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or line in had:
            continue
        (skipped if _UNBUILDABLE.search(line) else added).append(line)
    return added, skipped


def dockerfile(base_image: str) -> str:
    return (
        f"FROM {base_image}\n"
        "COPY requirements.txt /tmp/hpctrain-requirements.txt\n"
        "RUN python3 -m pip install --no-cache-dir -r /tmp/hpctrain-requirements.txt\n"
    )


def build_name(session: str) -> str:
    return f"dev-{session}-save"


def render_build(
    session: str, namespace: str, base_image: str, image: str, requirements: list[str]
) -> list[dict[str, Any]]:
    """The ConfigMap (Dockerfile and requirements.txt) and the BuildKit Job that builds and pushes `image`. Pure."""
    name = build_name(session)
    labels = {"app.kubernetes.io/managed-by": "hpctrain", BUILD_LABEL: session}
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": {"Dockerfile": dockerfile(base_image), "requirements.txt": "\n".join(requirements) + "\n"},
    }
    unconfined = {
        "container.apparmor.security.beta.kubernetes.io/buildkit": "unconfined",
        "container.seccomp.security.alpha.kubernetes.io/buildkit": "unconfined",
    }
    container = {
        "name": "buildkit",
        "image": BUILDER_IMAGE,
        "command": ["buildctl-daemonless.sh"],
        "args": [
            "build",
            "--frontend",
            "dockerfile.v0",
            "--local",
            "context=/workspace",
            "--local",
            "dockerfile=/workspace",
            "--output",
            f"type=image,name={image},push=true",
        ],
        "env": [
            {"name": "BUILDKITD_FLAGS", "value": "--oci-worker-no-process-sandbox"},
            {"name": "DOCKER_CONFIG", "value": "/home/user/.docker"},
        ],
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
        "volumeMounts": [
            {"name": "workspace", "mountPath": "/workspace", "readOnly": True},
            {"name": "registry", "mountPath": "/home/user/.docker", "readOnly": True},
        ],
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels, "annotations": unconfined},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [container],
                    "volumes": [
                        {"name": "workspace", "configMap": {"name": name}},
                        {
                            "name": "registry",
                            "secret": {
                                "secretName": REGISTRY_SECRET,
                                "optional": True,
                                "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
                            },
                        },
                    ],
                },
            },
        },
    }
    return [config_map, job]


def read_packages(raw: Any, namespace: str, pod: str) -> tuple[str, str]:
    """(the image's pip freeze when the session started, the session's pip freeze now), through exec."""
    from hpctrain.schedulers.kubernetes.services.pods import exec_failure, exec_probe

    out, status = exec_probe(raw, namespace, pod, "dev", READ_PACKAGES)
    if MARK not in out:
        raise UserError(
            f"dev save: could not read the packages of pod {pod} ({exec_failure(status) or 'no answer'}): is it "
            "running? see `hpctrain dev list`"
        )
    base, _, now = out.partition(MARK)
    return base, now


def save(session: str, conn: dict[str, Any], image: str, dry_run: bool, raw: Any, core: Any, batch: Any) -> SaveOutcome:
    """Record what the session installed, then render (dry_run) or create the build."""
    from hpctrain.schedulers.kubernetes.manifests.render import render_yaml

    target = check_image(image)
    namespace, pod, base_image = str(conn.get("namespace")), str(conn.get("pod")), conn.get("image")
    if not base_image:
        raise UserError(
            f"dev save: session {session} was started by an older hpctrain that did not record its image: stop "
            "it and start it again, or build the image by hand (see docs: dev sessions, saving)"
        )
    base, now = read_packages(raw, namespace, pod)
    if not base.strip():
        raise UserError(
            f"dev save: pod {pod} has no record of its image's packages ({BASE_PACKAGES}; the image has no "
            "python3 -m pip, or the session predates `dev save`): record them with `pip freeze` and build by hand"
        )
    added, skipped = packages_added(base, now)
    left_out = [f"left out (cannot be installed in a build): {line}" for line in skipped]
    if not added:
        return SaveOutcome(
            "steps",
            target,
            (f"nothing was installed with pip in session {session}: its image {base_image} already is it", *left_out),
        )
    manifests = render_build(session, namespace, str(base_image), target, added)
    if dry_run:
        config_map, job = (render_yaml(m).rstrip("\n") for m in manifests)
        return SaveOutcome("rendered", target, (config_map, "---", job))
    config_map, job = manifests
    create(core, batch, namespace, config_map, job)
    name = job["metadata"]["name"]
    return SaveOutcome(
        "submitted",
        target,
        (
            f"build job {namespace}/{name} submitted: {base_image} plus {len(added)} package(s) from session "
            f"{session}, pushed as {target}",
            *left_out,
            f"follow it: kubectl logs -n {namespace} job/{name} -f (registry credentials: the Secret "
            f"{REGISTRY_SECRET}, if there is one)",
            f"then: hpctrain dev start NAME --image {target}",
            SAVE_ADVICE,
        ),
        job=name,
    )


def create(core: Any, batch: Any, namespace: str, config_map: dict[str, Any], job: dict[str, Any]) -> None:
    """The ConfigMap, then the Job, then the ConfigMap made the Job's (deleted with it). A name in use is one line and
    changes nothing; a ConfigMap whose Job could not be made is removed again."""
    from kubernetes.client.rest import ApiException

    name = job["metadata"]["name"]
    in_use = UserError(
        f"dev save: a build {name} already exists in namespace {namespace}: wait for it, or delete it "
        f"(kubectl delete job -n {namespace} {name}) and save again"
    )
    try:
        core.create_namespaced_config_map(namespace, config_map)
    except ApiException as err:
        if err.status == 409:
            raise in_use from None
        raise
    try:
        made = batch.create_namespaced_job(namespace, job)
    except BaseException as err:
        core.delete_namespaced_config_map(name, namespace)
        if isinstance(err, ApiException) and err.status == 409:
            raise in_use from None
        raise
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": made.metadata.uid}
    core.patch_namespaced_config_map(name, namespace, {"metadata": {"ownerReferences": [owner]}})
