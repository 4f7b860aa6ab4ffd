# shellcheck shell=bash
# shellcheck disable=SC2154,SC2170  # set by the batch script; @NAME@ stands for a number hpctrain fills in
# The run's hang watchdog ended the attempt (no step within --hang-timeout; RUN/hang/report.txt names
# the rank that never arrived): start again from the checkpoint, within --max-hang-restarts.
if [ "$cancelled" = 0 ] && [ "$stop_reason" = hung ]; then
    if [ "$hang_restarts" -lt @HANG_BUDGET@ ] && [ "$restarts" -lt @TOTAL@ ] &&
        write_count "$run_dir/@HANG_RESTARTS_FILE@" "$((hang_restarts + 1))"; then
        echo "hpctrain: the run hung (see $run_dir/hang/report.txt); requeueing job ${SLURM_JOB_ID} (hang restart $((hang_restarts + 1)) of @HANG_BUDGET@)"
        scontrol requeue "$SLURM_JOB_ID"
        exit 0
    fi
    echo "hpctrain: the run hung and the hang-restart budget (@HANG_BUDGET@, --max-hang-restarts) is used up; not requeueing" >&2
fi
# The preflight found sick nodes (RUN/bad_nodes): requeue without them, within the same budget. A running
# job's excluded nodes cannot change: hold it on requeue, change them, release it (TERM, which the
# requeue sends this script, is ignored from here: these three commands must all run).
if [ "$cancelled" = 0 ] && [ "$stop_reason" = sick_node ] && [ -f "$run_dir/@BAD_NODES_FILE@" ]; then
    excluded=$(@EXCLUDED_SOURCES@ | sort -u | paste -sd, -)
    # A job no longer fitting its partition without them would wait forever: end it (sinfo silent: requeue).
    partition_nodes=$(sinfo -h -p "${SLURM_JOB_PARTITION:-}" -o "%D" 2>/dev/null | awk '{n += $1} END {print n + 0}')
    left=$((partition_nodes - $(echo "$excluded" | tr , "\n" | grep -c .)))
    if [ -z "$excluded" ]; then
        echo "hpctrain: the preflight's list of sick nodes ($run_dir/@BAD_NODES_FILE@) names no node; not requeueing" >&2
    elif [ "$partition_nodes" -gt 0 ] && [ "$left" -lt "${SLURM_JOB_NUM_NODES:-1}" ]; then
        echo "hpctrain: the preflight found sick node(s) ($excluded); without them partition ${SLURM_JOB_PARTITION:-?} has $left node(s), fewer than the job's ${SLURM_JOB_NUM_NODES:-1}: not requeueing (see $run_dir/@PREFLIGHT_FILE@)" >&2
    elif [ "$hang_restarts" -lt @HANG_BUDGET@ ] && [ "$restarts" -lt @TOTAL@ ] &&
        write_count "$run_dir/@HANG_RESTARTS_FILE@" "$((hang_restarts + 1))"; then
        echo "$excluded" | tr , "\n" | write_file "$run_dir/@EXCLUDED_NODES_FILE@"
        echo "hpctrain: the preflight found sick node(s); requeueing job ${SLURM_JOB_ID} without $excluded (restart $((hang_restarts + 1)) of @HANG_BUDGET@)"
        trap '' TERM INT USR1
        scontrol requeuehold "$SLURM_JOB_ID"
        scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="$excluded"
        scontrol release "$SLURM_JOB_ID"
        exit 0
    else
        echo "hpctrain: the preflight found sick node(s) and the restart budget (@HANG_BUDGET@, --max-hang-restarts) is used up; not requeueing" >&2
    fi
fi
