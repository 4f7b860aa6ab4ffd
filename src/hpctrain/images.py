"""Container images for the cluster: pull a docker:// reference once, on the login node, into an apptainer `.sif`
or an enroot `.sqsh` file that jobs then start from (`--image FILE`).

Pulling inside a job wastes the GPUs it holds and fails where compute nodes cannot reach the registry; hence
`pull` refuses to run inside an allocation (SLURM_JOB_ID set) unless forced, and `docker_pull_hint` tells
`submit --image docker://...` users the command to run first.

A finished image is recognised by its magic bytes: a SIF file has `SIF_MAGIC` after its 32-byte launch line, a
squashfs file (enroot) starts with `hsqs`. Pulls go to a temporary name in the same folder and are renamed into
place only when complete and valid: an interrupted pull leaves no file that looks like an image.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from hpctrain.errors import UserError

FORMATS = ("sif", "sqsh")
SIF_MAGIC = b"SIF_MAGIC"
SIF_MAGIC_OFFSET = 32
SQUASHFS_MAGIC = b"hsqs"
DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io")
_TOOLS = {"sif": "apptainer", "sqsh": "enroot"}
_PART_RE = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_REGISTRY_RE = re.compile(r"^[A-Za-z0-9.-]+(?::\d+)?$")


@dataclass(frozen=True)
class ImageRef:
    """A parsed `docker://[REGISTRY/]REPOSITORY[:TAG][@DIGEST]`; registry None means Docker Hub."""

    repository: str
    registry: str | None = None
    tag: str | None = None
    digest: str | None = None

    @property
    def on_docker_hub(self) -> bool:
        return self.registry is None or self.registry in DOCKER_HUB

    def _suffix(self) -> str:
        return (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    def docker_uri(self) -> str:
        """The form apptainer reads: docker://REGISTRY/REPO:TAG."""
        host = f"{self.registry}/" if self.registry else ""
        return f"docker://{host}{self.repository}{self._suffix()}"

    def enroot_uri(self) -> str:
        """The form enroot reads: docker://REGISTRY#REPO:TAG (a `#` between registry and repository)."""
        host = f"{self.registry}#" if self.registry else ""
        return f"docker://{host}{self.repository}{self._suffix()}"

    def filename(self, fmt: str) -> str:
        """NAME_TAG.FORMAT, as `apptainer pull` names its files."""
        name = self.repository.rsplit("/", 1)[-1]
        version = self.tag or (self.digest.split(":", 1)[-1][:12] if self.digest else "latest")
        return f"{name}_{version}.{fmt}"


def parse_ref(text: str) -> ImageRef:
    """docker://nvcr.io/nvidia/pytorch:24.04-py3, docker://pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime, ..."""
    if not isinstance(text, str) or not text.startswith("docker://"):
        raise UserError(f"{text!r} is not a docker:// reference: use e.g. docker://nvcr.io/nvidia/pytorch:24.04-py3")
    rest = text[len("docker://") :]
    if "#" in rest:  # enroot's spelling: REGISTRY#REPO
        registry, _, rest = rest.partition("#")
        rest = f"{registry}/{rest}"
    rest, _, digest = rest.partition("@")
    first, slash, remainder = rest.partition("/")
    registry = None
    if slash and ("." in first or ":" in first or first == "localhost"):
        registry, rest = first, remainder
    repository, tag = rest, None
    if ":" in rest.rsplit("/", 1)[-1]:
        repository, _, tag = rest.rpartition(":")
    bad = (
        not repository
        or not all(_PART_RE.match(p) for p in repository.split("/"))
        or (tag is not None and not _TAG_RE.match(tag))
        or (registry is not None and not _REGISTRY_RE.match(registry))
        or (digest and not re.match(r"^[a-z0-9]+:[a-f0-9]{32,}$", digest))
    )
    if bad:
        raise UserError(
            f"{text!r} is not a valid image reference: use docker://[REGISTRY/]NAME[:TAG] with a lower-case "
            "name, e.g. docker://nvcr.io/nvidia/pytorch:24.04-py3"
        )
    return ImageRef(repository=repository, registry=registry, tag=tag, digest=digest or None)


