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
"""

from __future__ import annotations

import shlex

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


def warning_lines(job: JobSpec) -> list[str]:
    """The shell functions the USR1 trap calls: pass the warning on to the step, or say why not."""
    if job.is_recipe:
        return [
            "forward_warning() {",
            '    echo "hpctrain: time-limit warning (USR1): asking the run to checkpoint and stop"',
            '    if [ -n "$step_pid" ]; then',
            '        kill -USR1 "$step_pid" 2>/dev/null',
            "    fi",
            "}",
        ]
    return [
        "# Your program gets the warning only if it said it handles SIGUSR1 (hpctrain.training.StopRequest leaves",
        f"# RUN/{SIGNALS_FILE}): Python's default action for SIGUSR1 would end it, with nothing saved.",
        "forward_warning() {",
        '    if [ -z "$step_pid" ]; then',
        "        return 0",
        "    fi",
        f'    if [ -n "${{run_dir:-}}" ] && [ -f "$run_dir/{SIGNALS_FILE}" ]; then',
        '        echo "hpctrain: time-limit warning (USR1): passed on to your program, which said it handles it"',
        '        kill -USR1 "$step_pid" 2>/dev/null',
        "    else",
        '        echo "hpctrain: time-limit warning (USR1): not passed on, since your program has not said it handles'
        ' it (hpctrain.training.StopRequest); it runs until the time limit and is not requeued"',
        "    fi",
        "}",
    ]


def helper_lines() -> list[str]:
    """Shell functions that read and write the run directory's counters and node lists safely."""
    return [
        "# Counters in the run directory: a plain file of digits, read at most 32 bytes, as a decimal number; else 0",
        "# (a directory, a FIFO, garbage). Written by rename: a directory there refuses, and so does the requeue.",
        "read_count() {",
        '    local n=""',
        '    if [ -f "$1" ]; then',
        "        n=$(head -c 32 -- \"$1\" 2>/dev/null | tr -d '[:space:]')",
        "    fi",
        '    case "$n" in "" | *[!0-9]* | ??????????*) n=0 ;; esac',
        '    echo "$((10#$n))"',
        "}",
        "# Files in the run directory are replaced, never written in place: the new text goes to a temporary that",
        "# mktemp creates there (O_EXCL: never a file or link someone left), and is renamed over the old one.",
        "write_file() {",
        "    local tmp",
        '    tmp=$(mktemp -- "$1.tmp.XXXXXXXX" 2>/dev/null) || return 1',
        '    if cat >"$tmp" && mv -fT -- "$tmp" "$1" 2>/dev/null; then',
        "        return 0",
        "    fi",
        '    rm -f -- "$tmp" 2>/dev/null',
        "    return 1",
        "}",
        "write_count() {",
        '    if printf \'%s\\n\' "$2" | write_file "$1"; then',
        "        return 0",
        "    fi",
        '    echo "hpctrain: cannot record the restart in $1: not requeueing (a budget that cannot be counted would'
        ' never run out)" >&2',
        "    return 1",
        "}",
        "# Node lists (one hostlist expression a line: node07, node[1-3]) as node names, one a line.",
        "node_names() {",
        '    local f list=""',
        '    for f in "$@"; do',
        '        if [ -f "$f" ]; then',
        f'            list="$list,$(head -c {NODE_LIST_MAX_BYTES} -- "$f" 2>/dev/null | tr -s \'[:space:]\' ,)"',
        "        fi",
        "    done",
        "    list=$(echo \"$list\" | tr -s , | sed 's/^,//; s/,$//')",
        '    if [ -n "$list" ]; then',
        "        scontrol show hostnames \"$list\" 2>/dev/null | grep -E '^[A-Za-z0-9][A-Za-z0-9._-]*$'",
        "    fi",
        "}",
    ]


