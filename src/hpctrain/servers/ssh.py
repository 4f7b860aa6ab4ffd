"""sshd in a session: start makes a host key for the session (ssh-keygen, on the login node, so that the host key is
known before the first login: `known_hosts` and the printed fingerprint), copies the user's public key (--ssh-key,
else the first of ~/.ssh/id_ed25519.pub, id_ecdsa.pub, id_rsa.pub) to `authorized_keys`, and writes
`sshd_config`; the job runs `sshd -D -f sshd_config` as the user on a free port (as root too, where clusters run
jobs as root: then only that user may log in, with a key).
"""

from __future__ import annotations

import getpass
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from hpctrain.errors import UserError
from hpctrain.fsutil import FileRefused, read_regular
from hpctrain.servers.common import Endpoint, tcp_banner, write_private

COMMAND = (
    "bash",
    "-c",
    'exec "$(command -v sshd || echo /usr/sbin/sshd)" -D -e -f "$HPCTRAIN_STATE_DIR/sshd_config" -p "$HPCTRAIN_PORT"',
)
SETUP_LINES = (
    "# sshd run by root wants its privilege-separation folder (made by the package's service unit).",
    'if [ "$(id -u)" = 0 ] && [ ! -d /run/sshd ]; then mkdir -m 0755 /run/sshd; fi',
)
HOST_KEY = "ssh_host_ed25519_key"
FILES = (HOST_KEY, HOST_KEY + ".pub", "authorized_keys", "known_hosts", "sshd_config")
"""What start writes into the state folder; stop removes it."""
PUBLIC_KEYS = ("id_ed25519.pub", "id_ecdsa.pub", "id_rsa.pub")
"""Looked for in ~/.ssh, in this order, when --ssh-key is not given."""
MAX_PUBLIC_KEY_BYTES = 1 << 20  # an authorized_keys-style list of public keys; a key is under 1 KiB
_PUBKEY_RE = re.compile(r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-\S+|sk-\S+)\s+[A-Za-z0-9+/=]+(\s.*)?$")


def ready(ep: Endpoint) -> bool:
    return tcp_banner(ep.node, ep.port).startswith(b"SSH-")


def find_public_key(given: Path | None, home: Path | None = None) -> Path:
    """--ssh-key, else the first of ~/.ssh/id_ed25519.pub, id_ecdsa.pub, id_rsa.pub; checked to be a public key."""
    if given is None:
        ssh_dir = (home or Path.home()) / ".ssh"
        found = [ssh_dir / n for n in PUBLIC_KEYS if (ssh_dir / n).is_file()]
        if not found:
            raise UserError(
                f"no SSH public key in {ssh_dir} ({', '.join(PUBLIC_KEYS)}): make one with "
                "`ssh-keygen -t ed25519`, or name yours with --ssh-key FILE.pub"
            )
        given = found[0]
    try:
        text = read_regular(given.expanduser(), MAX_PUBLIC_KEY_BYTES).decode("utf-8")
    except FileRefused as err:
        raise UserError(f"--ssh-key {given}: {err.reason}: give the public key file (FILE.pub)") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"--ssh-key {given}: cannot read it ({err}): give the public key file (FILE.pub)") from None
    keys = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if "PRIVATE KEY" in text or not keys or not all(_PUBKEY_RE.match(k) for k in keys):
        raise UserError(
            f"--ssh-key {given}: not an OpenSSH public key: give the .pub file (one line such as "
            "`ssh-ed25519 AAAA... you@laptop`), never the private key"
        )
    return given.expanduser()


def render_sshd_config(state_dir: Path, user: str) -> str:
    """The session's sshd_config. Pure. Only `user` may log in, only with the keys in `authorized_keys`.
    StrictModes is off because it checks every folder above the key file up to the home folder, and HPCTRAIN_HOME
    may live elsewhere (scratch): the file is hpctrain's own copy in its 0700 folder."""
    if any(c in str(state_dir) for c in '"\\\n'):
        raise UserError(
            f"{state_dir}: sshd cannot read a path with quotes, backslashes or newlines: set HPCTRAIN_HOME "
            "to a plain folder"
        )
    keys = str(state_dir / "authorized_keys").replace("%", "%%")
    return "\n".join(
        [
            "# Rendered by hpctrain for one dev session: an sshd of the user's own, on the job's node.",
            f'HostKey "{state_dir / HOST_KEY}"',
            f'AuthorizedKeysFile "{keys}"',
            f"AllowUsers {user}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "StrictModes no",
            "UsePAM no",
            "PidFile none",
            "PrintMotd no",
            "X11Forwarding no",
            "AllowTcpForwarding yes",
            "Subsystem sftp internal-sftp",
            "",
        ]
    )


def prepare(name: str, ssh_key: Path | None, state_dir: Path) -> str:
    """authorized_keys, a fresh host key and sshd_config in the state folder; returns the host's public key line."""
    if shutil.which("ssh-keygen") is None:
        raise UserError(
            "ssh-keygen is not on PATH: install the OpenSSH client (openssh-client), or use --service jupyter"
        )
    public = find_public_key(ssh_key)
    write_private(state_dir / "authorized_keys", public.read_text(encoding="utf-8").strip() + "\n")
    host_key = state_dir / HOST_KEY
    for old in (host_key, host_key.with_name(host_key.name + ".pub")):
        old.unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"hpctrain-dev-{name}", "-f", str(host_key)],
        check=True,
        capture_output=True,
    )
    write_private(state_dir / "sshd_config", render_sshd_config(state_dir, getpass.getuser()))
    return host_key.with_name(host_key.name + ".pub").read_text(encoding="utf-8").strip()


def alias(name: str) -> str:
    return f"hpctrain-dev-{name}"


def config_snippet(name: str, node: str, port: int, user: str, login: str) -> str:
    """The ~/.ssh/config block for the session (VS Code Remote-SSH reads it too). Pure."""
    lines = [
        f"Host {alias(name)}",
        f"    HostName {node}",
        f"    Port {port}",
        f"    User {user}",
        f"    ProxyJump {login}",
        f"    HostKeyAlias {alias(name)}",
    ]
    return "\n".join(lines) + "\n"


def connection(name: str, state_dir: Path, host_key: str, endpoint: Endpoint, login: str) -> dict[str, Any]:
    """What a user needs to log in, for connection.json; writes the session's known_hosts line too."""
    user = getpass.getuser()
    known = f"{alias(name)} {' '.join(host_key.split()[:2])}"
    write_private(state_dir / "known_hosts", known + "\n")
    return {
        "user": user,
        "host_key": host_key,
        "host_key_fingerprint": fingerprint(state_dir / (HOST_KEY + ".pub")),
        "ssh": shlex.join(["ssh", "-J", login, "-p", str(endpoint.port), f"{user}@{endpoint.node}"]),
        "ssh_config": config_snippet(name, endpoint.node, endpoint.port, user, login),
        "known_hosts": known,
    }


def fingerprint(public_key: Path) -> str:
    result = subprocess.run(["ssh-keygen", "-l", "-f", str(public_key)], capture_output=True, text=True, check=False)
    words = result.stdout.split()
    return words[1] if len(words) > 1 else "?"
