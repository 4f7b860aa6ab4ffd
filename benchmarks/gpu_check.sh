#!/usr/bin/env bash
# Every CUDA path once, and the GPU figures, in one go on a GPU machine (issue 22, part 2).
#
# On the development machine, once (downloads the wheels the GPU image lacks, copies Fashion-MNIST):
#     bash benchmarks/gpu_check.sh --prepare
# On the GPU machine, from the repository root, carrying .whl and .gpudata (results go to $OUT, or ./gpu-results):
#     bash benchmarks/gpu_check.sh
# It runs tests/test_gpu.py (pytest -m gpu: MNIST recipes, exact resume, DataParallel, DDP over NCCL when there
# are two GPUs, the library example on NCCL, hpctrain env, imagenet with each data backend; issue 33: the GPU's
# native autocast type and fp16 with a gradient scaler, auto's proven backend, nvjpeg on its own stream against the
# CPU decoder, the forward clock under DataParallel, NCCL keeping no tensors), then the benchmarks: the stop vote,
# MNIST vs the tutorial loop, checkpoint pauses (sync and async, from GPU memory) and imagenet images/s per backend.
# Each step's output is a file of its own; a failing step does not stop the next.
#
# Rehearsal: on a machine without CUDA (or with GPU_CHECK_REHEARSE=1) every step runs in a small CPU form, so that
# a broken argument or path shows before a lease: the GPU tests are collected and skip, the benchmarks run on the
# CPU with tiny sizes. summary.txt says "rehearsal" on its first line.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "${1:-}" = "--prepare" ]; then
    set -e
    # .whl/ and .gpudata/ are in .gitignore (a worktree's .git is a file, not a folder): carry them by name.
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
has_cuda() { python3 -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; }
if [[ "${GPU_CHECK_REHEARSE:-}" == 1 ]] || ! has_cuda; then
    echo "rehearsal on the CPU: no CUDA device (or GPU_CHECK_REHEARSE=1); small CPU forms of every step" \
        | tee -a "$OUT/summary.txt"
    step machine 60 bash -c 'nproc; lscpu | head -20; python3 -c "import torch; print(torch.__version__)"'
    step machine 60 python3 -m hpctrain env
    step tests 120 python3 -m pytest -p no:cacheprovider -m gpu -v -rs -n 0 tests/test_gpu.py
    step stop_vote 90 python3 benchmarks/stop_vote.py --device cpu --steps 2 --blocks 1
    step checkpoint_pause 90 python3 benchmarks/checkpoint_pause.py --device cpu --workloads mnist --checkpoints 2 \
        --steps-between 2 --repeats 1
    step mnist_speed 150 python3 benchmarks/mnist_speed.py --data-dir .gpudata --device cpu --repeats 1 \
        --fast-epochs 1 --skip tutorial,classic
    step imagenet 150 python3 benchmarks/imagenet_gpu.py --device cpu --images 32 --steps 2 --archs resnet18 \
        --backends "cpu,nvjpeg$dali" --out "$OUT/imagenet.jsonl"
    exit 0
fi
step machine 60 bash -c 'nvidia-smi; nproc; python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.nccl.version(), torch.cuda.get_device_capability())"'
step machine 60 python3 -m hpctrain env
step tests 280 python3 -m pytest -p no:cacheprovider -m gpu -v -rs -n 4 --durations 0 tests/test_gpu.py
step stop_vote 50 python3 benchmarks/stop_vote.py --device cuda
step checkpoint_pause 60 python3 benchmarks/checkpoint_pause.py --device cuda --repeats 1
step mnist_speed 150 python3 benchmarks/mnist_speed.py --data-dir .gpudata --device cuda --repeats 2
step imagenet 200 python3 benchmarks/imagenet_gpu.py --images 1500 --copies 8 --steps 40 --image-size 192 \
    --archs "${GPU_CHECK_ARCHS:-resnet50,resnet18}" --backends "cpu,nvjpeg$dali" --out "$OUT/imagenet.jsonl"
