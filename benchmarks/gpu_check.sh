#!/usr/bin/env bash
# Every CUDA path once, and the GPU figures, in one go on a GPU machine (issue 22, part 2).
#
# On the development machine, once (downloads the wheels the GPU image lacks, copies Fashion-MNIST):
#     bash benchmarks/gpu_check.sh --prepare
# On the GPU machine, from the repository root, carrying .whl and .gpudata (results go to $OUT, or ./gpu-results):
#     bash benchmarks/gpu_check.sh
# It runs tests/test_gpu.py (pytest -m gpu: MNIST recipes, exact resume, DataParallel, DDP over NCCL when there
# are two GPUs, the library example on NCCL, hpctrain env, imagenet with each data backend), then the benchmarks:
# MNIST vs the tutorial loop, checkpoint pauses (sync and async, from GPU memory) and imagenet images/s per backend.
# Each step's output is a file of its own; a failing step does not stop the next.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "${1:-}" = "--prepare" ]; then
    set -e
    grep -qx '/.whl/' .git/info/exclude || echo /.whl/ >>.git/info/exclude
    grep -qx '/.gpudata/' .git/info/exclude || echo /.gpudata/ >>.git/info/exclude
    # The GPU image has torch, torchvision, numpy, opencv, pillow, rich, PyYAML, tensorboard and pytest; not these.
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl simplejpeg webdataset braceexpand
    mkdir -p .gpudata/fashion-mnist
    cp /usr/share/datasets/fashion-mnist/*.gz .gpudata/fashion-mnist/
    echo "gpu_check: ready; run it there with carry ['.whl', '.gpudata']"
    exit 0
fi

OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HPCTRAIN_TEST_FASHION_MNIST=$PWD/.gpudata/fashion-mnist
# A device lease is short: every step gets at most its own limit and never runs past DEADLINE seconds in all, so
# whatever finished comes back (8 files at most: summary.txt and one per step).
DEADLINE=${GPU_CHECK_SECONDS:-560}
step() {  # step NAME LIMIT COMMAND...: output in $OUT/NAME.txt, exit status and time in $OUT/summary.txt
    local name=$1 limit=$2 start=$SECONDS status
    shift 2
    if [[ -n "${GPU_CHECK_STEPS:-}" && " $GPU_CHECK_STEPS " != *" $name "* ]]; then
        return  # GPU_CHECK_STEPS="tests imagenet" runs only those steps (a second, shorter lease)
    fi
    ((limit > DEADLINE - SECONDS)) && limit=$((DEADLINE - SECONDS))
    if ((limit < 10)); then
        echo "$name: skipped, the deadline is near" | tee -a "$OUT/summary.txt"
        return
    fi
    timeout -k 5 "$limit" "$@" >>"$OUT/$name.txt" 2>&1
    status=$?
    echo "$name: exit $status, $((SECONDS - start)) s (limit $limit s)" | tee -a "$OUT/summary.txt"
}
dali=$(python3 -c 'import nvidia.dali' 2>/dev/null && echo ,dali)
step machine 60 bash -c 'nvidia-smi; nproc; python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.nccl.version())"'
step machine 60 python3 -m hpctrain env
step tests 220 python3 -m pytest -p no:cacheprovider -m gpu -v -rs -n 4 --durations 0 tests/test_gpu.py
step stop_vote 50 python3 benchmarks/stop_vote.py --device cuda
step checkpoint_pause 60 python3 benchmarks/checkpoint_pause.py --device cuda --repeats 1
step mnist_speed 150 python3 benchmarks/mnist_speed.py --data-dir .gpudata --device cuda --repeats 2
step imagenet 200 python3 benchmarks/imagenet_gpu.py --images 1500 --copies 8 --steps 40 --image-size 192 \
    --archs "${GPU_CHECK_ARCHS:-resnet50,resnet18}" --backends "cpu,nvjpeg$dali" --out "$OUT/imagenet.jsonl"
