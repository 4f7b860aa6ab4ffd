"""The batch script's own requeues: the run directory's counters and the restart budgets it sets up before the
step, and the decisions it takes after the step (why the step stopped, and whether the job requeues itself).

script.render_sbatch holds these parts where the script runs them; they are a module of their own because they
are one idea: every requeue the script makes is bounded twice, by a counter in the run directory (its own budget:
--max-requeues after time-limit warnings, --max-hang-restarts after hangs, sick nodes and elastic jobs that fell
below MIN) and by Slurm's own restart count (SLURM_RESTART_COUNT, the total of every budget), which nothing in the
run directory can reset. What the script reads back from the run directory is untrusted (see script.py). The
shell is in programs/*.sh; this module chooses the programs and fills in their values.
"""

from __future__ import annotations

import shlex

from hpctrain import program_text
from hpctrain.health.preflight import BAD_NODES_FILE, PREFLIGHT_FILE
from hpctrain.jobs.spec import JobSpec
from hpctrain.schedulers.slurm.batch.options import SlurmOptions
from hpctrain.stops import PEER_LOST_FILE, SIGNALS_FILE, STOP_REASON_FILE

REQUEUE_COUNT_FILE = "requeue_count"
HANG_RESTARTS_FILE = "hang_restarts"
EXCLUDED_NODES_FILE = "excluded_nodes"  # every node a preflight of this run found sick, one a line
NODE_LIST_MAX_BYTES = 65536  # of a bad-node list read back


def _program(name: str, **values: object) -> list[str]:
    """The lines of programs/<name> (a shell fragment of the batch script, linted as one) with its values filled."""
    return program_text.lines(__package__, name, **values)


# --- Before the step: the counters and the restart budgets ---


def requeues_itself(job: JobSpec, options: SlurmOptions) -> bool:
    """The script may requeue its job: after a time-limit warning, or after a hang (that needs the run directory,
    where the watchdog leaves its stop reason)."""
    return bool(job.signal_grace or (job.run_dir is not None and options.max_hang_restarts))


def helper_lines() -> list[str]:
    """Shell functions that read and write the run directory's counters and node lists safely."""
    return _program("run_dir_files.sh", NODE_LIST_MAX_BYTES=NODE_LIST_MAX_BYTES)


def restart_budget_lines(job: JobSpec, options: SlurmOptions) -> list[str]:
    """Separate budgets: this script's own requeues (after time-limit warnings, after hangs) are counted in the run
    directory; the rest of Slurm's restart count are Slurm's own requeues (preemption, node failure). All of them
    together are bounded by Slurm's count alone."""
    return [
        "",
        *_program(
            "restart_budgets.sh",
            REQUEUE_COUNT_FILE=REQUEUE_COUNT_FILE,
            HANG_RESTARTS_FILE=HANG_RESTARTS_FILE,
            MAX_PREEMPTIONS=options.max_preemptions,
            TOTAL=restart_budget(job, options),
            STOP_REASON_FILE=STOP_REASON_FILE,
            SIGNALS_FILE=SIGNALS_FILE,
            ALSO_CLEARED=f' "$run_dir/{PEER_LOST_FILE}"' if job.resources.elastic else "",
        ),
    ]


def restart_budget(job: JobSpec, options: SlurmOptions) -> int:
    """Restarts of every kind together: the bound on Slurm's restart count that no file can reset."""
    return (
        (options.max_requeues if job.signal_grace else 0)
        + (options.max_hang_restarts if job.run_dir else 0)
        + (options.max_preemptions)
    )


# --- After the step: why it stopped, and whether the job requeues itself ---


def stop_reason_lines(job: JobSpec) -> list[str]:
    lines = ["", 'stop_reason=""']
    if job.run_dir is not None:
        lines += [
            f'if [ -f "$run_dir/{STOP_REASON_FILE}" ]; then',
            f"    stop_reason=$(head -c 64 -- \"$run_dir/{STOP_REASON_FILE}\" 2>/dev/null | tr -d '[:space:]')",
            "fi",
        ]
    return lines


def elastic_lines() -> list[str]:
    """An elastic step whose lost node's torchrun ended with an error while the survivors finished: srun reports
    the lost task's status, but the run completed (its stop_reason says so), so the job did too."""
    return _program("elastic_end.sh")


def hang_lines(job: JobSpec, options: SlurmOptions) -> list[str]:
    """Requeue after a hang or a sick node, within --max-hang-restarts (and the total budget)."""
    n, total = options.max_hang_restarts, restart_budget(job, options)
    return [
        *(lost_node_lines(n, total) if job.resources.elastic else []),
        *_program(
            "hang_requeue.sh",
            HANG_BUDGET=n,
            TOTAL=total,
            HANG_RESTARTS_FILE=HANG_RESTARTS_FILE,
            BAD_NODES_FILE=BAD_NODES_FILE,
            EXCLUDED_SOURCES=_excluded_sources(job),
            PREFLIGHT_FILE=PREFLIGHT_FILE,
            EXCLUDED_NODES_FILE=EXCLUDED_NODES_FILE,
        ),
    ]


def lost_node_lines(n: int, total: int) -> list[str]:
    """An elastic job that lost a node and could not go on within its allocation: the loss its first survivor saw
    is still in RUN/peer_lost.json (a group that re-formed would have taken it), so the survivors were fewer than
    MIN (torch's rendezvous timed out) or the --max-restarts budget was spent. Requeue, as after a hang."""
    return _program(
        "lost_node_requeue.sh",
        PEER_LOST_FILE=PEER_LOST_FILE,
        HANG_BUDGET=n,
        TOTAL=total,
        HANG_RESTARTS_FILE=HANG_RESTARTS_FILE,
    )


def _excluded_sources(job: JobSpec) -> str:
    """Shell words printing the nodes a sick-node requeue excludes: earlier requeues', the preflight's new finding,
    and the job's own --exclude-nodes (`scontrol update ExcNodeList` replaces the list), one a line."""
    files = f'node_names "$run_dir/{EXCLUDED_NODES_FILE}" "$run_dir/{BAD_NODES_FILE}"'
    if not job.exclude_nodes:
        return files
    return f"( {files}; printf '%s\\n' {' '.join(shlex.quote(n) for n in job.exclude_nodes)}; )"


def warning_requeue_lines(job: JobSpec, options: SlurmOptions) -> list[str]:
    """Requeue after a time-limit warning: only when the program said it stopped with its state saved."""
    out = [
        "",
        "# Requeue after a time-limit warning only when the program said it stopped with its state saved",
        "# (stop_reason `preempted`); never after scancel; within a budget.",
    ]
    if job.run_dir is None:  # no run directory, no word from the program: nothing to requeue on
        return out + [
            'if [ "$warned" = 1 ] && [ "$status" -ne 0 ]; then',
            '    echo "hpctrain: the step ended after the time-limit warning (exit status $status); the job has no'
            ' run directory in which the program could say it saved its state: not requeueing" >&2',
            "fi",
        ]
    return out + _program(
        "warning_requeue.sh",
        MAX_REQUEUES=options.max_requeues,
        TOTAL=restart_budget(job, options),
        REQUEUE_COUNT_FILE=REQUEUE_COUNT_FILE,
        STOP_REASON_FILE=STOP_REASON_FILE,
    )
