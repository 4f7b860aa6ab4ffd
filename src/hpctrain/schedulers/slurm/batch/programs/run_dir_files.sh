# shellcheck shell=bash
# Counters in the run directory: a plain file of digits, read at most 32 bytes, as a decimal number; else 0
# (a directory, a FIFO, garbage). Written by rename: a directory there refuses, and so does the requeue.
read_count() {
    local n=""
    if [ -f "$1" ]; then
        n=$(head -c 32 -- "$1" 2>/dev/null | tr -d '[:space:]')
    fi
    case "$n" in "" | *[!0-9]* | ??????????*) n=0 ;; esac
    echo "$((10#$n))"
}
# Files in the run directory are replaced, never written in place: the new text goes to a temporary that
# mktemp creates there (O_EXCL: never a file or link someone left), and is renamed over the old one.
write_file() {
    local tmp
    tmp=$(mktemp -- "$1.tmp.XXXXXXXX" 2>/dev/null) || return 1
    if cat >"$tmp" && mv -fT -- "$tmp" "$1" 2>/dev/null; then
        return 0
    fi
    rm -f -- "$tmp" 2>/dev/null
    return 1
}
write_count() {
    if printf '%s\n' "$2" | write_file "$1"; then
        return 0
    fi
    echo "hpctrain: cannot record the restart in $1: not requeueing (a budget that cannot be counted would never run out)" >&2
    return 1
}
# Node lists (one hostlist expression a line: node07, node[1-3]) as node names, one a line.
node_names() {
    local f list=""
    for f in "$@"; do
        if [ -f "$f" ]; then
            list="$list,$(head -c @NODE_LIST_MAX_BYTES@ -- "$f" 2>/dev/null | tr -s '[:space:]' ,)"
        fi
    done
    list=$(echo "$list" | tr -s , | sed 's/^,//; s/,$//')
    if [ -n "$list" ]; then
        scontrol show hostnames "$list" 2>/dev/null | grep -E '^[A-Za-z0-9][A-Za-z0-9._-]*$'
    fi
}
