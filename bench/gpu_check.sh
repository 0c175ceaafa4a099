#!/usr/bin/env bash
# gpu_check.sh - build kvx with CUDA, run the GPU test, then upload a
# generated shard to the GPU (warm and cold), copy every page back, compare
# with the file, and time it against cudaMemcpy of the same bytes.
# Prints a short table. Meant for a GPU machine; finishes in well under 5
# minutes (a parallel build, a 2-second test, ~1 GiB moved a few times).
#   bench/gpu_check.sh [DIR=/tmp] [MiB=1024]
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-/tmp}
MIB=${2:-1024}
B=${KVX_GPU_BUILD:-build-gpu-check}
if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  echo "gpu_check: no CUDA toolkit (nvcc) here" >&2
  exit 77
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L || true
cmake -S . -B "$B" -DKVX_WITH_CUDA=ON -DKVX_BUILD_TESTS=ON -DKVX_BUILD_BENCH=ON \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$B" -j"$(nproc)" --target test_io_gpu_cuda test_io_pool test_io_fetch test_io_warmup bench_gpu >/dev/null
ulimit -l unlimited 2>/dev/null || true
for t in pool fetch warmup gpu_cuda; do
  rc=0
  timeout 120 "$B/tests/io/$t" >"$DIR/gpu_check_$t.log" 2>&1 || rc=$?
  case $rc in
    0) echo "io/$t: ok" ;;
    77) echo "io/$t: skipped ($(tail -1 "$DIR/gpu_check_$t.log"))" ;;
    *) echo "io/$t: FAILED (rc $rc)"; tail -20 "$DIR/gpu_check_$t.log"; exit 1 ;;
  esac
done
timeout 180 "$B/bench/bench_gpu" "$DIR" "$MIB"
