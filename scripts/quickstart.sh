#!/usr/bin/env bash
# Install hpctrain into a virtual environment (.venv here, or the active venv/conda env; see scripts/lib/venv.sh),
# fetch and verify Fashion-MNIST, and train the default recipe on this machine (CPU or GPUs).
# Extra arguments go to `hpctrain train mnist` (e.g. --recipe classic, --nproc 2, --epochs 3).
# It says which torch build it installs (scripts/lib/torch.sh); HPCTRAIN_TORCH_INDEX_URL=URL takes torch and
# torchvision from the package index at URL, e.g. one that serves CPU-only builds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib/venv.sh
source scripts/lib/venv.sh
use_python_env "$PWD"
# shellcheck source=scripts/lib/torch.sh
source scripts/lib/torch.sh
choose_torch "$PYTHON"
if [ "${#TORCH_INSTALL[@]}" -gt 0 ]; then
    "$PYTHON" -m pip install -q "${TORCH_INSTALL[@]}"
fi
"$PYTHON" -m pip install -q -e .
# Debian and Ubuntu package Fashion-MNIST; hpctrain uses that copy when it is there, else the public mirrors.
if [ ! -d /usr/share/datasets/fashion-mnist ] && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null ||
        echo "quickstart: no Debian package; downloading from the public mirrors instead" >&2
fi
hpctrain download fashion-mnist --data-dir data
hpctrain train mnist --dataset fashion-mnist --data-dir data --run-dir "runs/quickstart-$(date +%Y%m%d-%H%M%S)" "$@"
if [ -z "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}${HPCTRAIN_VENV:-}" ]; then
    echo "quickstart: hpctrain is installed in .venv; for the next commands: source .venv/bin/activate"
fi
