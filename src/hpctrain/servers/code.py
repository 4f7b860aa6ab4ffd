"""A VS Code tunnel in a session: the job runs `code tunnel --accept-server-license-terms --name NAME` (the VS Code
CLI, which must be on the compute node's PATH); start shows its device-login line and waits for its vscode.dev URL.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Callable
from pathlib import Path

from hpctrain.servers.common import Endpoint
from hpctrain.servers.sessions import check_name

COMMAND = (
    "bash",
    "-c",
    "if ! command -v code >/dev/null 2>&1; then "
    'echo "hpctrain: the VS Code CLI (code) is not on PATH on $(hostname): install it there (the standalone CLI from '
    'the VS Code download page), load its module with --module, or use --service ssh" >&2; exit 127; fi; '
    'exec code tunnel --accept-server-license-terms --name "$HPCTRAIN_TUNNEL_NAME"',
)
LOGIN_RE = re.compile(r"To grant access to the server, please log into (?P<url>\S+) and use code (?P<code>\S+)")
URL_RE = re.compile(r"Open this link in your browser (?P<url>https://\S+)")
TUNNEL_NAME_MAX = 20


def tunnel_name(session: str) -> str:
    """The VS Code tunnel's name: `dev-SESSION`, cut to the CLI's 20 characters with a short hash of the session
    name in place of the cut, so that two long names stay apart. Session names are [a-z0-9-], valid here too."""
    name = f"dev-{check_name(session)}"
    if len(name) <= TUNNEL_NAME_MAX:
        return name
    digest = hashlib.sha256(session.encode()).hexdigest()[:4]
    return f"{name[: TUNNEL_NAME_MAX - 5].rstrip('-')}-{digest}"


def setup_lines(session: str) -> list[str]:
    return [f"export HPCTRAIN_TUNNEL_NAME={shlex.quote(tunnel_name(session))}"]


class TunnelWatch:
    """Readiness of `code tunnel`: its vscode.dev URL in the job's output. Says the device-login line once, as soon
    as it appears, because the URL only comes after the user has logged in."""

    def __init__(self, output: Path, say: Callable[[str], None]) -> None:
        self.path = output
        self.say = say
        self.login: str | None = None
        self.url: str | None = None

    def __call__(self, endpoint: Endpoint) -> bool:
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False
        login = LOGIN_RE.search(text)
        if login and self.login is None:
            self.login = login.group(0)
            self.say(f"VS Code asks you to log in: open {login['url']} and enter the code {login['code']}")
        url = URL_RE.search(text)
        self.url = url["url"] if url else None
        return self.url is not None