def with_mirror(ref: ImageRef, mirror: str) -> ImageRef:
    """The same Docker Hub image through a pull-through mirror (`--registry-mirror HOST[:PORT]`); Docker Hub's
    official images get their implicit `library/` prefix, as mirrors expect."""
    if not _REGISTRY_RE.match(mirror or ""):
        raise UserError(
            f"--registry-mirror {mirror!r}: give the mirror's host name (and port), "
            "e.g. --registry-mirror mirror.example.org:5000"
        )
    if not ref.on_docker_hub:
        raise UserError(
            f"--registry-mirror mirrors Docker Hub, but the image comes from {ref.registry}: drop "
            "--registry-mirror, or write the mirror's own reference for it"
        )
    repository = ref.repository if "/" in ref.repository else f"library/{ref.repository}"
    return replace(ref, registry=mirror, repository=repository)


def docker_pull_hint(image: str) -> str | None:
    """For `submit --image docker://...`: the pull command to run first (None when `image` is not a docker://
    reference). A job would otherwise pull and convert it on the compute node, holding its GPUs meanwhile."""
    if not isinstance(image, str) or not image.startswith("docker://"):
        return None
    try:
        filename = parse_ref(image).filename("sif")
    except UserError:
        filename = "IMAGE.sif"
    return (
        f"--image {image} would be pulled and converted on the compute node, holding the job's GPUs (and compute "
        f"nodes often cannot reach the registry): pull it once here with `hpctrain image pull {shlex.quote(image)} "
        f"--to DIR`, then pass --image DIR/{filename}"
    )


