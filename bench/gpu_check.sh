#!/usr/bin/env bash
# gpu_check.sh - the one script a GPU run needs: builds kvx with CUDA (or
# takes prebuilt programs), runs the GPU tests and bench_gpu's full table
# (every candidate design with its per-stage times and its ratio to
# cudaMemcpy from pinned memory or to an O_DIRECT read of the same file;
# the spectral kernel against its memory bound and cuBLAS), and writes the
# results where they come back. About 2 minutes on an H200 host with 16
# cores (build ~1 min, tests ~30 s, bench ~1 min); well under 5.
#
#   bench/gpu_check.sh [DIR=/tmp] [MiB=1024] [OUT=$OUT or DIR/gpu_check]
#
# DIR holds the bench's shard (MiB of 2 MiB pages) and needs 2 x MiB free.
# OUT gets summary.txt, env.txt, tests.log, bench_gpu.tsv (at most four
# files: the device tool brings back what its command leaves in $OUT).
#
# Where the GPU machine lacks kvx's build dependencies (liburing, LMDB,
# ISA-L, cmocka: the lent H200 machines do), build a pack here first and
# carry it:
#   bench/gpu_check_prebuilt.sh --pack build-gpu-pack     # here
#   KVX_GPU_PREBUILT=build-gpu-pack bench/gpu_check.sh    # there
# Without KVX_GPU_PREBUILT, a build-gpu-pack folder found beside the
# sources is used when the dependencies are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-/tmp}
MIB=${2:-1024}
OUTD=${3:-${OUT:-$DIR/gpu_check}}
pack=${KVX_GPU_PREBUILT:-}
if [ -z "$pack" ]; then
  missing=""
  for m in liburing lmdb numa libisal libcrypto json-c hiredis cmocka; do
    pkg-config --exists "$m" 2>/dev/null || missing="$missing $m"
  done
  if [ -n "$missing" ]; then
    if [ -d build-gpu-pack/bin ]; then
      echo "gpu_check: missing build dependencies:$missing; using the prebuilt build-gpu-pack"
      pack=build-gpu-pack
    else
      echo "gpu_check: missing build dependencies:$missing. Build a pack where they are" >&2
      echo "  (bench/gpu_check_prebuilt.sh --pack build-gpu-pack), carry it, run with KVX_GPU_PREBUILT=build-gpu-pack" >&2
      exit 2
    fi
  fi
fi
if [ -z "$pack" ]; then
  if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
    echo "gpu_check: no CUDA toolkit (nvcc) here" >&2
    exit 77
  fi
  t0=$(date +%s)
  bench/gpu_check_prebuilt.sh --pack build-gpu-check-pack >/dev/null
  echo "gpu_check: built in $(($(date +%s) - t0)) s"
  pack=build-gpu-check-pack
fi
exec bench/gpu_check_prebuilt.sh "$pack" "$DIR" "$MIB" "$OUTD"
