"""Write a one-layer OCI image archive from local files, for `ctr images import`.

No registry is reachable on the machines scripts/local-k8s.sh runs on, so its
images (the pause image, the host-environment training image) are made here:
an OCI image layout (oci-layout, index.json, blobs/sha256/...) in a tar file
whose index names the image, which containerd imports as is.

    oci_image.py OUT.tar NAME [--entrypoint JSON] [--env K=V]... [--file SRC:DEST[:MODE]]...
                 [--dir DEST]... [--symlink DEST:TARGET]...

NAME is the full reference (e.g. localhost/hpctrain/pause:3.4.1); DEST paths
are absolute paths inside the image. Timestamps are fixed, so the same inputs
give the same image digest.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

MTIME = 0
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def _member(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.type, info.mode, info.mtime = kind, mode, MTIME
    return info


def layer_bytes(files: list[tuple[Path, str, int]], dirs: list[str], links: list[tuple[str, str]]) -> bytes:
    """An uncompressed layer tar: the directories, then the symlinks, then the files."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(dirs):
            tar.addfile(_member(d, tarfile.DIRTYPE, 0o755))
        for dest, target in links:
            info = _member(dest, tarfile.SYMTYPE, 0o777)
            info.linkname = target
            tar.addfile(info)
        for src, dest, mode in files:
            data = src.read_bytes()
            info = _member(dest, tarfile.REGTYPE, mode)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def image_layout(name: str, layer: bytes, entrypoint: list[str], env: list[str]) -> dict[str, bytes]:
    """The files of an OCI image layout holding one image called `name`."""
    blobs: dict[str, bytes] = {}
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": env},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": _blob(blobs, json.dumps(config, sort_keys=True).encode(), MEDIA_CONFIG),
        "layers": [_blob(blobs, layer, MEDIA_LAYER)],
    }
    descriptor = _blob(blobs, json.dumps(manifest, sort_keys=True).encode(), MEDIA_MANIFEST)
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    descriptor["platform"] = {"architecture": "amd64", "os": "linux"}
    descriptor["annotations"] = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag}
    index = {"schemaVersion": 2, "manifests": [descriptor]}
    files = {f"blobs/sha256/{d.split(':', 1)[1]}": data for d, data in blobs.items()}
    files["oci-layout"] = json.dumps({"imageLayoutVersion": "1.0.0"}).encode()
    files["index.json"] = json.dumps(index, sort_keys=True).encode()
    return files


def write_archive(out: Path, files: dict[str, bytes]) -> None:
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, mode="w") as tar:
        for d in ("blobs", "blobs/sha256"):
            tar.addfile(_member(d, tarfile.DIRTYPE, 0o755))
        for name, data in sorted(files.items()):
            info = _member(name, tarfile.REGTYPE, 0o644)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out)


def _file_spec(spec: str) -> tuple[Path, str, int]:
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise argparse.ArgumentTypeError(f"--file wants SRC:DEST[:MODE], not {spec!r}")
    mode = int(parts[2], 8) if len(parts) == 3 else 0o644
    return Path(parts[0]), parts[1], mode


def _link_spec(spec: str) -> tuple[str, str]:
    dest, sep, target = spec.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"--symlink wants DEST:TARGET, not {spec!r}")
    return dest, target


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("name")
    parser.add_argument("--entrypoint", default="[]", type=json.loads)
    parser.add_argument("--env", action="append", default=[])
    parser.add_argument("--file", action="append", default=[], type=_file_spec)
    parser.add_argument("--dir", action="append", default=[])
    parser.add_argument("--symlink", action="append", default=[], type=_link_spec)
    args = parser.parse_args(argv)
    layer = layer_bytes(args.file, args.dir, args.symlink)
    write_archive(args.out, image_layout(args.name, layer, args.entrypoint, args.env))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
