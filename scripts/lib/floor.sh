# shellcheck shell=bash
# Sourced by scripts/test.sh: the floor environment, a second virtual environment with the oldest torch,
# torchvision, NumPy and Python that hpctrain supports (scripts/floor-constraints.txt; README, "Supported
# versions"), kept outside the checkout like the main one (HPCTRAIN_FLOOR_VENV, default
# /var/cache/hpctrain/venv-floor): its first build downloads about 2.8 GB (torch 2.2's CUDA wheels: PyPI's Linux
# torch needs the nvidia-* packages even to import) and takes about 5 minutes; later runs only reinstall hpctrain.
# The tests marked `floor` then run with its interpreter (pytest -m floor), the Slurm jobs they submit included.
# use_floor_env ROOT makes or updates it; floor_python prints its interpreter.

# Python 3.10 (the floor) when this machine has one: on PATH, or installed by pyenv; else python3, with a note.
floor_base_python() {
    local candidate
    for candidate in "$(command -v python3.10 || true)" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.10*/bin/python3.10; do
        if [ -n "$candidate" ] && [ -x "$candidate" ] && "$candidate" -c 'import venv' 2>/dev/null; then
            echo "$candidate"
            return
        fi
    done
    echo "$(basename "$0"): no Python 3.10 here: the floor environment uses python3; Python 3.10 is checked only" \
        "statically (tests/test_python_floor.py)" >&2
    command -v python3
}

floor_python() {
    echo "${HPCTRAIN_FLOOR_VENV:-/var/cache/hpctrain/venv-floor}/bin/python"
}

use_floor_env() {
    local root=$1 prefix=${HPCTRAIN_FLOOR_VENV:-/var/cache/hpctrain/venv-floor} base
    if ! "$prefix/bin/python" -c '' 2>/dev/null; then
        base=$(floor_base_python)
        echo "$(basename "$0"): creating the floor environment in $prefix with $("$base" --version 2>&1)"
        "$base" -m venv --clear "$prefix"
    fi
    echo "$(basename "$0"): floor environment $prefix ($("$prefix/bin/python" --version 2>&1))"
    # The environment a user has (torch 2.2 with NumPy 1.x, as NGC 24.01 ships it), then hpctrain installed the
    # README's way, without the constraints file: it must keep that NumPy (tests/test_floor_install.py asks pip for
    # an environment without opencv each run, as this install does only when the environment is new).
    "$prefix/bin/python" -m pip install -q -c "$root/scripts/floor-constraints.txt" torch torchvision numpy
    "$prefix/bin/python" -m pip install -q -e "$root"
    "$prefix/bin/python" -c 'import numpy, sys; sys.exit(f"a plain install replaced NumPy 1.x with {numpy.__version__}"
                                                        if int(numpy.__version__.split(".")[0]) >= 2 else 0)'
    "$prefix/bin/python" -m pip install -q -c "$root/scripts/floor-constraints.txt" \
        pytest pytest-timeout pytest-xdist filelock scikit-image
}
