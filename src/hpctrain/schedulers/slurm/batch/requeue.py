"""The batch script's restart logic (render.render_sbatch puts these lines in): who gets the time-limit warning,
when the job requeues itself, and the budgets that bound it.

Everything read back from the run directory is untrusted (other processes, other users, a crash wrote it):
counters are read only from regular files, at most a few bytes, as decimal numbers (`10#`: a leading zero is not
octal); a counter that cannot be written refuses the requeue rather than let a budget never run out; node lists
are hostlist expressions, expanded by `scontrol show hostnames`. And every requeue is bounded besides by Slurm's
own restart count (SLURM_RESTART_COUNT), which nothing in the run directory can reset.

The warning (SIGUSR1) is passed on to a built-in recipe always; to a user's command only once the program has
said that it handles it (hpctrain.training.StopRequest leaves SIGNALS_FILE): Python's default action for SIGUSR1
ends the process. The job is requeued after a warning only when the program said it stopped with its state saved
(stop_reason `preempted`); anything else would start it again from scratch.

The shell functions and blocks are programs of their own, programs/*.sh beside this module (bash -n and shellcheck
check them as they stand, tests/test_program_templates.py); this module chooses which the script holds and fills
in their values (budgets, file names), hpctrain.program_text's `@NAME@` words.
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


def requeues_itself(job: JobSpec, options: SlurmOptions) -> bool:
    """The script may requeue its job: after a time-limit warning, or after a hang (that needs the run directory,
    where the watchdog leaves its stop reason)."""
    return bool(job.signal_grace or (job.run_dir is not None and options.max_hang_restarts))


def restart_budget(job: JobSpec, options: SlurmOptions) -> int:
    """Restarts of every kind together: the bound on Slurm's restart count that no file can reset."""
    return (
        (options.max_requeues if job.signal_grace else 0)
        + (options.max_hang_restarts if job.run_dir else 0)
        + (options.max_preemptions)
    )


def _program(name: str, **values: object) -> list[str]:
    """The lines of programs/<name> (a shell fragment of the batch script, linted as one) with its values filled."""
    return program_text.lines(__package__, name, **values)


def warning_lines(job: JobSpec) -> list[str]:
    """The shell functions the USR1 trap calls: pass the warning on to the step, or say why not."""
    if job.is_recipe:
        return _program("forward_warning_recipe.sh")
    return _program("forward_warning_command.sh", SIGNALS_FILE=SIGNALS_FILE)


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


def _excluded_sources(job: JobSpec) -> str:
    """Shell words printing the nodes a sick-node requeue excludes: earlier requeues', the preflight's new finding,
    and the job's own --exclude-nodes (`scontrol update ExcNodeList` replaces the list), one a line."""
    files = f'node_names "$run_dir/{EXCLUDED_NODES_FILE}" "$run_dir/{BAD_NODES_FILE}"'
    if not job.exclude_nodes:
        return files
    return f"( {files}; printf '%s\\n' {' '.join(shlex.quote(n) for n in job.exclude_nodes)}; )"
