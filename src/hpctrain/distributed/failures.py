"""When a collective fails (a peer crashed, was killed, or hangs past the timeout), say which rank went missing.

The backends' own errors name a socket ("Connection closed by peer [10.1.2.3]:41234") or only a timeout, and
which collective times out first is a matter of timing: the gradient all-reduce inside `loss.backward()`, the stop
vote, evaluation's sums or a checkpoint's gather. So every collective of the loop runs inside `collective(what)`,
which marks a failure there as a peer failure whatever the backend's words, and `peer_failures` turns it into one
message naming the collective, the missing ranks and their hosts.

After the failure the process group itself is unusable, but the rendezvous store (a separate TCP connection)
usually still works: every surviving rank writes a roll-call key there, waits briefly for the others, and the
ranks whose keys never appear are the missing ones. Each rank leaves its host name in the store when it joins
(`announce`), so the message can say where the missing one ran.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Iterator

from hpctrain.distributed.environment import DistEnv
from hpctrain.errors import UserError

ROLL_CALL_MAX_S = 30.0

# What the backends say when a peer has gone, collected from their sources:
# - gloo (gloo/transport/tcp/pair.cc, unbound_buffer.cc): "Timed out waiting 5000ms for recv operation to
#   complete", "Application timeout caused pair closure" (every other pending operation of a context whose peer
#   timed out), "Connection closed by peer [addr]", "Read error [addr]: Connection reset by peer", "Read timeout",
#   "Write timeout", "writev [addr]: Broken pipe";
# - torch's ProcessGroupNCCL: "Watchdog caught collective operation timeout: WorkNCCL(...) ran for N
#   milliseconds", "NCCL communicator was aborted on rank N", "ncclRemoteError: A call failed possibly due to a
#   network error or a remote process exiting prematurely", "Some NCCL operations have failed or timed out",
#   "NCCL operation timed out";
# - torch's TCPStore: "Socket Timeout", "Failed to recv, got 0 bytes. Connection was likely closed".
# ("Timed out"/"timed out" cover gloo's "Timed out waiting" and NCCL's "... failed or timed out".)
PEER_FAILURE_SIGNS = (
    "Timed out",
    "timed out",
    "Application timeout caused pair closure",
    "Connection closed by peer",
    "Read error",
    "Read timeout",
    "Write timeout",
    "writev",
    "Connection reset by peer",
    "Broken pipe",
    "collective operation timeout",
    "NCCL communicator was aborted",
    "ncclRemoteError",
    "Socket Timeout",
    "Connection was likely closed",
)

_HOST_KEY = "hpctrain/host"


class CollectiveFailure(UserError):
    """Training stopped because another rank did not take part in a collective. `seen_at`: time.time() when this rank
    first saw the failure (before the roll call that names the missing ranks)."""

    exit_code = 1
    seen_at: float = 0.0


class PeerLost(RuntimeError):
    """A collective failed: raised by `collective` in place of the backend's error, caught by `peer_failures`."""

    def __init__(self, what: str, error: BaseException) -> None:
        super().__init__(f"{what}: {error}")
        self.what = what
        self.error = error


def looks_like_peer_failure(err: BaseException) -> bool:
    """A distributed error caused by another process (as opposed to a bug in this one)."""
    import torch.distributed as dist

    if isinstance(err, PeerLost | getattr(dist, "DistError", PeerLost)):
        return True
    text = str(err)
    return any(sign in text for sign in PEER_FAILURE_SIGNS)


@contextlib.contextmanager
def collective(what: str, *, only_known: bool = False) -> Iterator[None]:
    """Run one collective (or a step that contains one): any error inside is taken as a peer failure in `what`.

    `only_known`: for code that also computes (DDP's backward holds the gradient all-reduce, its forward the
    buffer broadcast), only errors that read like a peer failure are; a bug there keeps its own traceback.

    While inside, `current_collective()` names it and counts it (the hang watchdog reads both from its own
    thread: every rank enters the same collectives in the same order, so a rank that entered fewer is behind)."""
    global _current, _entered
    outer, _current = _current, what
    _entered += 1
    try:
        yield
    except PeerLost:
        raise
    except Exception as err:
        if only_known and not looks_like_peer_failure(err):
            raise
        raise PeerLost(what, err) from err
    finally:
        _current = outer


_current: str | None = None
_entered = 0


def current_collective() -> tuple[str | None, int]:
    """The `collective()` the main thread is in now, if any ("the stop vote after step 12", ...), and how many
    this process has entered so far."""
    return _current, _entered


