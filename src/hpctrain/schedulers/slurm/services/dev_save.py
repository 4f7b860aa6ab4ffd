"""`hpctrain dev save NAME IMAGE` on Slurm: a running dev session's environment written to a new image file, by a
job step beside the session's own (`srun --jobid JOB --overlap`), where its environment allows it.

- enroot through pyxis: the session's step runs in a *named* container (its batch script exports
  PYXIS_CONTAINER_NAME, which pyxis reads as --container-name: pyxis args.c, pyxis_args_check_environment_variables),
  so a second step with the same `--container-name` finds that very container ("If a container with this name
  already exists, the existing container is used and the import is skipped"), and `--container-save=PATH` makes
  pyxis export it to a squashfs file when that step ends. pyxis refuses an empty PATH or one ending in `/` ("target
  is a directory"); we refuse those first, with the fix.
- apptainer from a sandbox directory (`--image DIR/`, run writable: setup_lines): `apptainer build NEW.sif DIR/`
  turns the sandbox, with what was installed in it, into a SIF file.
- apptainer from a `.sif` (read-only), a venv, conda, modules or the host: nothing can be saved in place; the
  outcome holds the exact steps (and a venv or conda prefix on the shared file system needs no saving at all).

The file is written to a hidden temporary beside IMAGE, checked to be an image of the right kind (its magic bytes:
hpctrain.images.image_format) and only then renamed to IMAGE: an interrupted save leaves no file that looks like
an image. `plan` is pure; `save` runs it.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.images import image_format
from hpctrain.schedulers.slurm.commands import SlurmUnavailable, slurm
from hpctrain.servers.sessions import SAVE_ADVICE, SaveOutcome

CONTAINER_PREFIX = "hpctrain-dev-"
SAVE_TIMEOUT_S = 3600.0  # exporting a large container takes minutes; an hour is past any sane one
SUFFIX = {"pyxis": ".sqsh", "apptainer": ".sif"}


def container_name(session: str) -> str:
    """The pyxis container name of a session's step (enroot keeps it, per job, under this name)."""
    return CONTAINER_PREFIX + session


def setup_lines(session: str, environment: Any) -> list[str]:
    """Batch-script lines before the session's step (`environment`: its EnvironmentSpec): with pyxis, name its
    container so that `dev save` finds it; with an apptainer sandbox directory, make it writable (apptainer reads
    APPTAINER_WRITABLE as --writable: its docs, "Apptainer's environment variables"), so that what is installed in
    the session lands in the sandbox that `dev save` builds into a .sif."""
    if environment.kind == "pyxis":
        return [
            "# pyxis: a named container, which `hpctrain dev save` reaches from a second step (--container-save).",
            f"export PYXIS_CONTAINER_NAME={shlex.quote(container_name(session))}",
        ]
    if environment.kind == "apptainer" and (environment.image or "").endswith("/"):
        return [
            "# apptainer: the sandbox writable, for what the session installs (`hpctrain dev save`).",
            "export APPTAINER_WRITABLE=true",
        ]
    return []


def record(environment: Any) -> dict[str, Any]:
    """What the connection record keeps of the session's environment (an EnvironmentSpec), for `dev save`."""
    return {
        "kind": environment.kind,
        "image": environment.image,
        "venv": environment.venv,
        "conda_env": environment.conda_env,
    }


@dataclass(frozen=True)
class Plan:
    """A save: `argv` run on this host (None: it cannot be done here, `steps` say how), into `partial`, then renamed
    to `target`."""

    target: Path
    partial: Path | None
    argv: list[str] | None
    fmt: str | None
    steps: tuple[str, ...] = ()


def target_path(image: str, suffix: str) -> Path:
    """IMAGE as an absolute path (the step runs on the session's node, which sees the shared file system), checked
    for the use it is put to."""
    if not image or image.endswith("/"):
        raise UserError(f"dev save: image {image!r} names a directory: give a file, e.g. ~/images/explore{suffix}")
    path = Path(os.path.expanduser(image)).absolute()
    if path.suffix != suffix:
        raise UserError(f"dev save: image {image!r} must end in {suffix} here: e.g. {path.with_suffix(suffix)}")
    if any(ch in str(path) for ch in ",\n\r\t"):
        raise UserError(f"dev save: image {image!r}: choose a path without commas, tabs or newlines")
    if path.exists() or path.is_symlink():
        raise UserError(f"dev save: {path} exists: choose another name, or remove it first")
    if not path.parent.is_dir():
        raise UserError(
            f"dev save: no folder {path.parent}: create it first (mkdir -p {shlex.quote(str(path.parent))})"
        )
    if not os.access(path.parent, os.W_OK):
        raise UserError(f"dev save: cannot write to {path.parent}: choose a folder of yours")
    return path


