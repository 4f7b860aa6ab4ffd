# shellcheck shell=bash
# shellcheck disable=SC2154  # state_dir and port: set by the lines of the batch script before these
# Where the server listens, for hpctrain on the login node (written atomically).
node="${SLURMD_NODENAME:-$(hostname)}"
# (a temporary that mktemp creates: O_EXCL, never a file or link left there; then renamed)
endpoint_tmp=$(mktemp -- "$state_dir/.@ENDPOINT_FILE@.XXXXXXXX")
printf '{"job_id": "%s", "node": "%s", "port": %d}\n' "$SLURM_JOB_ID" "$node" "$port" > "$endpoint_tmp"
mv -fT -- "$endpoint_tmp" "$state_dir/@ENDPOINT_FILE@"
echo "hpctrain: serving on ${node}:${port} (job ${SLURM_JOB_ID})"

step_pid=""
trap 'if [ -n "$step_pid" ]; then kill -TERM "$step_pid" 2>/dev/null; fi' TERM INT
@STEP_COMMAND@ &
step_pid=$!
wait "$step_pid"; status=$?
# A trap interrupts the first wait: wait again while the step stops.
if kill -0 "$step_pid" 2>/dev/null; then wait "$step_pid"; status=$?; fi
rm -f "$state_dir/@ENDPOINT_FILE@"
exit "$status"
