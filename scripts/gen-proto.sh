#!/usr/bin/env bash
# Generates the Go code of proto/tl/kv/v1/kv.proto (Debian's protoc,
# protoc-gen-go 1.28 and protoc-gen-go-grpc 1.33) into OUTDIR, by default
# bindings/go/transfer/tlkvpb where it is checked in. The test
# TestGeneratedCodeFresh runs it into a temporary directory and fails when
# the checked-in files differ. Usage: scripts/gen-proto.sh [OUTDIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/bindings/go/transfer/tlkvpb}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
protoc -I "$root/proto" \
  --go_out="$tmp" --go_opt=module=kvx.dev/transfer \
  --go-grpc_out="$tmp" --go-grpc_opt=module=kvx.dev/transfer \
  "$root/proto/tl/kv/v1/kv.proto"
mkdir -p "$out"
cp "$tmp/tlkvpb/kv.pb.go" "$tmp/tlkvpb/kv_grpc.pb.go" "$out/"