def image_format(path: Path) -> str | None:
    """`sif` or `sqsh` when the file holds such an image (by its magic bytes), else None."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(SIF_MAGIC_OFFSET + len(SIF_MAGIC))
    except OSError:
        return None
    if head[SIF_MAGIC_OFFSET:].startswith(SIF_MAGIC):
        return "sif"
    if head.startswith(SQUASHFS_MAGIC):
        return "sqsh"
    return None


def choose_format(requested: str | None, which: Callable[[str], str | None] = shutil.which) -> str:
    """--format, else what is installed: apptainer (.sif) first, then enroot (.sqsh)."""
    if requested is not None:
        if requested not in FORMATS:
            raise UserError(f"--format {requested!r}: use sif (apptainer) or sqsh (enroot)")
        if which(_TOOLS[requested]) is None:
            raise UserError(
                f"--format {requested} needs `{_TOOLS[requested]}`, which is not on PATH: load its module "
                f"(e.g. `module load {_TOOLS[requested]}`) or choose the other --format"
            )
        return requested
    for fmt in FORMATS:
        if which(_TOOLS[fmt]) is not None:
            return fmt
    raise UserError(
        "neither apptainer nor enroot is on PATH: load one (e.g. `module load apptainer`); "
        "pulling needs one of them to convert the image"
    )


def pull_argv(fmt: str, ref: ImageRef, dest: Path) -> list[str]:
    if fmt == "sif":
        return ["apptainer", "pull", _operand(str(dest)), ref.docker_uri()]
    return ["enroot", "import", "--output", _operand(str(dest)), ref.enroot_uri()]


def build_argv(definition: str, dest: Path, fakeroot: bool) -> list[str]:
    source = definition if "://" in definition else _operand(definition)  # docker://... is a reference, not a file
    return ["apptainer", "build", *(["--fakeroot"] if fakeroot else []), _operand(str(dest)), source]


def _operand(path: str) -> str:
    """A file path as an operand no tool can take for an option: `--force` (a file of that name) becomes
    `./--force`, the same file."""
    return f"./{path}" if path.startswith("-") else path


def _check_name(dest: Path, flag: str) -> None:
    """Refuse a file name longer than the file system takes (a 300-character image name): a clear error, not
    OSError 'File name too long' from the first look at it."""
    parent = next((p for p in (dest.parent, *dest.parents) if os.path.isdir(p)), Path("."))
    try:
        limit = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    longest = max((len(os.fsencode(part)) for part in (_partial(dest).name, *dest.parts)), default=0)
    if longest > limit:
        raise UserError(
            f"{dest.name[:40]}...: a file name of {longest} bytes, more than the {limit} this file system "
            f"allows; name the image file yourself with {flag} FILE"
        )


def refuse_in_allocation(force: bool, environ: Mapping[str, str] | None = None) -> None:
    environ = os.environ if environ is None else environ
    job_id = environ.get("SLURM_JOB_ID")
    if job_id and not force:
        raise UserError(
            f"this runs inside Slurm job {job_id}: converting an image here holds the job's resources "
            "(GPUs) for minutes; run it on the login node, or add --force"
        )


@dataclass(frozen=True)
class PullResult:
    path: Path
    fmt: str
    size: int
    skipped: bool
    argv: tuple[str, ...] = ()


def pull(
    ref: ImageRef,
    to: Path,
    fmt: str,
    output: Path | None = None,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
) -> PullResult:
    """Pull `ref` into to/NAME_TAG.FMT (or `output`), unless a valid image is already there."""
    dest = output or to / ref.filename(fmt)
    _check_name(dest, "--output")
    if dest.exists():
        found = image_format(dest)
        if found == fmt and dest.stat().st_size > 0:
            return PullResult(dest, fmt, dest.stat().st_size, skipped=True)
        raise UserError(
            f"{dest} exists but is not a valid .{fmt} image "
            f"({'a .' + found + ' image' if found else 'unknown content'}): "
            "remove it, or choose another --to/--output"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _partial(dest)
    return _produce(pull_argv(fmt, ref, tmp), tmp, dest, fmt, run)


def build(
    definition: str, dest: Path, fakeroot: bool, run: Callable[..., subprocess.CompletedProcess] = subprocess.run
) -> PullResult:
    if dest.suffix != ".sif":
        raise UserError(f"--output {dest}: `image build` makes apptainer images; name the file *.sif")
    if shutil.which("apptainer") is None:
        raise UserError("`image build` needs apptainer on PATH: load its module (e.g. `module load apptainer`)")
    _check_name(dest, "--output")
    if dest.exists():
        raise UserError(f"{dest} exists: remove it first, or choose another --output")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _partial(dest)
    return _produce(build_argv(definition, tmp, fakeroot), tmp, dest, "sif", run)


def _partial(dest: Path) -> Path:
    # Same folder (the rename is atomic), hidden, and still ending in .sif/.sqsh for the tools.
    return dest.with_name(f".partial-{os.getpid()}-{dest.name}")


def _produce(
    argv: list[str], tmp: Path, dest: Path, fmt: str, run: Callable[..., subprocess.CompletedProcess]
) -> PullResult:
    try:
        result = run(argv, check=False)
        if result.returncode != 0:
            raise UserError(
                f"`{shlex.join(argv[:2])}` failed (exit {result.returncode}); its messages are above. "
                "Behind a firewall, try --registry-mirror HOST"
            )
        if image_format(tmp) != fmt:
            raise UserError(
                f"`{shlex.join(argv[:2])}` finished but wrote no valid .{fmt} image: see its messages above"
            )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return PullResult(dest, fmt, dest.stat().st_size, skipped=False, argv=tuple(argv))


@dataclass(frozen=True)
class ImageFile:
    path: Path
    fmt: str | None
    size: int
    modified: dt.datetime | None


def list_images(directory: Path) -> list[ImageFile]:
    if not directory.is_dir():
        raise UserError(f"{directory} is not a directory: give the folder you pulled images --to")
    out = []
    for path in sorted(directory.iterdir()):
        if path.suffix in (".sif", ".sqsh") and path.is_file() and not path.name.startswith("."):
            st = path.stat()
            out.append(ImageFile(path, image_format(path), st.st_size, _modified(st.st_mtime)))
    return out


def _modified(mtime: float) -> dt.datetime | None:
    """A file's modification time; None when it is no date (a file system keeps years far past 9999, or before 1)."""
    try:
        return dt.datetime.fromtimestamp(mtime, dt.timezone.utc)
    except (ValueError, OverflowError, OSError):
        return None
