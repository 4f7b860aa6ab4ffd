#!/usr/bin/env bash
# Every CUDA path once, and the GPU figures, in one go on a GPU machine (issues 22, 33, 43).
#
# On the development machine, once (downloads the wheels the GPU image lacks, copies Fashion-MNIST):
#     bash benchmarks/gpu_check.sh --prepare
# On the GPU machine, from the repository root, carrying .whl and .gpudata (results go to $OUT, or ./gpu-results):
#     bash benchmarks/gpu_check.sh
# The steps, most wanted first (issue 43), each with its own time limit and all within GPU_CHECK_SECONDS (570):
#   machine      nvidia-smi, torch/CUDA/cuDNN/NCCL versions, CPU count; `hpctrain env`
#   graph_tests  pytest -m gpu on the CUDA-graph paths: the graphed MNIST step against the eager one, both recipes
#                on one GPU, exact resume after SIGUSR1/SIGTERM (fast) and SIGUSR1 (classic) from graphs
#   mnist_speed  tutorial loop vs classic epoch vs fast time to 90%, the recipes replaying CUDA graphs
#   imagenet50   ResNet-50 images/s and data-wait per input path: synthetic ceiling, cpu workers (reduced-size
#                decode), raw-pixel shards (prepare --format raw), nvjpeg, torchvision ImageFolder + DataLoader
#   imagenet18   ResNet-18: synthetic, raw shards, torchvision
#   mnist_eager  the recipes again with HPCTRAIN_CUDA_GRAPHS=0: the eager step in the same lease, for the ratio
#   decode       images/s per core of full decode, draft decode, jpeg and raw shards on this machine's CPU
#   multigpu     only with 2+ GPUs: DDP over NCCL, DataParallel, the hang detector on an NCCL hang, `--nproc`
#   tests        the other GPU tests (issues 22 and 33: backends, health paths, fp16, auto's proof)
# Each step's output is a file of its own in $OUT; summary.txt has each step's exit status and time; a failing
# step does not stop the next. GPU_CHECK_STEPS="imagenet18 tests" runs only those (a second, shorter command).
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
# whatever finished comes back (one file per step, and summary.txt).
DEADLINE=${GPU_CHECK_SECONDS:-570}
step() {  # step NAME LIMIT COMMAND...: output in $OUT/NAME.txt, exit status and time in $OUT/summary.txt
    local name=$1 limit=$2 start=$SECONDS status
    shift 2
    if [[ -n "${GPU_CHECK_STEPS:-}" && " $GPU_CHECK_STEPS " != *" $name "* ]]; then
        return
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
GRAPH_TESTS="graph or exact_resume or mnist_recipes"
if [[ "${GPU_CHECK_REHEARSE:-}" == 1 ]] || ! has_cuda; then
    echo "rehearsal on the CPU: no CUDA device (or GPU_CHECK_REHEARSE=1); small CPU forms of every step" \
        | tee -a "$OUT/summary.txt"
    gpus=0
    step machine 60 bash -c 'nproc; lscpu | head -20; python3 -c "import torch; print(torch.__version__)"; python3 -m hpctrain env'
    step graph_tests 120 python3 -m pytest -p no:cacheprovider -m gpu -v -rs -n 0 -k "$GRAPH_TESTS" tests/test_gpu.py
    step mnist_speed 300 python3 benchmarks/mnist_speed.py --data-dir .gpudata --device cpu --repeats 1 \
        --fast-epochs 1 --images 640 --skip classic
    step imagenet50 300 python3 benchmarks/imagenet_gpu.py --device cpu --images 24 --steps 2 --archs resnet18 \
        --workers 2 --raw-max-side 96 --backends "cpu,raw,nvjpeg,torchvision" --keep-data /tmp/gpu-check-rehearsal-data \
        --out "$OUT/imagenet.jsonl"
    step imagenet18 150 python3 benchmarks/imagenet_gpu.py --device cpu --images 24 --steps 2 --archs resnet18 \
        --workers 2 --raw-max-side 96 --backends raw --no-synthetic --keep-data /tmp/gpu-check-rehearsal-data \
        --out "$OUT/imagenet.jsonl"
    step mnist_eager 200 env HPCTRAIN_CUDA_GRAPHS=0 python3 benchmarks/mnist_speed.py --data-dir .gpudata \
        --device cpu --repeats 1 --fast-epochs 1 --skip tutorial,classic
    step decode 120 python3 benchmarks/decode_paths.py --images 12 --rounds 1 --size 192
    step multigpu 60 bash -c 'echo "1 GPU or none: the several-GPU paths wait for a lease with 2+ GPUs"'
    step tests 120 python3 -m pytest -p no:cacheprovider -m gpu -v -rs -n 0 -k "not ($GRAPH_TESTS)" tests/test_gpu.py
    exit 0
fi
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
step machine 30 bash -c 'nvidia-smi; nproc; lscpu | grep "Model name"; python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.nccl.version(), torch.cuda.get_device_capability())"; python3 -m hpctrain env'
step graph_tests 130 python3 -m pytest -p no:cacheprovider -m gpu -v -rs -n 4 --durations 0 -k "$GRAPH_TESTS" \
    tests/test_gpu.py
step mnist_speed 110 python3 benchmarks/mnist_speed.py --data-dir .gpudata --device cuda --repeats 1 --fast-epochs 1
step imagenet50 180 python3 benchmarks/imagenet_gpu.py --images 1500 --copies 8 --steps 30 --image-size 192 \
    --archs resnet50 --backends "cpu,raw,nvjpeg,torchvision$dali" --keep-data /tmp/imagenet-data \
    --out "$OUT/imagenet.jsonl"
step imagenet18 100 python3 benchmarks/imagenet_gpu.py --images 1500 --copies 8 --steps 30 --image-size 192 \
    --archs resnet18 --backends "raw,torchvision" --keep-data /tmp/imagenet-data --out "$OUT/imagenet.jsonl"
step mnist_eager 50 env HPCTRAIN_CUDA_GRAPHS=0 python3 benchmarks/mnist_speed.py --data-dir .gpudata --device cuda \
    --repeats 1 --fast-epochs 1 --skip tutorial
step decode 20 python3 benchmarks/decode_paths.py --images 96 --rounds 5 --size 192
MULTI_TESTS="dataparallel or ddp or nccl"
if ((gpus > 1)); then
    GRAPH_TESTS="$GRAPH_TESTS or $MULTI_TESTS"  # the tests step leaves them to the multigpu step
    step multigpu 200 bash -c "python3 -m pytest -p no:cacheprovider -m gpu -v -rs -n 0 -k '$MULTI_TESTS' \
        tests/test_gpu.py; python3 benchmarks/hang_detection.py --data-dir .gpudata --device cuda --nproc 2 --runs 2"
fi
step tests 200 python3 -m pytest -p no:cacheprovider -m gpu -v -rs -n 4 --durations 0 -k "not ($GRAPH_TESTS)" \
    tests/test_gpu.py
