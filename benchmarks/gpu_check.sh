#!/usr/bin/env bash
# The GPU check (issue #19): on a fresh GPU machine, run `pytest -m gpu` on the GPU tests and the
# GPU benchmarks, write their JSON and logs under ${OUT:-./gpu_out} and print a summary table last;
# everything also goes into one archive, $OUT/gpu_check.tgz (the lent machines return at most 8
# files: unpack it here, then `python benchmarks/gpu_summary.py DIR --record benchmarks/results`).
# Finishes within 6 minutes (every step has its own timeout; together 390 s; the whole check took
# 124 s on the H100 on 2026-11-28, gpu_profile.py's diagnosis of the training steps 20 s more).
#
# The machine has python3 3.12 with cupy (cupy-cuda13x 14.2), torch, numba, onnx, onnxruntime and
# scipy, and no network. isthmus's other pins travel as wheels in .whl/ at the repository root,
# prepared on a machine with network access:
#   P="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
#   for s in grpcio==1.85.1 'protobuf==7.35.*' cryptography==48.0.0 cffi; do
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $P -d .whl "$s"; done
#   for s in grpcio-health-checking==1.85.1 flatbuffers==25.12.19 threadpoolctl==3.6.0 tensorboardX==2.6.5 \
#            tflite==2.18.0 pycparser; do   # pure-Python wheels: no platform
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl "$s"; done
# Run from the repository root:  bash benchmarks/gpu_check.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu_out}
mkdir -p "$OUT"
LOG="$OUT/check.log"
T0=$(date +%s)
{
  echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC') tree $(cat .gpu_commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi -L || echo "nvidia-smi: not found"
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -3
  else
    echo "no .whl/ folder: using whatever the machine has"
  fi
} >"$LOG" 2>&1
mkdir -p /tmp/pkg && ln -sfn "$PWD" /tmp/pkg/isthmus
export PYTHONPATH=/tmp/pkg:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupy_cache}
python3 -c "import isthmus, numpy, cupy; from isthmus.core import gpu; print('isthmus', isthmus.__file__, 'numpy', numpy.__version__, 'cupy', cupy.__version__, 'gpu', gpu.gpu_available(), gpu.unavailable_reason())" >>"$LOG" 2>&1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.is_available())" >>"$LOG" 2>&1

step() {  # step NAME TIMEOUT_S OUTFILE CMD...
  local name=$1 t=$2 out=$3; shift 3
  local s=$(date +%s)
  echo "--- $name" >>"$LOG"
  timeout "$t" "$@" >"$out" 2>>"$LOG"
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - s ))s" >>"$LOG"
}
step pytest_gpu 80 "$OUT/pytest_gpu.log" python3 -m pytest -m gpu -p no:cacheprovider -rfEs --tb=short \
  tests/core/test_gpu*.py
step gpu_train 100 "$OUT/gpu_train.json" python3 benchmarks/gpu_train.py
step gpu_matmul 25 "$OUT/gpu_matmul.json" python3 benchmarks/gpu_matmul.py
step gpu_transfer 25 "$OUT/gpu_transfer.json" python3 benchmarks/gpu_transfer.py
step gpu_adds 25 "$OUT/gpu_adds.json" python3 benchmarks/gpu_adds.py
step gpu_data_parallel 25 "$OUT/gpu_data_parallel.json" python3 benchmarks/gpu_data_parallel.py
# the op tables (forward against numpy references, finite-difference gradients) with every Session on the GPU
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
step gpu_profile 60 "$OUT/gpu_profile.json" python3 benchmarks/gpu_profile.py --only pieces --only cnn --only mobilenet
step op_suites_on_gpu 50 "$OUT/pytest_ops_on_gpu.log" env ISTHMUS_DEVICE=gpu python3 -m pytest $XDIST -p no:cacheprovider \
  -rfE --tb=line tests/core/test_math_ops.py tests/core/test_nn_ops.py tests/core/test_reduce_ops.py \
  tests/core/test_conv_ops.py tests/core/test_batchnorm_paths.py tests/core/test_depthwise_grad.py \
  tests/core/test_pool_dilation.py tests/core/test_optimizers.py tests/core/test_array_ops.py
echo "total $(( $(date +%s) - T0 ))s" >>"$LOG"
python3 benchmarks/gpu_summary.py "$OUT" | tee "$OUT/summary.txt"
tar czf /tmp/gpu_check.tgz -C "$OUT" --exclude gpu_check.tgz . && mv /tmp/gpu_check.tgz "$OUT/"
