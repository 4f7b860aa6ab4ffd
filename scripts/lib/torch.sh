# shellcheck shell=bash
# Sourced by scripts/quickstart.sh: which torch build goes into the environment, said in one line.
#   - a torch the environment already has is kept (hpctrain works with any torch >= 2.2);
#   - HPCTRAIN_TORCH_INDEX_URL, when set: torch and torchvision come from that package index (pip --index-url),
#     for instance one that serves CPU-only builds, a small part of the CUDA build's downloads;
#   - else pip's default torch: on Linux the CUDA build, about 5.7 GB with its CUDA libraries.
# choose_torch PYTHON says which, and sets TORCH_INSTALL to the arguments of the `pip install` that installs it
# before hpctrain (empty: nothing to install first).

choose_torch() {
    local python=$1 have gpus
    # shellcheck disable=SC2034 # read by the script that sources this file
    TORCH_INSTALL=()
    if have=$("$python" -c 'import torch
print(torch.__version__, f"(CUDA {torch.version.cuda} build)" if torch.version.cuda else "(CPU build)")' 2>/dev/null); then
        echo "quickstart: keeping torch $have, which this environment already has"
        return
    fi
    if [ -n "${HPCTRAIN_TORCH_INDEX_URL:-}" ]; then
        echo "quickstart: installing torch and torchvision from HPCTRAIN_TORCH_INDEX_URL=$HPCTRAIN_TORCH_INDEX_URL" \
            "(the build that index serves)"
        # shellcheck disable=SC2034
        TORCH_INSTALL=(--index-url "$HPCTRAIN_TORCH_INDEX_URL" torch torchvision)
        return
    fi
    if [ "$(uname -s)" != Linux ]; then
        echo "quickstart: installing pip's default torch for $(uname -s)"
        return
    fi
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
    if [ "${gpus:-0}" -gt 0 ]; then
        echo "quickstart: installing pip's default torch, the CUDA build (about 5.7 GB): this machine has $gpus NVIDIA GPU(s)"
    else
        echo "quickstart: installing pip's default torch, the CUDA build (about 5.7 GB), though nvidia-smi shows no" \
            "NVIDIA GPU here; for a CPU-only build, set HPCTRAIN_TORCH_INDEX_URL to a package index that serves one" \
            "(README, Quick start)"
    fi
}
