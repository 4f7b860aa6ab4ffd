"""What scripts/local-k8s.sh does in Python: kubeconfig files and a few API calls, without kubectl.

    python3 kubeapi.py free-ports N
    python3 kubeapi.py write-kubeconfig OUT --context NAME --server URL --ca FILE --token-file FILE
    python3 kubeapi.py merge-kubeconfig STANDALONE TARGET
    python3 kubeapi.py remove-context NAME TARGET
    python3 kubeapi.py has-context NAME TARGET
    python3 kubeapi.py apply KUBECONFIG FILE...           create or replace the objects in FILE (YAML or JSON)
    python3 kubeapi.py wait-established KUBECONFIG SECONDS CRD_NAME...
    python3 kubeapi.py crd-status KUBECONFIG CRD_NAME...  one line per CRD; exit 1 unless all are Established

KUBECONFIG is the standalone file that write-kubeconfig wrote (its only context is used). Only the standard
library and PyYAML (Debian: python3-yaml). Kubeconfig files are written whole (temporary file, then rename) with
mode 0600; merging keeps every other cluster, user and context, as `kind` and `kubectl config` do.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import yaml

SECTIONS = (("clusters", "cluster"), ("users", "user"), ("contexts", "context"))


class Failure(Exception):
    """A problem to report in one line (exit status 1)."""


# --- kubeconfig files ---------------------------------------------------------


def write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def load_config(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise Failure(f"{path} is not valid YAML ({exc}); fix or move it, then run again") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise Failure(f"{path} is not a kubeconfig (not a mapping); fix or move it, then run again")
    return data


def dump_config(path: Path, config: dict) -> None:
    write_private(path, yaml.safe_dump(config, default_flow_style=False, sort_keys=False))


def standalone_config(context: str, server: str, ca_pem: bytes, token: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": context,
                "cluster": {"server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()},
            }
        ],
        "users": [{"name": context, "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        "current-context": context,
        "preferences": {},
    }


def without_name(entries: object, name: str) -> list:
    return [e for e in (entries or []) if not (isinstance(e, dict) and e.get("name") == name)]


def merged(target: dict, standalone: dict) -> dict:
    """`target` with the standalone file's cluster, user and context added (replacing same-named ones), current."""
    out = {"apiVersion": "v1", "kind": "Config", "preferences": {}, **target}
    for section, _ in SECTIONS:
        new = standalone.get(section) or []
        names = {e["name"] for e in new}
        kept = [e for e in (out.get(section) or []) if not (isinstance(e, dict) and e.get("name") in names)]
        out[section] = kept + new
    out["current-context"] = standalone["current-context"]
    return out


def removed(target: dict, name: str) -> dict:
    """`target` without the cluster, user and context called `name`; no current context if it was that one."""
    out = dict(target)
    for section, _ in SECTIONS:
        if section in out:
            out[section] = without_name(out[section], name)
    if out.get("current-context") == name:
        out["current-context"] = ""
    return out


# --- the API server -------------------------------------------------------------


