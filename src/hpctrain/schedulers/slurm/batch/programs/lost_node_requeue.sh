# shellcheck shell=bash
# shellcheck disable=SC2154,SC2170  # set by the batch script; @NAME@ stands for a number hpctrain fills in
# An elastic job lost a node and no group went on without it (fewer than MIN nodes left, or the
# --max-restarts budget spent): RUN/@PEER_LOST_FILE@ is the loss no group took up. Start again from
# the checkpoint, on a new allocation, within --max-hang-restarts.
if [ "$cancelled" = 0 ] && [ "$stop_reason" != completed ] && [ -f "$run_dir/@PEER_LOST_FILE@" ]; then
    if [ "$hang_restarts" -lt @HANG_BUDGET@ ] && [ "$restarts" -lt @TOTAL@ ] &&
        write_count "$run_dir/@HANG_RESTARTS_FILE@" "$((hang_restarts + 1))"; then
        echo "hpctrain: a node was lost and the rest could not go on within the allocation (fewer than MIN nodes left, or the --max-restarts budget spent); requeueing job ${SLURM_JOB_ID} (restart $((hang_restarts + 1)) of @HANG_BUDGET@)"
        scontrol requeue "$SLURM_JOB_ID"
        exit 0
    fi
    echo "hpctrain: a node was lost below MIN and the restart budget (@HANG_BUDGET@, --max-hang-restarts) is used up; not requeueing" >&2
fi
