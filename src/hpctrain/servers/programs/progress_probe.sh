# shellcheck shell=sh
# shellcheck disable=SC2170  # @NAME@ stands for a number hpctrain fills in
# Added to the probe of one of a job's pods: the ranks' live records, from the run directory on the pods' volume
# (HPCTRAIN_RUN_DIR, which hpctrain's pods have), one `@progress JSON` line each. A constant number of processes
# whatever the ranks: one find, and one awk per batch of files it hands over (`-exec ... {} +`, join_records.awk).
# Only regular files, never a link (`-type f`: a FIFO would block the reader), and, as the local reader
# (read_progress), none larger than MAX_RECORD_BYTES: find passes over a larger file unread (mawk took 3.8 s for
# one line of 16 MiB, quadratically more for more). An image without find or awk gets the loop of one `tr` per
# rank (18 s of forks at 8,000 ranks), which drops a record over the bound after reading it.
if [ -n "${HPCTRAIN_RUN_DIR:-}" ]; then
    d="$HPCTRAIN_RUN_DIR"/@PROGRESS_DIR@
    if command -v find >/dev/null 2>&1 && command -v awk >/dev/null 2>&1; then
        find "$d" -maxdepth 1 -name 'rank-*.json' -type f -size -@FIND_SIZE@c -exec awk @JOIN_RECORDS@ {} +
    else
        for f in "$d"/rank-*.json; do
            [ -f "$f" ] && [ ! -L "$f" ] && r="$(tr -d "\n" < "$f")" &&
                { [ "${#r}" -gt @MAX_RECORD_BYTES@ ] || printf "@progress %s\n" "$r"; }
        done
    fi
fi
