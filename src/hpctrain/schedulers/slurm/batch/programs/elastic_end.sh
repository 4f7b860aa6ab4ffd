# shellcheck shell=bash
# shellcheck disable=SC2154  # step_pid, run_dir: set by the batch script
# An elastic job: a lost node's task ends with an error that srun reports as the step's; the survivors
# re-formed without it, and the run's own word (`completed`) says whether they finished.
if [ "$status" -ne 0 ] && [ "$stop_reason" = completed ]; then
    echo "hpctrain: the run completed on the remaining node(s); exit status $status was a lost node's"
    status=0
fi
