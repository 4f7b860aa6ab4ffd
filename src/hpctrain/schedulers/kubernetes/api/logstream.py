"""Reading a pod's log as the API server streams it (`hpctrain logs`, `submit --follow`): lines as they come, a
stream that breaks off as one line naming it, and the kubelet's word that the log is gone said as such.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from hpctrain.errors import UserError

# What the kubelet answers for a container it no longer has (pkg/kubelet/kuberuntime GetContainerLogs: the runtime
# knows no such container once the pod was deleted), in place of the log.
_LOG_GONE = re.compile(r"unable to retrieve container logs for [a-z-]+://\S+")


class LogGone(UserError):
    """The pod's log went with its container (the pod was deleted as it was read)."""


def log_lines(resp: Any, pod: str) -> Iterator[str]:
    """The log's lines. A log that is only the kubelet's "unable to retrieve container logs for containerd://ID" (its
    answer once the container is removed: kuberuntime GetContainerLogs) is no log: the pod went with its container."""
    lines = _stream_lines(resp, pod)
    first = next(lines, None)
    if first is not None and _LOG_GONE.fullmatch(first.strip()):
        second = next(lines, None)
        if second is None:
            raise LogGone(
                f"the log of pod {pod} is gone: the pod was deleted with its container (the kubelet: "
                f"{first.strip()}); a job's running pods go when it is cancelled or ends (cleanPodPolicy "
                "Running): follow the log while the job runs (`logs -f`); the run directory keeps what "
                "the run wrote"
            )
        yield first
        first = second
    if first is not None:
        yield first
        yield from lines


def _stream_lines(resp: Any, pod: str) -> Iterator[str]:
    import urllib3

    buffer = b""
    try:
        for chunk in resp.stream(amt=65536, decode_content=True):
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for line in complete:
                yield line.decode("utf-8", "replace")
        if buffer:
            yield buffer.decode("utf-8", "replace")
    except urllib3.exceptions.HTTPError as err:
        raise UserError(
            f"the log of pod {pod} broke off ({type(err).__name__}: {' '.join(str(err).split())[:200]}): "
            "run the command again"
        ) from None
    finally:
        resp.release_conn()
