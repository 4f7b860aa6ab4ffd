#!/usr/bin/env bash
# Set up a fresh Debian machine (as root) and run the whole test suite, the Slurm end-to-end tests included:
# Debian packages (Python, Slurm, munge, shellcheck, Fashion-MNIST, OpenSSH for the ssh dev session), hpctrain
# with its test extras in a virtual environment (see scripts/lib/venv.sh), a two-node Slurm cluster on this host
# (scripts/local-slurm.sh), a real Kubernetes API server with the Kubeflow CRDs (scripts/local-k8s.sh; its first
# run builds kube-apiserver from Debian's source package and caches it outside the checkout), then pytest on
# several workers (pytest-xdist): most of a Slurm test's time is spent waiting for Slurm (scheduling passes,
# requeue holds), and the workers overlap those waits with each other and with the CPU-bound local tests.
# HPCTRAIN_TEST_WORKERS sets their number (default 6: with the warm start, several tests at a time mostly wait on
# Slurm, pods or a timeout, and with 5 a run left the CPUs 12% idle; 8 used 5% more CPU in all, the same tests, and
# did not fill the 2-3 minutes in which every worker waits). With --dist loadgroup the tests of the real
# Kubernetes node (marked real_node: they hold it under a lock) run on one worker, one after another and first; that
# worker mostly waits on pods. Every other test goes to whichever worker is free, one at a time. Extra arguments go to pytest.
# Alongside, the tests marked `floor` run a second time in the floor environment (scripts/lib/floor.sh: the oldest
# supported torch, torchvision and Python), in a second pytest at the same time; HPCTRAIN_FLOOR=0 skips it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh: run as root: it installs Debian packages and starts a local Slurm cluster and API server" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# stage NAME: the time since the last stage ended, for the CI log (where a run's time goes).
stage_start=$SECONDS
stage() {
    echo "scripts/test.sh: stage $1: $((SECONDS - stage_start)) s"
    stage_start=$SECONDS
}
apt-get update -qq
apt-get install -y -qq --no-install-recommends python3 python3-venv ca-certificates procps git \
    slurm-wlm munge shellcheck dataset-fashion-mnist openssh-server openssh-client \
    chromium chromium-driver fonts-liberation >/dev/null  # the web console's browser test (tests/test_web_browser.py)
stage apt
# The slow parts of a fresh machine's set-up overlap: the API server's first build (CPU) runs while the two Python
# environments download (network); each logs to a file of its own, shown if it fails.
setup_logs=$(mktemp -d)
# Two API servers: one with a real node (containerd, a kubelet, the scheduler and the controller manager; every
# test whose pods must run, TrainJobs included: tests/real_node.py), and the default one without, for the tests
# that need only API objects. The node's cluster comes first: it builds every program in one make;
# the default one last, so that its context is the current one.
export HPCTRAIN_K8S_NODE_DIR=/var/lib/hpctrain-k8s-node HPCTRAIN_K8S_NODE_CONTEXT=hpctrain-node
(HPCTRAIN_K8S_DIR=$HPCTRAIN_K8S_NODE_DIR HPCTRAIN_K8S_CONTEXT=$HPCTRAIN_K8S_NODE_CONTEXT HPCTRAIN_K8S_NODES=1 \
    bash scripts/local-k8s.sh up && bash scripts/local-k8s.sh up) >"$setup_logs/k8s" 2>&1 &
k8s_pid=$!
floor_env_pid=""
if [ "${HPCTRAIN_FLOOR:-1}" != 0 ]; then
    # shellcheck source=scripts/lib/floor.sh
    source scripts/lib/floor.sh
    (use_floor_env "$PWD") >"$setup_logs/floor" 2>&1 &
    floor_env_pid=$!
fi
# shellcheck source=scripts/lib/venv.sh
source scripts/lib/venv.sh
use_python_env "$PWD"
"$PYTHON" -m pip install -q -e '.[dev,k8s]'
stage venv
# The test modules with their assertions rewritten, compiled once into tests/__pycache__ while the clusters start:
# every worker reads that (pytest reads a cached rewrite even where it may not write one, as under
# PYTHONDONTWRITEBYTECODE) instead of rewriting all of them itself, about 5 CPU s a worker.
(env -u PYTHONDONTWRITEBYTECODE "$PYTHON" -m pytest --collect-only -q -p no:cacheprovider) >"$setup_logs/collect" 2>&1 &
collect_pid=$!
bash scripts/local-slurm.sh up
stage slurm
waited() { # waited PID NAME: wait for a background set-up step; on failure show its log and stop
    if ! wait "$1"; then
        echo "scripts/test.sh: $2 failed:" >&2
        cat "$setup_logs/$2" >&2
        exit 1
    fi
    tail -n 3 "$setup_logs/$2"
    stage "$2"
}
waited "$k8s_pid" k8s
waited "$collect_pid" collect

# The suite is CPU-bound on 2 cores, and its longest chains are work that runs outside pytest: the real node's pods
# (its tests run one after another) and Slurm's job steps. pytest and everything it starts run niced, so that
# those go first; a real-node test runs its own commands at normal priority again (tests/real_node.py).
NICE=10
floor_pid=""
if [ -n "$floor_env_pid" ]; then
    waited "$floor_env_pid" floor
    FLOOR_PYTHON=$(floor_python)
    export HPCTRAIN_FLOOR_PYTHON=$FLOOR_PYTHON # also read by the main run (tests/test_torchrun_shim.py)
    floor_tmp=$(mktemp -d)
    # Only the files that name the mark are collected (each worker would import every test module for a few); a
    # test gets the floor mark by name (pytest.mark.floor), so its file always names it.
    mapfile -t floor_files < <(grep -lw floor tests/test_*.py)
    nice -n "$NICE" "$FLOOR_PYTHON" -m pytest -p no:cacheprovider -n 2 --dist worksteal --basetemp="$floor_tmp/t" -m floor \
        "${floor_files[@]}" >"$floor_tmp/log" 2>&1 &
    floor_pid=$!
fi

status=0
# Each test's CPU (tests/cpu_report.py): on 2 cores the suite is CPU-bound, so this, not --durations, says what to cut.
export HPCTRAIN_TEST_CPU_REPORT="${HPCTRAIN_TEST_CPU_REPORT:-$(mktemp -d)/cpu.jsonl}"
nice -n "$NICE" "$PYTHON" -m pytest -n "${HPCTRAIN_TEST_WORKERS:-6}" --dist loadgroup --durations=30 "$@" || status=$?
if [ -s "$HPCTRAIN_TEST_CPU_REPORT" ]; then
    "$PYTHON" tests/cpu_report.py "$HPCTRAIN_TEST_CPU_REPORT" 25 || true
fi
if [ -n "$floor_pid" ]; then
    floor_status=0
    wait "$floor_pid" || floor_status=$?
    echo "scripts/test.sh: the floor environment's tests ($FLOOR_PYTHON -m pytest -m floor):"
    tail -n 40 "$floor_tmp/log"
    if [ "$floor_status" -ne 0 ]; then
        echo "scripts/test.sh: the floor environment's tests failed (exit $floor_status); whole log: $floor_tmp/log" >&2
        if [ "$status" -eq 0 ]; then
            status=$floor_status
        fi
    fi
fi
if [ "$status" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests; that is a failure here" >&2
    exit 1
fi
stage pytest
exit "$status"