def restart_budget_lines(job: JobSpec, options: SlurmOptions) -> list[str]:
    """Separate budgets: this script's own requeues (after time-limit warnings, after hangs) are counted in the run
    directory; the rest of Slurm's restart count are Slurm's own requeues (preemption, node failure). All of them
    together are bounded by Slurm's count alone."""
    total = restart_budget(job, options)
    return [
        "",
        "# Restart budgets: time-limit and hang requeues (counted here) and Slurm's own requeues (preemption, node",
        "# failure); all of them together within Slurm's restart count, which the run directory cannot reset.",
        'mkdir -p "$run_dir"',
        f'own_requeues=$(read_count "$run_dir/{REQUEUE_COUNT_FILE}")',
        f'hang_restarts=$(read_count "$run_dir/{HANG_RESTARTS_FILE}")',
        "restarts=${SLURM_RESTART_COUNT:-0}",
        'case "$restarts" in "" | *[!0-9]* | ??????????*) restarts=0 ;; esac',
        "restarts=$((10#$restarts))",
        "slurm_requeues=$((restarts - own_requeues - hang_restarts))",
        f'if [ "$slurm_requeues" -gt {options.max_preemptions} ]; then',
        f'    echo "hpctrain: Slurm has requeued this job $slurm_requeues times (preemption, node failure), more than'
        f' the budget of {options.max_preemptions} (--max-preemptions); not starting again" >&2',
        "    exit 1",
        "fi",
        f'if [ "$restarts" -gt {total} ]; then',
        f'    echo "hpctrain: this job has started again $restarts times, more than all its budgets together allow'
        f' ({total}: --max-requeues, --max-hang-restarts, --max-preemptions); not starting again" >&2',
        "    exit 1",
        "fi",
        "# A new attempt: the words of the last one are not this one's.",
        f'rm -f -- "$run_dir/{STOP_REASON_FILE}" "$run_dir/{SIGNALS_FILE}"'
        + (f' "$run_dir/{PEER_LOST_FILE}"' if job.resources.elastic else "")
        + " 2>/dev/null",
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
    return [
        "# An elastic job: a lost node's task ends with an error that srun reports as the step's; the survivors",
        "# re-formed without it, and the run's own word (`completed`) says whether they finished.",
        'if [ "$status" -ne 0 ] && [ "$stop_reason" = completed ]; then',
        '    echo "hpctrain: the run completed on the remaining node(s); exit status $status was a lost node\'s"',
        "    status=0",
        "fi",
    ]


def lost_node_lines(n: int, total: int) -> list[str]:
    """An elastic job that lost a node and could not go on within its allocation: the loss its first survivor saw
    is still in RUN/peer_lost.json (a group that re-formed would have taken it), so the survivors were fewer than
    MIN (torch's rendezvous timed out) or the --max-restarts budget was spent. Requeue, as after a hang."""
    return [
        "# An elastic job lost a node and no group went on without it (fewer than MIN nodes left, or the",
        f"# --max-restarts budget spent): RUN/{PEER_LOST_FILE} is the loss no group took up. Start again from",
        "# the checkpoint, on a new allocation, within --max-hang-restarts.",
        f'if [ "$cancelled" = 0 ] && [ "$stop_reason" != completed ] && [ -f "$run_dir/{PEER_LOST_FILE}" ]; then',
        f'    if [ "$hang_restarts" -lt {n} ] && [ "$restarts" -lt {total} ] &&',
        f'        write_count "$run_dir/{HANG_RESTARTS_FILE}" "$((hang_restarts + 1))"; then',
        '        echo "hpctrain: a node was lost and the rest could not go on within the allocation (fewer than MIN'
        " nodes left, or the --max-restarts budget spent); requeueing job ${SLURM_JOB_ID} (restart"
        f' $((hang_restarts + 1)) of {n})"',
        '        scontrol requeue "$SLURM_JOB_ID"',
        "        exit 0",
        "    fi",
        f'    echo "hpctrain: a node was lost below MIN and the restart budget ({n}, --max-hang-restarts) is used up;'
        ' not requeueing" >&2',
        "fi",
    ]


def hang_lines(job: JobSpec, options: SlurmOptions) -> list[str]:
    """Requeue after a hang or a sick node, within --max-hang-restarts (and the total budget)."""
    n, total = options.max_hang_restarts, restart_budget(job, options)
    return [
        *(lost_node_lines(n, total) if job.resources.elastic else []),
        "# The run's hang watchdog ended the attempt (no step within --hang-timeout; RUN/hang/report.txt names",
        "# the rank that never arrived): start again from the checkpoint, within --max-hang-restarts.",
        'if [ "$cancelled" = 0 ] && [ "$stop_reason" = hung ]; then',
        f'    if [ "$hang_restarts" -lt {n} ] && [ "$restarts" -lt {total} ] &&',
        f'        write_count "$run_dir/{HANG_RESTARTS_FILE}" "$((hang_restarts + 1))"; then',
        f'        echo "hpctrain: the run hung (see $run_dir/hang/report.txt); requeueing job ${{SLURM_JOB_ID}}'
        f' (hang restart $((hang_restarts + 1)) of {n})"',
        '        scontrol requeue "$SLURM_JOB_ID"',
        "        exit 0",
        "    fi",
        f'    echo "hpctrain: the run hung and the hang-restart budget ({n}, --max-hang-restarts) is used up; not'
        ' requeueing" >&2',
        "fi",
        "# The preflight found sick nodes (RUN/bad_nodes): requeue without them, within the same budget. A running",
        "# job's excluded nodes cannot change: hold it on requeue, change them, release it (TERM, which the",
        "# requeue sends this script, is ignored from here: these three commands must all run).",
        f'if [ "$cancelled" = 0 ] && [ "$stop_reason" = sick_node ] && [ -f "$run_dir/{BAD_NODES_FILE}" ]; then',
        f"    excluded=$({_excluded_sources(job)} | sort -u | paste -sd, -)",
        "    # A job no longer fitting its partition without them would wait forever: end it (sinfo silent: requeue).",
        '    partition_nodes=$(sinfo -h -p "${SLURM_JOB_PARTITION:-}" -o "%D" 2>/dev/null '
        "| awk '{n += $1} END {print n + 0}')",
        '    left=$((partition_nodes - $(echo "$excluded" | tr , "\\n" | grep -c .)))',
        '    if [ -z "$excluded" ]; then',
        f"        echo \"hpctrain: the preflight's list of sick nodes ($run_dir/{BAD_NODES_FILE}) names no node; not"
        ' requeueing" >&2',
        '    elif [ "$partition_nodes" -gt 0 ] && [ "$left" -lt "${SLURM_JOB_NUM_NODES:-1}" ]; then',
        f'        echo "hpctrain: the preflight found sick node(s) ($excluded); without them partition'
        f" ${{SLURM_JOB_PARTITION:-?}} has $left node(s), fewer than the job's ${{SLURM_JOB_NUM_NODES:-1}}: not"
        f' requeueing (see $run_dir/{PREFLIGHT_FILE})" >&2',
        f'    elif [ "$hang_restarts" -lt {n} ] && [ "$restarts" -lt {total} ] &&',
        f'        write_count "$run_dir/{HANG_RESTARTS_FILE}" "$((hang_restarts + 1))"; then',
        f'        echo "$excluded" | tr , "\\n" | write_file "$run_dir/{EXCLUDED_NODES_FILE}"',
        f'        echo "hpctrain: the preflight found sick node(s); requeueing job ${{SLURM_JOB_ID}} without $excluded'
        f' (restart $((hang_restarts + 1)) of {n})"',
        "        trap '' TERM INT USR1",
        '        scontrol requeuehold "$SLURM_JOB_ID"',
        '        scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="$excluded"',
        '        scontrol release "$SLURM_JOB_ID"',
        "        exit 0",
        "    else",
        f'        echo "hpctrain: the preflight found sick node(s) and the restart budget ({n}, --max-hang-restarts)'
        ' is used up; not requeueing" >&2',
        "    fi",
        "fi",
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
    total = restart_budget(job, options)
    return out + [
        'if [ "$warned" = 1 ] && [ "$cancelled" = 0 ] && [ "$stop_reason" = preempted ]; then',
        "    # srun reports a step's non-zero exit as an error (and --kill-on-bad-exit ends the other tasks, which",
        "    # slurmstepd reports as CANCELLED), a planned stop's status too: say what those lines were.",
        '    if [ "$status" -ne 0 ]; then',
        "        echo \"hpctrain: the run stopped as planned, its state saved (exit status $status): srun's"
        " 'error: ... Exited with exit code' or 'Terminated' and slurmstepd's 'CANCELLED' lines just above are"
        ' Slurm reporting that planned exit, not a failure"',
        "    fi",
        f'    if [ "$own_requeues" -lt {options.max_requeues} ] && [ "$restarts" -lt {total} ] &&',
        f'        write_count "$run_dir/{REQUEUE_COUNT_FILE}" "$((own_requeues + 1))"; then',
        f'        echo "hpctrain: the run stopped with its state saved; requeueing job ${{SLURM_JOB_ID}} (requeue'
        f' $((own_requeues + 1)) of {options.max_requeues})"',
        '        scontrol requeue "$SLURM_JOB_ID"',
        "        exit 0",
        "    fi",
        f'    echo "hpctrain: the requeue budget ({options.max_requeues}) is used up; not requeueing" >&2',
        "    # The run stopped before it finished: never report that as success.",
        '    if [ "$status" -eq 0 ]; then',
        "        status=1",
        "    fi",
        'elif [ "$warned" = 1 ] && [ "$cancelled" = 0 ] && [ "$status" -ne 0 ] && [ -z "$stop_reason" ]; then',
        '    echo "hpctrain: the step ended after the time-limit warning (exit status $status) without saying it'
        f" stopped with its state saved ($run_dir/{STOP_REASON_FILE} \\`preempted\\`): not requeueing, since it"
        ' would start again from scratch" >&2',
        "fi",
    ]


def _excluded_sources(job: JobSpec) -> str:
    """Shell words printing the nodes a sick-node requeue excludes: earlier requeues', the preflight's new finding,
    and the job's own --exclude-nodes (`scontrol update ExcNodeList` replaces the list), one a line."""
    files = f'node_names "$run_dir/{EXCLUDED_NODES_FILE}" "$run_dir/{BAD_NODES_FILE}"'
    if not job.exclude_nodes:
        return files
    return f"( {files}; printf '%s\\n' {' '.join(shlex.quote(n) for n in job.exclude_nodes)}; )"
