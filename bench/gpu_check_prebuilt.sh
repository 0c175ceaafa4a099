#!/usr/bin/env bash
# gpu_check_prebuilt.sh - gpu_check.sh's runs from programs built elsewhere,
# for a GPU machine that lacks kvx's build dependencies (liburing, LMDB,
# ISA-L, cmocka, ...). Two modes:
#
#   bench/gpu_check_prebuilt.sh --pack [PACK=build-gpu-pack]
#       here, where the dependencies are: builds the GPU programs with CUDA
#       (Release) and copies them to PACK/bin, and the shared libraries they
#       load that a CUDA machine may lack to PACK/lib (not glibc, not the
#       driver's libcuda; cuBLAS is never linked: bench_gpu loads the GPU
#       machine's own with dlopen). PACK is ignored by git (/build*/): carry
#       it to the GPU machine (the device tool's `carry`; ~30 MiB).
#
#   bench/gpu_check_prebuilt.sh PACK [DIR=/tmp] [MiB=1024] [OUT=$OUT or DIR/gpu_check]
#       on the GPU machine: runs the GPU tests and bench_gpu's full table
#       from PACK (gpu_check.sh does the same after building). Prints a
#       summary and writes at most four files to OUT: summary.txt (what it
#       printed), env.txt (GPU, driver, kernel, CPUs, CUDA), tests.log (every
#       test's output), bench_gpu.tsv (bench_gpu's rows). Exit 0 when every
#       test passed or was skipped (77) and bench_gpu verified every page.
#
# Tests run, in this order: io/gpu_crc (the CRC kernel's math on the
# host vs ISA-L), io/gpu (the CPU side behind a fake device),
# io/pool, io/fetch, io/warmup, io/gpu_cuda (upload, warmup to the GPU),
# io/warmup_gpu (every path on the GPU, a rotten page never delivered, the
# spectral kernel vs the CPU). Then bench_gpu DIR MiB.
set -euo pipefail
# the ctest programs tests/io/<file>.c, by their CMake targets test_io_<file>
PROGS="test_io_gpu_crc test_io_gpu test_io_pool test_io_fetch test_io_warmup test_io_gpu_cuda test_io_warmup_gpu"

if [ "${1:-}" = --pack ]; then
  cd "$(dirname "$0")/.."
  P=${2:-build-gpu-pack}
  B=${KVX_GPU_BUILD:-build-gpu-pack-build}
  cmake -S . -B "$B" -DKVX_WITH_CUDA=ON -DKVX_BUILD_TESTS=ON -DKVX_BUILD_BENCH=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  # shellcheck disable=SC2086
  cmake --build "$B" -j"$(nproc)" --target $PROGS bench_gpu >/dev/null
  rm -rf "$P"
  mkdir -p "$P/bin" "$P/lib"
  for t in $PROGS; do cp "$B/tests/io/${t#test_io_}" "$P/bin/$t"; done
  cp "$B/bench/bench_gpu" "$P/bin/"
  strip --strip-debug "$P"/bin/* 2>/dev/null || true
  # the shared libraries the programs load, but glibc's own, the C++ runtime
  # and the GPU driver (the machine's own must be used)
  for f in "$P"/bin/*; do ldd "$f"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libgcc_s|libstdc\+\+|libcuda|libnvidia[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$P/lib/"; done
  git describe --always --dirty >"$P/commit" 2>/dev/null || true
  du -sh "$P"
  exit 0
fi

P=${1:?usage: gpu_check_prebuilt.sh PACK [DIR] [MiB] [OUT] | --pack [PACK]}
P=$(cd "$P" && pwd)
DIR=${2:-/tmp}
MIB=${3:-1024}
OUTD=${4:-${OUT:-$DIR/gpu_check}}
mkdir -p "$OUTD"
# the machine's own CUDA libraries (cuBLAS for bench_gpu's reference) after the pack's
cudalib=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && cudalib="$cudalib:$d"
done
export LD_LIBRARY_PATH="$P/lib$cudalib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ulimit -l unlimited 2>/dev/null || true
summary="$OUTD/summary.txt"
: >"$summary"
say() { printf '%s\n' "$*" | tee -a "$summary"; }
{
  echo "date: $(date -u +%FT%TZ)"
  echo "pack: $P (commit $(cat "$P/commit" 2>/dev/null || echo unknown))"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader || echo "no nvidia-smi"
  echo "kernel: $(uname -r)  cpus: $(nproc)  memory: $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo)"
  echo "cuda: $(echo /usr/local/cuda*/)"
  echo "fio: $(command -v fio || echo none)  root: $([ "$(id -u)" = 0 ] && echo yes || echo no)"
  df -h "$DIR" | tail -1
} >"$OUTD/env.txt" 2>&1
tee -a "$summary" <"$OUTD/env.txt"
status=0
log="$OUTD/tests.log"
: >"$log"
for t in $PROGS; do
  rc=0
  t0=$(date +%s)
  echo "=== $t" >>"$log"
  if [ ! -x "$P/bin/$t" ]; then
    say "$t: not in this pack"
    continue
  fi
  timeout 150 "$P/bin/$t" >>"$log" 2>&1 || rc=$?
  secs=$(($(date +%s) - t0))
  case $rc in
    0) say "$t: ok (${secs}s)" ;;
    77) say "$t: skipped ($(tail -1 "$log"))" ;;
    *) say "$t: FAILED (rc $rc, ${secs}s)"; tail -30 "$log" | tee -a "$summary"; status=1 ;;
  esac
done
rc=0
timeout 240 "$P/bin/bench_gpu" "$DIR" "$MIB" "$OUTD/bench_gpu.tsv" 2>&1 | tee -a "$summary" || rc=$?
case $rc in
  0) ;;
  77) say "bench_gpu: skipped (no GPU or no CUDA)" ;;
  *) say "bench_gpu: FAILED (rc $rc)"; status=1 ;;
esac
exit $status
