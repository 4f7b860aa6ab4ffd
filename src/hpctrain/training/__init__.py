"""The shared training engine, below the recipes: it trains whatever `Recipe` (workload.py) its caller hands it.

    loop.py         `train()`: set up, build, then epoch after epoch until done or stopped (the pieces it calls:
                    setup.py, resume.py, rundir.py, run.py, parts.py, epoch.py, evaluation.py, loop_state.py)
    workload.py     what the loop asks of a recipe: the Recipe protocol, Defaults, Optimization
    stopping.py     stop requests from signals and the ranks' vote on them
    metrics.py      metrics.jsonl, TensorBoard scalars, live progress
    provenance.py   who ran each attempt, where, with which versions
    rng.py          every random generator's state, for checkpoints
    stderr.py       dropping a known C++ line from stderr (DDP's find_unused_parameters notice)

The data it reads (the sampler, the DataSource seam) is `hpctrain.data`'s. This package imports the stop-request
names below for user scripts (examples/): importing it costs no torch.
"""

from hpctrain.training.stopping import (
    EXIT_CANCELLED,
    EXIT_COMPLETED,
    EXIT_PREEMPTED,
    StepVote,
    StopReason,
    StopRequest,
    agree,
    announce_stop,
    vote_group,
)

__all__ = [
    "EXIT_CANCELLED",
    "EXIT_COMPLETED",
    "EXIT_PREEMPTED",
    "StepVote",
    "StopReason",
    "StopRequest",
    "agree",
    "announce_stop",
    "vote_group",
]
