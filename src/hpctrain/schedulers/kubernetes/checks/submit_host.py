"""Checks on the submit host for a Kubernetes job: what can be known here, before the pods exist.

On Slurm the submit host shares the nodes' file system and PATH, so `check`/`submit` look for the recipe's dataset,
the programs and the run directory here. A pod sees something else: its image (with its own PATH) and the
volumes it mounts. So:

* programs on PATH: never checked here (the image has its own PATH); said so.
* the recipe's dataset and the run directory: checked when the pod path lies on a --volume that is also visible
  on this machine, as a shared NAS is on every node and login host:
    host:/node/path:/mount  visible when /node/path exists here (the NAS at the same path on every machine);
                            the pod's /mount/x is /node/path/x here
    nfs:... or pvc:...      visible when /mount is a mount point here (the platform mounts the share at the
                            same path everywhere); the pod's /mount/x is /mount/x here
  Otherwise the check is skipped, and the reason said.

Problems are lines naming the fix; skipped checks are lines starting with base.NOTE_PREFIX.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers.base import NOTE_PREFIX
from hpctrain.schedulers.kubernetes.manifests.options import KubernetesOptions, Volume
from hpctrain.schedulers.kubernetes.manifests import render as r


def path_here(
    pod_path: str, volumes: Sequence[Volume], ismount: Callable[[str], bool] = os.path.ismount
) -> tuple[str | None, str]:
    """(the path on this machine of what a pod sees at `pod_path`, or None; why not)."""
    if not pod_path.startswith("/"):
        return None, f"{pod_path} is relative to the pod's working directory, inside the image"
    path = posixpath.normpath(pod_path)
    holding = [v for v in volumes if (path + "/").startswith(posixpath.normpath(v.mount).rstrip("/") + "/")]
    if not holding:
        return None, f"{path} is on no --volume, so it is inside the image"
    volume = max(holding, key=lambda v: len(v.mount))
    rest = posixpath.relpath(path, posixpath.normpath(volume.mount))
    if volume.kind == "host":
        if not os.path.isdir(volume.source):
            return None, f"the host path {volume.source} of its --volume is not on this machine"
        return posixpath.normpath(posixpath.join(volume.source, rest)), ""
    if not ismount(volume.mount):
        return None, f"its {volume.kind} --volume at {volume.mount} is not mounted on this machine"
    return path, ""


def local_problems(
    job: JobSpec, options: KubernetesOptions, recipe: Any = None, check_data: Callable[[Any], None] | None = None
) -> list[str]:
    """Problems found here, and a NOTE_PREFIX line for each check that could not run here. `recipe`: the TrainConfig
    of a built-in recipe's options (the caller parses them as `hpctrain train` will), None for a command;
    `check_data`: the recipes' data check (hpctrain.recipes.check_data), run on the data dir as seen here."""
    volumes = options.parsed_volumes
    lines = [
        f"{NOTE_PREFIX}skipped the check for programs on PATH: the pods run image {options.image}, which has "
        "its own PATH"
    ]
    lines += _dataset_problems(recipe, volumes, check_data)
    lines += _run_dir_problems(job, volumes)
    return lines


def _dataset_problems(cfg: Any, volumes: Sequence[Volume], check_data: Callable[[Any], None] | None) -> list[str]:
    if cfg is None:
        return []
    here, why = path_here(str(cfg.data_dir), volumes)
    if here is None:
        return [f"{NOTE_PREFIX}skipped the check for dataset {cfg.dataset}: --data-dir {why}"]
    if check_data is None:
        return []
    try:
        check_data(dataclasses.replace(cfg, data_dir=here))
    except UserError as err:
        where = f" (seen here as {here})" if here != posixpath.normpath(str(cfg.data_dir)) else ""
        return [f"the pods will not find dataset {cfg.dataset} in --data-dir {cfg.data_dir}{where}: {err}"]
    return []


def _run_dir_problems(job: JobSpec, volumes: Sequence[Volume]) -> list[str]:
    directory = r.run_dir(job)
    if directory is None:
        return []
    here, why = path_here(directory, volumes)
    if here is None:
        return [f"{NOTE_PREFIX}skipped the check that the run dir is writable: {why}"]
    existing = Path(here)
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return [
            f"--run-dir {directory}: {existing} (here) is not a writable directory, so the pods cannot write "
            "their checkpoints there; fix its permissions on the volume or choose another --run-dir"
        ]
    return []
