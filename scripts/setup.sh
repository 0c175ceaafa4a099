#!/usr/bin/env bash
# First command of the README: install the dependencies (Debian 12), build
# kvx into build/, and run `kvx demo` to see it work end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
./build/kvx demo
