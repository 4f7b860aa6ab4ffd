"""What a run and the batch script or pod that started it agree on about its end, so that both sides import it
from here: the training side (hpctrain.training.stopping, which re-exports these names) and the schedulers, which
render the scripts and pods that read them (a requeue on EXIT_PREEMPTED, the words a run leaves in its directory,
the time-limit variables). Plain names and an enum: no imports, nothing to run.
"""

from __future__ import annotations

from enum import IntEnum

# Exit statuses that tell the batch script why the run ended. 75 is EX_TEMPFAIL: "try again later".
EXIT_COMPLETED = 0
EXIT_PREEMPTED = 75
EXIT_CANCELLED = 143  # 128 + SIGTERM, what a shell reports for a process ended by SIGTERM
EXIT_DIVERGED = 3  # the loss became non-finite: restarting the same way would fail the same way
# The hang watchdog ended the attempt (no step within the hang limit). 128 + SIGALRM, the watchdog's alarm: a
# status of 128 and above is one Kubeflow's ExitCode restart policy retries, and the batch script restarts it too.
EXIT_HUNG = 142
# The preflight found a sick node (RUN/bad_nodes): the batch script requeues the job without it. >= 128 as well.
EXIT_SICK_NODE = 144

STOP_REASON_FILE = "stop_reason"
TIME_LIMIT_ENV = "HPCTRAIN_TIME_LIMIT_S"  # rendered by hpctrain.schedulers.kubernetes.manifests.render
TIME_WARNING_ENV = "HPCTRAIN_TIME_WARNING_S"
SIGNALS_FILE = "handles_signals"  # the program's word that it handles SIGUSR1 (read by the Slurm batch script)
RUN_DIR_ENV = "HPCTRAIN_RUN_DIR"  # the job's run directory, exported by the batch script hpctrain renders
# The run's record of its attempts (hpctrain.training.provenance writes it; `status JOB` reads an elastic run's node
# counts and membership changes from it, hpctrain.health.view).
PROVENANCE_FILE = "provenance.json"
MAX_PROVENANCE_BYTES = 64 << 20  # read back at most (an attempt's record is a few kB, with 1,000 hosts tens of kB)
# An elastic run's loss of a peer, as the first survivor saw it; the next torchrun group takes it. Still there when
# the step has ended: no group could go on (below MIN, or the restart budget spent), and the batch script requeues.
PEER_LOST_FILE = "peer_lost.json"


class StopReason(IntEnum):
    """Ordered by precedence: when ranks disagree, the highest wins (a cancel beats a time-limit warning)."""

    NONE = 0
    PREEMPTED = 1
    CANCELLED = 2
    DIVERGED = 3  # not a signal: the loss became non-finite; no checkpoint may be written after it
    HUNG = 4  # not a signal and never voted: the hang watchdog ended the attempt
    SICK_NODE = 5  # not a signal: the preflight, which every rank judges alike, found a sick node

    @property
    def exit_code(self) -> int:
        return {
            StopReason.NONE: EXIT_COMPLETED,
            StopReason.PREEMPTED: EXIT_PREEMPTED,
            StopReason.DIVERGED: EXIT_DIVERGED,
            StopReason.HUNG: EXIT_HUNG,
            StopReason.SICK_NODE: EXIT_SICK_NODE,
        }.get(self, EXIT_CANCELLED)

    @property
    def label(self) -> str:
        return self.name.lower()
