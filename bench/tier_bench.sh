#!/usr/bin/env bash
# tier_bench.sh [BUILD_DIR] [ROUNDS] - bench_tier against a redis-server
# and a 3-master Redis Cluster it starts itself on loopback (temporary
# directories, stopped at the end): ROUNDS rounds of each (default 3),
# with the machine and its load printed first. bench/RESULTS.md, "Shared
# tier", records its output.
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
bin=$build/bench/bench_tier
command -v redis-server >/dev/null || { echo "tier_bench: redis-server not installed" >&2; exit 77; }
[ -x "$bin" ] || { echo "tier_bench: $bin not built" >&2; exit 2; }
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
start() { # PORT [cluster]
  mkdir -p "$tmp/$1"
  local extra=()
  [ "${2:-}" = cluster ] && extra=(--cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000)
  redis-server --port "$1" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp/$1" --logfile "$tmp/$1/log" \
    "${extra[@]}" &
  pids+=($!)
  for _ in $(seq 100); do redis-cli -p "$1" ping >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "tier_bench: redis-server on $1 did not start" >&2
  exit 1
}
base=$((20000 + RANDOM % 20000))
start $base
for i in 1 2 3; do start $((base + i)) cluster; done
redis-cli --cluster create 127.0.0.1:$((base + 1)) 127.0.0.1:$((base + 2)) 127.0.0.1:$((base + 3)) --cluster-yes >/dev/null
for _ in $(seq 100); do
  redis-cli -p $((base + 1)) cluster info | grep -q cluster_state:ok && break
  sleep 0.1
done
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(redis-server --version | cut -d' ' -f1-3)"
for r in $(seq "$rounds"); do
  echo "== round $r, one server; $(uptime | sed 's/.*load/load/')"
  "$bin" --url redis://127.0.0.1:$base --blocks 64 --iters 10 --redis-benchmark
  echo "== round $r, cluster of 3 masters; $(uptime | sed 's/.*load/load/')"
  "$bin" --url redis://127.0.0.1:$((base + 1)) --cluster --blocks 64 --iters 10 --redis-benchmark
done
echo "== the Mooncake trace across two stores sharing the tier; $(uptime | sed 's/.*load/load/')"
"$build/bench/bench_tier_trace" --url redis://127.0.0.1:$base --requests "${KVX_TIER_TRACE_REQUESTS:-1000}" "$tmp/trace"
