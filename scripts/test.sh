#!/usr/bin/env bash
# Set up a fresh Debian machine (as root) and run the whole test suite, the Slurm end-to-end tests included:
# Debian packages (Slurm, munge, shellcheck, Fashion-MNIST), hpctrain with its test extras, a two-node Slurm
# cluster on this host (scripts/local-slurm.sh), then pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh: run as root: it installs Debian packages and starts a local Slurm cluster" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive PIP_BREAK_SYSTEM_PACKAGES=1
apt-get update -qq
apt-get install -y -qq --no-install-recommends slurm-wlm munge shellcheck dataset-fashion-mnist git >/dev/null
python3 -m pip install -q -e '.[dev]'
bash scripts/local-slurm.sh up

status=0
python3 -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests; that is a failure here" >&2
    exit 1
fi
exit "$status"
