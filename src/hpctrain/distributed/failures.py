"""When a collective fails (a peer crashed, was killed, or hangs past the timeout), say which rank went missing.

The backends' own errors name a socket ("Connection closed by peer [10.1.2.3]:41234") or only a timeout. After
the failure the process group itself is unusable, but the rendezvous store (a separate TCP connection) usually
still works: every surviving rank writes a roll-call key there, waits briefly for the others, and the ranks whose
keys never appear are the missing ones.
"""

from __future__ import annotations

import os
import re
import time

from hpctrain.distributed.environment import DistEnv
from hpctrain.errors import UserError

ROLL_CALL_MAX_S = 30.0


class CollectiveFailure(UserError):
    """Training stopped because another rank did not take part in a collective."""

    exit_code = 1


def looks_like_peer_failure(err: BaseException) -> bool:
    """A distributed error caused by another process (as opposed to a bug in this one)."""
    import torch.distributed as dist

    if isinstance(err, getattr(dist, "DistError", ())):
        return True
    text = str(err)
    return any(sign in text for sign in ("Timed out", "timed out", "Connection closed by peer",
                                         "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted"))


def missing_ranks(env: DistEnv, wait_s: float) -> list[int] | None:
    """Roll call through the default store; None when the store is gone too (it lives with rank 0 or the agent).

    A process fails at most once, so one roll call per attempt (torchrun restarts keep their store: the restart
    count keeps attempts apart)."""
    import torch.distributed as dist

    try:
        store = dist.distributed_c10d._get_default_store()
        prefix = f"hpctrain/roll-call/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        store.set(f"{prefix}/{env.rank}", "present")
        deadline = time.monotonic() + wait_s
        while True:
            absent = [r for r in range(env.world_size) if not store.check([f"{prefix}/{r}"])]
            if not absent or time.monotonic() > deadline:
                return absent
            time.sleep(0.2)
    except Exception:  # the store's own errors vary by transport; any of them means no answer
        return None


def explain(err: BaseException, env: DistEnv, timeout_s: float) -> CollectiveFailure:
    """A message naming the missing ranks and what to do."""
    absent = missing_ranks(env, min(timeout_s, ROLL_CALL_MAX_S))
    text = str(err).strip()
    # Drop the backend's source location ("[.../gloo/transport/tcp/pair.cc:561] ") from the first line.
    first_line = re.sub(r"^\[[^\]]*\]\s*", "", text.splitlines()[0]) if text else type(err).__name__
    if absent is None:
        who = "the rendezvous store is unreachable too, so rank 0 (or the launcher hosting the store) is gone"
    elif absent:
        who = f"rank(s) {', '.join(map(str, absent))} of {env.world_size} did not answer: they crashed, were killed or hang"
    else:
        who = "every rank answered the roll call afterwards, so a rank was only slower than the timeout"
    return CollectiveFailure(
        f"a collective failed on rank {env.rank} ({first_line}); {who}. Look at those ranks' output "
        f"first; raise --dist-timeout (now {timeout_s:g} s) if they were only slow; the run resumes from its "
        "newest checkpoint with --resume (or by itself under torchrun --max-restarts or a requeue)"
    )
