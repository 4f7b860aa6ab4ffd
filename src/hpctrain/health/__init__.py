"""A rank's health, readable from outside while the job runs: no collective, only files in the run directory.

    progress.py     each rank's live record, RUN/progress/rank-N.json (step, step time, input wait, forward time)
    stragglers.py   which rank holds the others up, and whether by input or by compute (pure, on the records)
    watchdog.py     the thread that notices when no step completes
    hang.py         the hang report: which rank never arrived where the others wait
    stacks.py       every thread's Python stack to a file, on a hang or on request (`hpctrain debug stacks`)
    preflight.py    the preflight's verdict: which nodes' devices are far slower than the others, or broken
    view.py         all of this as lines of text, for `hpctrain top` and `hpctrain status`

Used by the training loop (hpctrain.training.watch) and readable by anyone's script; torch is not imported here.
"""

from hpctrain.health.hang import HangReport, hang_report
from hpctrain.health.progress import ProgressRecorder, RankProgress, read_progress
from hpctrain.health.stacks import dump_stacks, request_stacks
from hpctrain.health.stragglers import Straggler, find_stragglers
from hpctrain.health.watchdog import Watchdog

__all__ = [
    "HangReport",
    "ProgressRecorder",
    "RankProgress",
    "Straggler",
    "Watchdog",
    "dump_stacks",
    "find_stragglers",
    "hang_report",
    "read_progress",
    "request_stacks",
]
