# shellcheck shell=bash
# shellcheck disable=SC2154  # step_pid, run_dir: set by the batch script
forward_warning() {
    echo "hpctrain: time-limit warning (USR1): asking the run to checkpoint and stop"
    if [ -n "$step_pid" ]; then
        kill -USR1 "$step_pid" 2>/dev/null
    fi
}
