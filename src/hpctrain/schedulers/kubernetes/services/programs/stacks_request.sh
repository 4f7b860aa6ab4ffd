# shellcheck shell=sh
# shellcheck disable=SC2170  # @NAME@ stands for a number hpctrain fills in
# Run in a pod by `debug stacks`: ask every rank for its stacks (a fresh token in RUN/stacks/request, written and
# renamed as hpctrain.health.stacks.request_stacks does; a linked stacks/ is refused), wait until @WORLD_SIZE@ answers
# name the token or @WAIT_S@ s passed, then print each answer after a line `@stacks rank-N.txt`. No file times are
# compared. Shell builtins only to tell an answer (an image may lack grep); `od` missing leaves time+pid.
answered() {
    [ -f "$1" ] && [ ! -L "$1" ] && IFS= read -r l < "$1" && case "$l" in *"@ANSWER_PREFIX@$t") true;; *) false;; esac
}
[ -n "${HPCTRAIN_RUN_DIR:-}" ] || exit 3
d="$HPCTRAIN_RUN_DIR"/@STACKS_DIR@
[ -L "$d" ] && exit 3
mkdir -p "$d" || exit 3
[ -L "$d/request" ] && rm -f "$d/request"
[ -d "$d/request" ] && exit 3
t="$(date +%s)-$$-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
set -C
printf "%s\n" "$t" > "$d/.@REQUEST_FILE@.$t.tmp" && mv -f "$d/.@REQUEST_FILE@.$t.tmp" "$d/@REQUEST_FILE@" || exit 3
n=0
while [ "$n" -lt @WAIT_S@ ]; do
    sleep 1
    n=$((n + 1))
    c=0
    for f in "$d"/rank-*.txt; do
        answered "$f" && c=$((c + 1))
    done
    [ "$c" -ge @WORLD_SIZE@ ] && break
done
for f in "$d"/rank-*.txt; do
    answered "$f" && { printf "@stacks %s\n" "${f##*/}"; cat "$f"; }
done
exit 0
