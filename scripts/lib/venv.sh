# shellcheck shell=bash
# Sourced by scripts/quickstart.sh and scripts/test.sh: the Python environment that hpctrain goes into, never the
# system Python. In this order:
#   1. HPCTRAIN_VENV, when set: a virtual environment there, created when absent (CI keeps one outside the
#      checkout, so that torch is installed once, not for every clone);
#   2. the active virtual environment ($VIRTUAL_ENV) or conda environment ($CONDA_PREFIX);
#   3. .venv in the checkout, created when absent and reused when present.
# use_python_env ROOT puts the environment's bin first on PATH (the jobs submitted from here inherit it) and sets
# PYTHON to its interpreter.

use_python_env() {
    local root=$1 prefix create=0
    if [ -n "${HPCTRAIN_VENV:-}" ]; then
        prefix=$HPCTRAIN_VENV
        create=1
    elif [ -n "${VIRTUAL_ENV:-}" ]; then
        prefix=$VIRTUAL_ENV
    elif [ -n "${CONDA_PREFIX:-}" ]; then
        prefix=$CONDA_PREFIX
    else
        prefix=$root/.venv
        create=1
    fi
    if ! "$prefix/bin/python" -c '' 2>/dev/null; then
        if [ "$create" = 0 ]; then
            echo "$(basename "$0"): the active environment $prefix has no working bin/python; install python" \
                "into it or deactivate it" >&2
            exit 1
        fi
        echo "$(basename "$0"): creating a virtual environment in $prefix"
        local clear=()
        if [ -f "$prefix/pyvenv.cfg" ]; then
            clear=(--clear) # a venv whose python is gone (the system's python3 was upgraded): make it afresh
        fi
        if ! python3 -m venv "${clear[@]}" "$prefix"; then
            echo "$(basename "$0"): could not create $prefix; on Debian or Ubuntu: apt-get install python3-venv" >&2
            exit 1
        fi
    fi
    echo "$(basename "$0"): using the Python environment in $prefix"
    export PATH="$prefix/bin:$PATH"
    # shellcheck disable=SC2034 # read by the scripts that source this file
    PYTHON=$prefix/bin/python
}
