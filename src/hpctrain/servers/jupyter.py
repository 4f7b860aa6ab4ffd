"""JupyterLab in a session: the command the job (or pod) runs, when it is ready, and how long it has sat idle."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable

from hpctrain.servers.common import Endpoint, http_get

POD_PORT = 8888
COMMAND = (
    "bash",
    "-c",
    'root=""; if [ "$(id -u)" = 0 ]; then root=--allow-root; fi; '
    'exec jupyter lab --no-browser --ip=0.0.0.0 --port="$HPCTRAIN_PORT" --port-retries=0 $root',
)


def setup_lines(token_file: str) -> list[str]:
    """Lines of the batch script before the server starts: the token from its private file into the environment."""
    return [
        "# The token comes from a private file into the environment: never on a command line.",
        f'JUPYTER_TOKEN="$(cat "$state_dir/{token_file}")"',
        "export JUPYTER_TOKEN",
        'export JUPYTER_RUNTIME_DIR="$state_dir/runtime"',
    ]


def ready(token: str) -> Callable[[Endpoint], bool]:
    return lambda ep: http_get(f"http://{ep.node}:{ep.port}/api/status", token)[0] == 200


def url(local_port: int, token: str) -> str:
    return f"http://localhost:{local_port}/lab?token={token}"


def idle_seconds(host: str, port: int, token: str | None, now: dt.datetime | None = None) -> int | None:
    """Seconds since the server's last_activity (Jupyter's /api/status: the latest of kernel, terminal and API
    activity); None when it does not answer."""
    status, body = http_get(f"http://{host}:{port}/api/status", token)
    if status != 200:
        return None
    try:
        last = parse_iso(json.loads(body)["last_activity"])
    except (ValueError, KeyError, TypeError):
        return None
    now = now or dt.datetime.now(dt.timezone.utc)
    return max(0, int((now - last).total_seconds()))


def parse_iso(text: str) -> dt.datetime:
    """Jupyter's timestamps: ISO 8601 with `Z` or an offset."""
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