class Api:
    """Bearer-token HTTPS calls to the server of a standalone kubeconfig."""

    def __init__(self, kubeconfig: Path) -> None:
        config = load_config(kubeconfig)
        try:
            cluster = config["clusters"][0]["cluster"]
            self.server = cluster["server"].rstrip("/")
            ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
            self.token = config["users"][0]["user"]["token"]
        except (KeyError, IndexError, TypeError):
            raise Failure(f"{kubeconfig} is not a kubeconfig written by local-k8s.sh") from None
        self.ssl = ssl.create_default_context(cadata=ca)

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, context=self.ssl, timeout=30) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw)
            except ValueError:
                return exc.code, {"message": raw.decode(errors="replace")}
        except OSError as exc:
            raise Failure(f"cannot reach {self.server}: {exc}") from None

    def collection(self, api_version: str, kind: str, namespace: str | None) -> str:
        """The URL path of the collection of `kind` objects, found through discovery."""
        prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        status, body = self.call("GET", prefix)
        if status != 200:
            raise Failure(f"the server does not serve {api_version}: {body.get('message', status)}")
        for resource in body.get("resources", []):
            if resource.get("kind") == kind and "/" not in resource["name"]:
                if resource.get("namespaced"):
                    return f"{prefix}/namespaces/{namespace or 'default'}/{resource['name']}"
                return f"{prefix}/{resource['name']}"
        raise Failure(f"the server has no resource of kind {kind} in {api_version}")

    def apply(self, obj: dict) -> str:
        """Create `obj`, or replace the existing object of that name; return what was done."""
        meta = obj.get("metadata", {})
        base = self.collection(obj["apiVersion"], obj["kind"], meta.get("namespace"))
        name = meta["name"]
        status, body = self.call("POST", base, obj)
        if status == 201:
            return "created"
        if status != 409:
            raise Failure(f"creating {obj['kind']} {name} failed: {body.get('message', status)}")
        status, current = self.call("GET", f"{base}/{name}")
        if status != 200:
            raise Failure(f"reading {obj['kind']} {name} failed: {current.get('message', status)}")
        replacement = {**obj, "metadata": {**meta, "resourceVersion": current["metadata"]["resourceVersion"]}}
        status, body = self.call("PUT", f"{base}/{name}", replacement)
        if status != 200:
            raise Failure(f"replacing {obj['kind']} {name} failed: {body.get('message', status)}")
        return "replaced"

    def crd_established(self, name: str) -> bool | None:
        """True/False from the CRD's Established condition (False while it is being deleted); None when there is
        no such CRD."""
        status, body = self.call("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        if status == 404:
            return None
        if status != 200:
            raise Failure(f"reading CRD {name} failed: {body.get('message', status)}")
        if body.get("metadata", {}).get("deletionTimestamp"):
            return False  # being deleted
        conditions = body.get("status", {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


# --- commands -------------------------------------------------------------------


def cmd_free_ports(count: str) -> None:
    with ExitStack() as stack:
        ports = []
        for _ in range(int(count)):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    print(" ".join(map(str, ports)))


def cmd_write_kubeconfig(out: str, *options: str) -> None:
    opts = dict(zip(options[::2], options[1::2]))
    ca_pem = Path(opts["--ca"]).read_bytes()
    token = Path(opts["--token-file"]).read_text().strip()
    dump_config(Path(out), standalone_config(opts["--context"], opts["--server"], ca_pem, token))


def cmd_merge_kubeconfig(standalone: str, target: str) -> None:
    dump_config(Path(target), merged(load_config(Path(target)), load_config(Path(standalone))))


def cmd_remove_context(name: str, target: str) -> None:
    path = Path(target)
    if path.exists():
        dump_config(path, removed(load_config(path), name))


def cmd_has_context(name: str, target: str) -> None:
    config = load_config(Path(target))
    if not any(isinstance(c, dict) and c.get("name") == name for c in config.get("contexts") or []):
        raise SystemExit(1)


def cmd_apply(kubeconfig: str, *files: str) -> None:
    api = Api(Path(kubeconfig))
    for name in files:
        for obj in yaml.safe_load_all(Path(name).read_text()):
            if obj:
                print(f"{obj['kind']} {obj['metadata']['name']} {api.apply(obj)}")


def cmd_wait_established(kubeconfig: str, seconds: str, *names: str) -> None:
    api = Api(Path(kubeconfig))
    deadline = time.monotonic() + float(seconds)
    pending = list(names)
    while pending:
        pending = [name for name in pending if not api.crd_established(name)]
        if pending and time.monotonic() > deadline:
            raise Failure(f"CRDs not Established after {seconds} s: {', '.join(pending)}")
        if pending:
            time.sleep(0.5)


def cmd_crd_status(kubeconfig: str, *names: str) -> None:
    api = Api(Path(kubeconfig))
    ok = True
    for name in names:
        state = api.crd_established(name)
        ok = ok and bool(state)
        print(f"  {name}: {'Established' if state else 'missing' if state is None else 'not Established'}")
    if not ok:
        raise SystemExit(1)


COMMANDS = {
    "free-ports": cmd_free_ports,
    "write-kubeconfig": cmd_write_kubeconfig,
    "merge-kubeconfig": cmd_merge_kubeconfig,
    "remove-context": cmd_remove_context,
    "has-context": cmd_has_context,
    "apply": cmd_apply,
    "wait-established": cmd_wait_established,
    "crd-status": cmd_crd_status,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        COMMANDS[argv[0]](*argv[1:])
    except Failure as exc:
        print(f"kubeapi.py: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
