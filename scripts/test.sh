#!/usr/bin/env bash
# Second command of the README: the whole test suite, as CI runs it.
#  1. plain build (with the CUDA path compiled and linked when nvcc is
#     there), the layering check (scripts/check-layers.sh: DESIGN.md's
#     allowed edges, no cycles, LMDB only in index/, files <= 900 lines),
#     and every ctest test: unit, crash, fault, two-process, CLI,
#     fuzz-corpus replay, the Python binding's pytest suite (when
#     /usr/bin/python3's headers are there), install_test (cmake --install
#     into scratch prefixes; a C program built with pkg-config alone,
#     shared and static; import kvx from the prefix);
#  2. the Python package as users install it (scripts/test-python.sh):
#     pip install . under Debian's python3 and pyenv's 3.10, 3.11, 3.12
#     and 3.13 (each named; a missing one fails), the abi3 and cp310 wheels
#     and the sdist, the Python tests from the installed wheel under each,
#     pip install -e, and the wheels tested in a chroot without the build
#     dependencies (about 3-4 minutes on 2 cores);
#  3. the same suite under AddressSanitizer + UndefinedBehaviorSanitizer;
#  4. a short libFuzzer smoke run of each harness (clang; about 3 minutes
#     in all, KVX_FUZZ_SECONDS each to change it);
#  5. the Go package: go vet, go test, go test -race.
# Set KVX_TEST_QUICK=1 to run only step 1.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
step() { printf '\n==> %s\n' "$*"; }

step "plain build and tests"
cmake -S . -B build -DKVX_BUILD_TESTS=ON >/dev/null
cmake --build build -j"$jobs"
step "layers"
bash scripts/check-layers.sh build
ctest --test-dir build --output-on-failure -j"$jobs"

[ "${KVX_TEST_QUICK:-0}" = 1 ] && exit 0

step "the Python package: pip install, wheels, every interpreter, standalone"
bash scripts/test-python.sh

step "AddressSanitizer + UndefinedBehaviorSanitizer build and tests"
cmake -S . -B build-asan -DKVX_BUILD_TESTS=ON -DKVX_SANITIZE=ON -DKVX_WITH_CUDA=OFF -DKVX_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs"

step "libFuzzer smoke run"
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DKVX_BUILD_FUZZERS=ON -DKVX_BUILD_TESTS=OFF -DKVX_WITH_CUDA=OFF -DKVX_BUILD_BENCH=OFF >/dev/null
cmake --build build-fuzz -j"$jobs"
# about 3 minutes in all: KVX_FUZZ_SECONDS each, or 180 s shared
fuzzers=(build-fuzz/fuzz/fuzz_*)
secs=${KVX_FUZZ_SECONDS:-$((180 / ${#fuzzers[@]}))}
for fz in "${fuzzers[@]}"; do
  name=${fz##*/fuzz_}
  work=$(mktemp -d)
  cp fuzz/corpus/"$name"/* "$work"/
  dict=()
  [ -f fuzz/"$name".dict ] && dict=(-dict=fuzz/"$name".dict)
  echo "fuzz_$name: $secs s"
  "$fz" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 "${dict[@]}" "$work" 2>&1 | tail -n 2
  rm -rf "$work"
done

if [ -f bindings/go/go.mod ]; then
  step "Go package"
  (cd bindings/go && go vet ./... && go test -count=1 ./... && go test -count=1 -race ./...)
fi
echo "all kvx tests passed"
