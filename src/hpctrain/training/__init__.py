"""The shared training engine: loop, sampler, checkpoints of the loop's state, stop requests, metrics."""

from hpctrain.training.stopping import (
    EXIT_CANCELLED,
    EXIT_COMPLETED,
    EXIT_PREEMPTED,
    StopReason,
    StopRequest,
    agree,
    vote_group,
)

__all__ = ["EXIT_CANCELLED", "EXIT_COMPLETED", "EXIT_PREEMPTED", "StopReason", "StopRequest", "agree", "vote_group"]
