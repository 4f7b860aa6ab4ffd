# shellcheck shell=bash
# shellcheck disable=SC2154,SC2170  # set by the batch script; @NAME@ stands for a number hpctrain fills in
# Restart budgets: time-limit and hang requeues (counted here) and Slurm's own requeues (preemption, node
# failure); all of them together within Slurm's restart count, which the run directory cannot reset.
mkdir -p "$run_dir"
own_requeues=$(read_count "$run_dir/@REQUEUE_COUNT_FILE@")
hang_restarts=$(read_count "$run_dir/@HANG_RESTARTS_FILE@")
restarts=${SLURM_RESTART_COUNT:-0}
case "$restarts" in "" | *[!0-9]* | ??????????*) restarts=0 ;; esac
restarts=$((10#$restarts))
slurm_requeues=$((restarts - own_requeues - hang_restarts))
if [ "$slurm_requeues" -gt @MAX_PREEMPTIONS@ ]; then
    echo "hpctrain: Slurm has requeued this job $slurm_requeues times (preemption, node failure), more than the budget of @MAX_PREEMPTIONS@ (--max-preemptions); not starting again" >&2
    exit 1
fi
if [ "$restarts" -gt @TOTAL@ ]; then
    echo "hpctrain: this job has started again $restarts times, more than all its budgets together allow (@TOTAL@: --max-requeues, --max-hang-restarts, --max-preemptions); not starting again" >&2
    exit 1
fi
# A new attempt: the words of the last one are not this one's.
rm -f -- "$run_dir/@STOP_REASON_FILE@" "$run_dir/@SIGNALS_FILE@"@ALSO_CLEARED@ 2>/dev/null
