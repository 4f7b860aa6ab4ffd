"""KubernetesOptions: what a Kubernetes job needs beyond the scheduler-neutral JobSpec, validated once, here.

Every error names the flag and the form it wants. Nothing here talks to a cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from hpctrain.errors import UserError

APIS = ("pytorchjob", "trainjob")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

# Kubernetes name rules (apimachinery validation): DNS-1123 labels and subdomains.
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_LABEL_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")  # a label that starts with a letter
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?)$")
_QUANTITY_RE = re.compile(r"^(?P<n>[0-9]+(\.[0-9]*)?|\.[0-9]+)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_SUFFIX = {
    None: Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
VOLUME_FORMS = "pvc:CLAIM:/mount[:ro], nfs:SERVER:/export/path:/mount[:ro] or host:/node/path:/mount[:ro]"


def parse_quantity(text: str | int | float) -> Decimal:
    """A Kubernetes quantity (`500m`, `4`, `16Gi`, `8G`) -> its value (cores or bytes). Raises ValueError."""
    m = _QUANTITY_RE.match(str(text).strip()) if len(str(text)) <= 64 else None
    if not m:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    try:
        return Decimal(m["n"]) * _SUFFIX[m["suffix"]]
    except InvalidOperation as err:
        raise ValueError(f"{text!r} is not a Kubernetes quantity") from err


def quantity_mb(mb: int) -> str:
    """Megabytes -> the exact Kubernetes quantity a manifest carries: `16Gi`, `1536Mi`."""
    return f"{mb // 1024}Gi" if mb % 1024 == 0 else f"{mb}Mi"


def memory_quantity(mem_bytes: int) -> str:
    """A job's memory in bytes -> its quantity in whole Mi, rounded up (`1500K` asks for 2Mi)."""
    return quantity_mb(-(-mem_bytes // (1 << 20)))


def check_dns_label(what: str, value: str, fix: str) -> None:
    if not isinstance(value, str) or len(value) > 63 or not _DNS_LABEL_RE.match(value):
        raise UserError(
            f"{what} {value!r} is not a valid Kubernetes name (lower-case letters, digits and -, "
            f"starting and ending with a letter or digit, at most 63 characters): {fix}"
        )


def check_dns1035_label(what: str, value: str, fix: str) -> None:
    """A DNS-1035 label (apimachinery IsDNS1035Label): what Kubeflow requires of a job's name."""
    if not isinstance(value, str) or len(value) > 63 or not _DNS1035_LABEL_RE.match(value):
        raise UserError(
            f"{what} {value!r} is not a valid Kubeflow job name (lower-case letters, digits and -, "
            f"starting with a letter and ending with a letter or digit, at most 63 characters): {fix}"
        )


def check_dns_subdomain(what: str, value: str, fix: str) -> None:
    if not isinstance(value, str) or len(value) > 253 or not _DNS_SUBDOMAIN_RE.fullmatch(value):
        raise UserError(
            f"{what} {value!r} is not a valid Kubernetes name (lower-case letters, digits, - and ., "
            f"at most 253 characters): {fix}"
        )


def _check_label_key(what: str, key: str) -> None:
    prefix, _, name = key.rpartition("/")
    if (
        (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.match(prefix)))
        or not name
        or len(name) > 63
        or not _LABEL_NAME_RE.match(name)
    ):
        raise UserError(
            f"{what}: {key!r} is not a valid label key ([PREFIX/]NAME, NAME of letters, digits, - _ ., "
            "at most 63 characters)"
        )


def _check_label_value(what: str, value: str) -> None:
    if len(value) > 63 or not _LABEL_VALUE_RE.match(value):
        raise UserError(f"{what}: {value!r} is not a valid label value (letters, digits, - _ ., at most 63 characters)")


@dataclass(frozen=True)
class Volume:
    """One parsed --volume: a PVC, an NFS export or a node's host path, mounted at `mount` in every pod."""

    kind: str
    """pvc, nfs or host"""
    source: str
    """claim name (pvc), export path (nfs) or node path (host)"""
    mount: str
    server: str | None = None
    read_only: bool = False

    @property
    def shared(self) -> bool:
        """Visible to every replica: a PVC (ReadWriteMany is checked live) or NFS. A host path is shared only when
        the node path is itself a network file system on every node, as on platforms with a NAS at /mnt."""
        return self.kind in ("pvc", "nfs", "host")


def parse_volume(spec: str) -> Volume:
    if not isinstance(spec, str):
        raise UserError(f"--volume {spec!r}: use {VOLUME_FORMS}")
    parts = spec.split(":")
    read_only = False
    if parts[-1] in ("ro", "rw"):
        read_only = parts.pop() == "ro"
    kind = parts[0]
    if kind == "pvc" and len(parts) == 3:
        volume = Volume("pvc", parts[1], parts[2], read_only=read_only)
        check_dns_subdomain(
            "--volume claim", volume.source, f"give the PVC's name as `kubectl get pvc` shows it ({spec!r})"
        )
    elif kind == "nfs" and len(parts) == 4:
        volume = Volume("nfs", parts[2], parts[3], server=parts[1], read_only=read_only)
        if not volume.server or not volume.source.startswith("/"):
            raise UserError(
                f"--volume {spec!r}: nfs needs a server and an absolute export path (nfs:SERVER:/export:/mount)"
            )
    elif kind == "host" and len(parts) == 3:
        volume = Volume("host", parts[1], parts[2], read_only=read_only)
        if not volume.source.startswith("/"):
            raise UserError(f"--volume {spec!r}: the node path must be absolute (host:/mnt/share/team:/mnt/share/team)")
    else:
        raise UserError(f"--volume {spec!r}: use {VOLUME_FORMS}")
    if not volume.mount.startswith("/") or volume.mount.rstrip("/") in ("", "/dev/shm"):
        raise UserError(
            f"--volume {spec!r}: the mount path must be an absolute directory other than / and /dev/shm "
            "(use --shm for that)"
        )
    return volume


def parse_toleration(spec: str) -> dict[str, str]:
    """KEY[=VALUE][:EFFECT] -> a toleration (Equal with a value, Exists without; any effect when none is given)."""
    text, _, effect = spec.rpartition(":") if ":" in spec else (spec, "", "")
    key, eq, value = text.partition("=")
    if effect and effect not in TOLERATION_EFFECTS:
        raise UserError(
            f"--toleration {spec!r}: the effect must be one of {', '.join(TOLERATION_EFFECTS)} (KEY[=VALUE][:EFFECT])"
        )
    _check_label_key(f"--toleration {spec!r}", key)
    if eq:
        _check_label_value(f"--toleration {spec!r}", value)
    out = {"key": key, "operator": "Equal" if eq else "Exists"}
    if eq:
        out["value"] = value
    if effect:
        out["effect"] = effect
    return out


def parse_key_value(flag: str, spec: str) -> tuple[str, str]:
    key, eq, value = spec.partition("=") if isinstance(spec, str) else ("", "", "")
    if not eq:
        raise UserError(f"{flag} {spec!r}: use KEY=VALUE (e.g. {flag} nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB)")
    _check_label_key(f"{flag} {spec!r}", key)
    _check_label_value(f"{flag} {spec!r}", value)
    return key, value


@dataclass(frozen=True)
class KubernetesOptions:
    namespace: str = "default"
    api: str = "pytorchjob"
    """pytorchjob: Kubeflow PyTorchJob (kubeflow.org/v1); trainjob: Kubeflow Trainer v2 TrainJob (v1alpha1)."""
    image: str | None = None
    """Container image every replica runs (e.g. nvcr.io/nvidia/pytorch:24.05-py3 with hpctrain installed)."""
    shm: str | None = None
    """Size of /dev/shm (an in-memory emptyDir): DataLoader workers need more than the container default 64M."""
    priority_class: str | None = None
    volumes: tuple[str, ...] = ()
    """--volume specs (VOLUME_FORMS)."""
    node_selector: tuple[str, ...] = ()
    tolerations: tuple[str, ...] = ()
    service_account: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    """Extra KEY=VALUE labels on the job and its pods."""
    runtime: str = "torch-distributed"
    """TrainJob only: the ClusterTrainingRuntime to run on."""
    replace: bool | None = None
    """submit: delete a job of the same name first (running or ended, with its pods), then create this one."""

    def __post_init__(self) -> None:
        check_dns_label("--namespace", self.namespace, "use the namespace `kubectl get namespaces` lists")
        if self.api not in APIS:
            raise UserError(f"--k8s-api {self.api!r} is unknown: use pytorchjob (Kubeflow v1) or trainjob (Trainer v2)")
        if self.image is not None and (
            not isinstance(self.image, str) or not self.image.strip() or any(c.isspace() for c in self.image)
        ):
            raise UserError(
                f"--image {self.image!r} is not an image reference (e.g. --image nvcr.io/nvidia/pytorch:24.05-py3)"
            )
        if self.shm is not None:
            try:
                size = parse_quantity(self.shm)
            except ValueError:
                raise UserError(
                    f"--shm {self.shm!r} is not a size: use a Kubernetes quantity such as 8Gi or 512Mi"
                ) from None
            if size < 2**20:
                raise UserError(f"--shm {self.shm!r} is below 1Mi: give the size with a unit, e.g. --shm 8Gi")
            if size > 2**50:
                raise UserError(f"--shm {self.shm!r} is more than 1Pi, beyond any node: give a size such as --shm 8Gi")
        if self.priority_class is not None:
            check_dns_subdomain(
                "--priority-class", self.priority_class, "use a name `kubectl get priorityclasses` lists"
            )
        if self.service_account is not None:
            check_dns_subdomain(
                "--service-account", self.service_account, "use a name `kubectl get serviceaccounts` lists"
            )
        for secret in self.image_pull_secrets:
            check_dns_subdomain("--image-pull-secret", secret, "use a secret name `kubectl get secrets` lists")
        if self.replace not in (None, True, False):
            raise UserError(f"replace must be true or false (got {self.replace!r})")
        check_dns_label("runtime", self.runtime, "use a ClusterTrainingRuntime name (e.g. torch-distributed)")
        for name in ("volumes", "node_selector", "tolerations", "image_pull_secrets", "labels"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                raise UserError(f"{name} must be a list of strings (got {value!r})")
        mounts = [v.mount.rstrip("/") for v in self.parsed_volumes]
        duplicate = sorted({m for m in mounts if mounts.count(m) > 1})
        if duplicate:
            raise UserError(f"--volume: {', '.join(duplicate)} is mounted twice: give each mount path once")
        self.node_selector_map
        self.toleration_list
        self.label_map

    @property
    def parsed_volumes(self) -> tuple[Volume, ...]:
        return tuple(parse_volume(v) for v in self.volumes)

    @property
    def node_selector_map(self) -> dict[str, str]:
        return dict(parse_key_value("--node-selector", s) for s in self.node_selector)

    @property
    def toleration_list(self) -> list[dict[str, str]]:
        return [parse_toleration(s) for s in self.tolerations]

    @property
    def label_map(self) -> dict[str, str]:
        return dict(parse_key_value("--label", s) for s in self.labels)

    @property
    def shm_bytes(self) -> int | None:
        return None if self.shm is None else int(parse_quantity(self.shm))
