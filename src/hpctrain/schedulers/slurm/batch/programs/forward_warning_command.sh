# shellcheck shell=bash
# shellcheck disable=SC2154  # step_pid, run_dir: set by the batch script
# Your program gets the warning only if it said it handles SIGUSR1 (hpctrain.training.StopRequest leaves
# RUN/@SIGNALS_FILE@): Python's default action for SIGUSR1 would end it, with nothing saved.
forward_warning() {
    if [ -z "$step_pid" ]; then
        return 0
    fi
    if [ -n "${run_dir:-}" ] && [ -f "$run_dir/@SIGNALS_FILE@" ]; then
        echo "hpctrain: time-limit warning (USR1): passed on to your program, which said it handles it"
        kill -USR1 "$step_pid" 2>/dev/null
    else
        echo "hpctrain: time-limit warning (USR1): not passed on, since your program has not said it handles it (hpctrain.training.StopRequest); it runs until the time limit and is not requeued"
    fi
}
