# shellcheck shell=bash
# shellcheck disable=SC2154,SC2170  # set by the batch script; @NAME@ stands for a number hpctrain fills in
if [ "$warned" = 1 ] && [ "$cancelled" = 0 ] && [ "$stop_reason" = preempted ]; then
    # srun reports a step's non-zero exit as an error (and --kill-on-bad-exit ends the other tasks, which
    # slurmstepd reports as CANCELLED), a planned stop's status too: say what those lines were.
    if [ "$status" -ne 0 ]; then
        echo "hpctrain: the run stopped as planned, its state saved (exit status $status): srun's 'error: ... Exited with exit code' or 'Terminated' and slurmstepd's 'CANCELLED' lines just above are Slurm reporting that planned exit, not a failure"
    fi
    if [ "$own_requeues" -lt @MAX_REQUEUES@ ] && [ "$restarts" -lt @TOTAL@ ] &&
        write_count "$run_dir/@REQUEUE_COUNT_FILE@" "$((own_requeues + 1))"; then
        echo "hpctrain: the run stopped with its state saved; requeueing job ${SLURM_JOB_ID} (requeue $((own_requeues + 1)) of @MAX_REQUEUES@)"
        scontrol requeue "$SLURM_JOB_ID"
        exit 0
    fi
    echo "hpctrain: the requeue budget (@MAX_REQUEUES@) is used up; not requeueing" >&2
    # The run stopped before it finished: never report that as success.
    if [ "$status" -eq 0 ]; then
        status=1
    fi
elif [ "$warned" = 1 ] && [ "$cancelled" = 0 ] && [ "$status" -ne 0 ] && [ -z "$stop_reason" ]; then
    echo "hpctrain: the step ended after the time-limit warning (exit status $status) without saying it stopped with its state saved ($run_dir/@STOP_REASON_FILE@ \`preempted\`): not requeueing, since it would start again from scratch" >&2
fi
