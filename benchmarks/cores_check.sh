#!/usr/bin/env bash
# Issue #24's 16-core rows, on a lent GPU machine's CPUs (16 cores; the GPU is not used): the CNN
# training step at 1, 2 and all threads against PyTorch CPU (benchmarks/cnn.py), and
# `converters_infer.py` at default threads (--threads 0) and at one thread, against onnxruntime.
# Writes their JSON and a log under ${OUT:-./cores_out} and one archive of them, cores_check.tgz.
# Run it as its own call (the GPU check is another): numba compiles isthmus's kernels on a fresh
# machine first (the warm-up step), then every step has its own timeout; together 540 s.
# The machine's python3 has numba, onnx, onnxruntime and torch; isthmus's other pins travel as
# wheels in .whl/ (benchmarks/gpu_check.sh's header says how to prepare them).
# Run from the repository root:  bash benchmarks/cores_check.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-./cores_out}
mkdir -p "$OUT"
LOG="$OUT/cores.log"
{
  echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC') tree $(cat .gpu_commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "cores $(nproc); $(grep -m1 'model name' /proc/cpuinfo)"
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -3
  fi
} >"$LOG" 2>&1
mkdir -p /tmp/pkg && ln -sfn "$PWD" /tmp/pkg/isthmus
export PYTHONPATH=/tmp/pkg:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE  # NOTES.md: the pin makes numpy's GEMM slower than on a user's machine

step() {  # step NAME TIMEOUT_S OUTFILE CMD...
  local name=$1 t=$2 out=$3; shift 3
  local s=$(date +%s)
  echo "--- $name" >>"$LOG"
  timeout "$t" "$@" >"$out" 2>>"$LOG"
  echo "$name rc=$? $(( $(date +%s) - s ))s" >>"$LOG"
}
# compile the kernels once (numba's cache), so the timed steps do not pay for it
step warm_up 150 /dev/null python3 benchmarks/converters_infer.py --repeats 1 --batches 1
step cnn_train 130 "$OUT/cnn.json" python3 benchmarks/cnn.py
step converters_infer_threads0 130 "$OUT/converters_infer_threads0.json" \
  python3 benchmarks/converters_infer.py --threads 0 --repeats 11
step converters_infer_1_thread 130 "$OUT/converters_infer.json" python3 benchmarks/converters_infer.py --repeats 11
tar czf /tmp/cores_check.tgz -C "$OUT" --exclude cores_check.tgz . && mv /tmp/cores_check.tgz "$OUT/"
grep -E "rc=|cores" "$LOG"
