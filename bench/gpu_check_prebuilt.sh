#!/usr/bin/env bash
# gpu_check_prebuilt.sh - gpu_check.sh's runs for a GPU machine that lacks
# kvx's build dependencies (liburing, LMDB, ISA-L, cmocka): the programs
# are built elsewhere with CUDA (cmake -DKVX_WITH_CUDA=ON -DKVX_BUILD_TESTS=ON
# -DKVX_BUILD_BENCH=ON -DCMAKE_BUILD_TYPE=Release, targets test_io_gpu_cuda
# test_io_pool test_io_fetch test_io_warmup bench_gpu) and copied with their
# shared libraries:
#   bench/gpu_check_prebuilt.sh PREBUILT [DIR=/tmp] [MiB=1024]
# PREBUILT holds bin/ (the five programs: BUILD/tests/io/{pool,fetch,warmup,gpu_cuda}
# and BUILD/bench/bench_gpu) and lib/ (ldd's non-system libraries). Prints the same lines as gpu_check.sh.
set -euo pipefail
P=$1
DIR=${2:-/tmp}
MIB=${3:-1024}
export LD_LIBRARY_PATH="$P/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
command -v nvidia-smi >/dev/null && nvidia-smi -L || true
uname -r
ulimit -l unlimited 2>/dev/null || true
status=0
for t in pool fetch warmup gpu_cuda; do
  rc=0
  timeout 120 "$P/bin/$t" >"$DIR/gpu_check_$t.log" 2>&1 || rc=$?
  case $rc in
    0) echo "io/$t: ok" ;;
    77) echo "io/$t: skipped ($(tail -1 "$DIR/gpu_check_$t.log"))" ;;
    *) echo "io/$t: FAILED (rc $rc)"; tail -30 "$DIR/gpu_check_$t.log"; status=1 ;;
  esac
done
timeout 180 "$P/bin/bench_gpu" "$DIR" "$MIB" || status=1
exit $status