def plan(session: str, conn: dict[str, Any], image: str) -> Plan:
    """What saving `session` to `image` means for its environment. Pure (but for looking at IMAGE's folder)."""
    env = conn.get("environment") or {}
    kind, source = env.get("kind") or "none", env.get("image")
    job = str(conn.get("job_id"))
    step = ["srun", f"--jobid={job}", "--overlap", "--nodes=1", "--ntasks=1", "--quiet"]
    if kind == "pyxis":
        target = target_path(image, ".sqsh")
        partial = target.with_name(f".{target.name}.partial")
        argv = step + [f"--container-name={container_name(session)}", f"--container-save={partial}", "true"]
        return Plan(target, partial, argv, "sqsh")
    if kind == "apptainer" and source and source.endswith("/"):
        target = target_path(image, ".sif")
        partial = target.with_name(f".{target.name}.partial")
        return Plan(target, partial, step + ["apptainer", "build", str(partial), source], "sif")
    return Plan(Path(image), None, None, None, manual_steps(kind, env, image))


def manual_steps(kind: str, env: dict[str, Any], image: str) -> tuple[str, ...]:
    """The exact steps where the session's environment cannot be saved in place."""
    q = shlex.quote
    if kind == "apptainer":
        sif = str(env.get("image"))
        sandbox = f"{sif.removesuffix('.sif')}-sandbox/"
        return (
            f"A .sif image is read-only: what the session installed is not in it. To make {image}:",
            f"  apptainer build --sandbox {q(sandbox)} {q(sif)}",
            f"  apptainer exec --writable {q(sandbox)} pip install PACKAGES   (or start the session with "
            f"--image {q(sandbox)} and install there)",
            f"  apptainer build {q(image)} {q(sandbox)}",
            "Then `hpctrain dev save` does the last step itself for a session started from the sandbox.",
        )
    if kind in ("venv", "conda"):
        where = env.get("venv") or env.get("conda_env")
        return (
            f"The session's environment ({where}) is a folder on the file system: what you installed is already "
            "kept there, for every job that names it. Nothing needs saving.",
            "To record it: pip freeze > requirements.txt (or conda env export > environment.yml).",
            f"To make a container image of it anyway: write a definition file that installs requirements.txt and "
            f"run `hpctrain image build DEF.def --to {q(image)}`.",
        )
    return (
        "The session runs on the node's own software (no container): there is no image to save.",
        "Record what you installed (pip freeze > requirements.txt), or start the session from a container image "
        "(--image FILE.sqsh with pyxis, --image DIR/ for an apptainer sandbox), install there, then save it.",
    )


def save(session: str, conn: dict[str, Any], image: str, dry_run: bool) -> SaveOutcome:
    """Save the running session `session` (its connection record `conn`) to `image`, or say how."""
    from hpctrain.schedulers.slurm.queries.job_states import get_job

    chosen = plan(session, conn, image)
    if chosen.argv is None:
        return SaveOutcome("steps", image, (*chosen.steps, SAVE_ADVICE))
    job = str(conn.get("job_id"))
    if dry_run:
        return SaveOutcome(
            "rendered", str(chosen.target), (shlex.join(chosen.argv), f"then: mv {chosen.partial} {chosen.target}")
        )
    info = get_job(job)
    if info is None or info.state != "RUNNING":
        state = info.state if info is not None else "gone"
        raise UserError(
            f"dev session {session}: its job {job} is {state}, and a session is saved while it runs: start it "
            f"again (`hpctrain dev start {session} ...`), install, then save"
        )
    assert chosen.partial is not None
    chosen.partial.unlink(missing_ok=True)  # an earlier interrupted save's: ours, by its hidden name
    try:  # Slurm's one runner: the step in its own session, killed with its children at the deadline
        done = slurm(chosen.argv, check=False, timeout=SAVE_TIMEOUT_S)
    except SlurmUnavailable:
        chosen.partial.unlink(missing_ok=True)
        raise UserError(
            f"dev save: the save step did not end within {SAVE_TIMEOUT_S:g} s (stopped), or Slurm could not be "
            "reached; nothing was saved: try again, or save by hand"
        ) from None
    if done.returncode != 0 or image_format(chosen.partial) != chosen.fmt:
        chosen.partial.unlink(missing_ok=True)
        said = (done.stderr or done.stdout).strip().splitlines()
        raise UserError(
            f"dev save: the save step failed (exit {done.returncode}): {said[-1] if said else 'no image was written'}"
            "; nothing was saved: see `hpctrain dev list`, or save by hand"
        )
    os.replace(chosen.partial, chosen.target)
    return SaveOutcome(
        "saved",
        str(chosen.target),
        (
            f"saved dev session {session} as {chosen.target}",
            f"start from it: hpctrain dev start NAME --image {shlex.quote(str(chosen.target))} (or submit --image)",
            SAVE_ADVICE,
        ),
        job=job,
    )