@contextlib.contextmanager
def peer_failures(env: DistEnv, timeout_s: float) -> Iterator[None]:
    """Turn a failed collective inside into a `CollectiveFailure` that names the missing ranks (a no-op for one
    process)."""
    try:
        yield
    except PeerLost as lost:
        raise explain(lost.error, env, timeout_s, lost.what) from lost.error
    except RuntimeError as err:  # a collective outside `collective()`: recognized by the backend's words
        if env.is_distributed and looks_like_peer_failure(err):
            raise explain(err, env, timeout_s) from err
        raise


def announce(env: DistEnv) -> None:
    """Leave this rank's host name in the default store (after joining the group), for `explain`."""
    if not env.is_distributed:
        return
    import torch.distributed as dist

    with contextlib.suppress(Exception):  # only a message gets poorer without it
        dist.distributed_c10d._get_default_store().set(f"{_HOST_KEY}/{env.rank}", socket.gethostname())


def missing_ranks(env: DistEnv, wait_s: float) -> dict[int, str | None] | None:
    """Roll call through the default store: each missing rank with its host (None if unknown); None when the
    store is gone too (it lives with rank 0 or the agent).

    O(1) store requests a rank while it waits, O(N) in all: each rank counts itself in (one `add`) and polls the
    count; only when ranks are still missing at the deadline does one rank, the first to answer, look up which
    (one request per rank, once) and leave the list in the store, where the others read it in one request. (Before,
    every rank checked every rank's key every 0.2 s: N² requests per poll.)

    A process fails at most once, so one roll call per attempt (torchrun restarts keep their store: the restart
    count keeps attempts apart)."""
    import datetime
    import json

    import torch.distributed as dist

    try:
        store = dist.distributed_c10d._get_default_store()
        prefix = f"hpctrain/roll-call/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        store.set(f"{prefix}/{env.rank}", "present")
        first = store.add(f"{prefix}/count", 1) == 1
        deadline = time.monotonic() + wait_s
        while store.add(f"{prefix}/count", 0) < env.world_size:
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        else:
            return {}
        verdict = f"{prefix}/missing"
        if not first:
            try:
                store.wait([verdict], datetime.timedelta(seconds=wait_s + 5.0))
                listed = json.loads(store.get(verdict))
                return {int(r): host for r, host in listed.items() if int(r) != env.rank}  # not one arrived late
            except Exception:  # the first rank went too: look for ourselves
                pass
        hosts: dict[int, str | None] = {}
        for r in range(env.world_size):
            if not _present(store, f"{prefix}/{r}"):
                key = f"{_HOST_KEY}/{r}"
                hosts[r] = store.get(key).decode(errors="replace") if _present(store, key) else None
        if first:
            store.set(verdict, json.dumps(hosts))
        return hosts
    except Exception:  # the store's own errors vary by transport; any of them means no answer
        return None


def _present(store: object, key: str) -> bool:
    """Whether `key` is in the store, without waiting for it: `check` where torch binds it (not in torch 2.2, whose
    roll call therefore never answered), else a wait of 10 ms."""
    import datetime

    check = getattr(store, "check", None)
    if check is not None:
        return bool(check([key]))
    try:
        store.wait([key], datetime.timedelta(milliseconds=10))
    except Exception:  # torch's DistStoreError ("Socket Timeout"), or the store's own
        return False
    return True


def explain(err: BaseException, env: DistEnv, timeout_s: float, what: str | None = None) -> CollectiveFailure:
    """A message naming the collective, the missing ranks with their hosts, and what to do."""
    seen_at = time.time()
    absent = missing_ranks(env, min(timeout_s, ROLL_CALL_MAX_S))
    text = str(err).strip()
    # Drop the backend's source location ("[.../gloo/transport/tcp/pair.cc:561] ") from the first line.
    first_line = re.sub(r"^\[[^\]]*\]\s*", "", text.splitlines()[0]) if text else type(err).__name__
    if absent is None:
        who = "the rendezvous store is unreachable too, so rank 0 (or the launcher hosting the store) is gone"
    elif absent:
        ranks = ", ".join(f"{r} (on {host})" if host else str(r) for r, host in absent.items())
        who = f"rank(s) {ranks} of {env.world_size} did not answer: they crashed, were killed or hang"
    else:
        who = "every rank answered the roll call afterwards, so a rank was only slower than the timeout"
    where = f" in {what}" if what else ""
    failure = CollectiveFailure(
        f"a collective failed on rank {env.rank}{where} ({first_line}); {who}. Look at those ranks' output "
        f"first; raise --dist-timeout (now {timeout_s:g} s) if they were only slow; the run resumes from its "
        "newest checkpoint with --resume (or by itself under torchrun --max-restarts or a requeue)"
    )
    failure.seen_at = seen_at
    return failure
