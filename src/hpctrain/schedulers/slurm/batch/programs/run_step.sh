# shellcheck shell=bash
# shellcheck disable=SC2154,SC2034  # warned (and forward_warning) come before these lines, status is read after
# The step runs in the background so that the traps run as soon as a signal arrives.
@STEP_COMMAND@ &
step_pid=$!
if [ "$warned" = 1 ]; then
    forward_warning
fi
# wait returns early whenever a trap runs: keep waiting until the step has really ended.
while kill -0 "$step_pid" 2>/dev/null; do
    wait "$step_pid"
done
status=0
wait "$step_pid" || status=$?
