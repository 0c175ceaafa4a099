#!/usr/bin/env bash
# Vendors the Go sources bindings/go/transfer needs (grpc-go, protobuf,
# client_golang and what they import) from Debian's packages, so that
# `go build`, `go vet` and `go test` in the module need no network and no
# module proxy. Debian installs Go sources under /usr/share/gocode/src as a
# GOPATH tree, not as a module cache; this script
#   1. lists the module's non-standard imports (tests included) in GOPATH
#      mode over a scratch GOPATH (the repository's two modules linked in,
#      then /usr/share/gocode),
#   2. copies each such package's files (no tests, no testdata) into
#      bindings/go/transfer/vendor/<import path>,
#   3. links vendor/kvx.dev/kvx to bindings/go (the core package; a link, so
#      its cgo ${SRCDIR}-relative paths still reach ../../build),
#   4. writes vendor/modules.txt and go.mod's require block: each package's
#      module is the nearest go.mod above it, its version the Debian
#      package's (dpkg) as a semantic version.
# vendor/ is not committed (it is the packages' bytes); run this after
# scripts/install-deps.sh and whenever the Debian packages change. CMake
# runs it before building kvxd. go.mod changes only when the packages'
# versions do. Runs are serialized (flock): several build directories may
# build kvxd at once. Nothing is done when vendor/modules.txt is newer than
# every .go file of the module and go.mod (--force vendors anyway, as after
# a Debian package upgrade). Usage: scripts/vendor-go.sh [--quiet] [--force]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mod="$root/bindings/go/transfer"
gocode=${KVX_GOCODE:-/usr/share/gocode/src}
quiet=0 force=0
for a in "$@"; do
  case "$a" in --quiet) quiet=1 ;; --force) force=1 ;; *) echo "usage: $0 [--quiet] [--force]" >&2; exit 2 ;; esac
done
say() { [ "$quiet" = 1 ] || echo "vendor-go: $*"; }

if command -v flock >/dev/null 2>&1 && [ -z "${KVX_VENDOR_LOCKED:-}" ]; then
  lock="${TMPDIR:-/tmp}/kvx-vendor-go.$(id -u).$(printf '%s' "$mod" | cksum | cut -d' ' -f1).lock"
  exec env KVX_VENDOR_LOCKED=1 flock "$lock" "$0" "$@"
fi
if [ "$force" = 0 ] && [ -f "$mod/vendor/modules.txt" ] && [ -e "$mod/vendor/kvx.dev/kvx/go.mod" ] &&
   [ -z "$(find "$mod" -path "$mod/vendor" -prune -o \( -name '*.go' -o -name go.mod \) -newer "$mod/vendor/modules.txt" -print | head -n 1)" ]; then
  say "vendor/ is up to date (--force to vendor again)"
  exit 0
fi

command -v go >/dev/null || { echo "vendor-go: go not found (apt-get install golang-go)" >&2; exit 1; }
for d in google.golang.org/grpc google.golang.org/protobuf github.com/prometheus/client_golang; do
  [ -d "$gocode/$d" ] || { echo "vendor-go: $gocode/$d missing: run scripts/install-deps.sh" >&2; exit 1; }
done

# grpc-go 1.33's codec goes through github.com/golang/protobuf: 1.3 (golang-
# github-golang-protobuf-1-3-dev) panics on APIv2 messages; 1.4+ wraps APIv2.
if ! grep -q google.golang.org/protobuf "$gocode/github.com/golang/protobuf/go.mod" 2>/dev/null; then
  echo "vendor-go: $gocode/github.com/golang/protobuf is older than 1.4: apt-get install golang-github-golang-protobuf-1-5-dev" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/gopath/src/kvx.dev" "$tmp/stage"
ln -s "$root/bindings/go" "$tmp/gopath/src/kvx.dev/kvx"
# the module's own tree, without a previous vendor/ (GOPATH mode would use it)
mkdir -p "$tmp/gopath/src/kvx.dev/transfer"
(cd "$mod" && tar --exclude=./vendor -cf - .) | (cd "$tmp/gopath/src/kvx.dev/transfer" && tar -xf -)

pkgs=$(cd "$tmp/gopath/src/kvx.dev/transfer" &&
  GO111MODULE=off GOPATH="$tmp/gopath:${gocode%/src}" GOFLAGS= CGO_ENABLED=1 \
  go list -e -deps -test -f '{{if not .Standard}}{{.ImportPath}}{{"\t"}}{{.Dir}}{{end}}' ./... 2>"$tmp/err" |
  grep -v -E '^kvx\.dev/' | grep -v -E '\.test\b|\[' | sort -u) || true
if [ -s "$tmp/err" ] && grep -q . "$tmp/err"; then cat "$tmp/err" >&2; fi
[ -n "$pkgs" ] || { echo "vendor-go: go list found no packages" >&2; exit 1; }

# semantic version of the Debian package owning file $1
debver() {
  local p v
  p=$(dpkg -S "$1" 2>/dev/null | head -n1 | cut -d: -f1) || true
  v=$( [ -n "$p" ] && dpkg-query -W -f='${Version}' "$p" 2>/dev/null) || true
  v=${v#*:}; v=${v%-*}; v=${v%%+*}
  if [[ $v =~ ^0\.0~git([0-9]{8})\.([0-9a-f]+)$ ]]; then
    echo "v0.0.0-${BASH_REMATCH[1]}000000-${BASH_REMATCH[2]}"
  elif [[ $v =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)$ ]]; then
    echo "v$v"
  elif [[ $v =~ ^([0-9]+)\.([0-9]+)$ ]]; then
    echo "v$v.0"
  else
    echo "v0.0.0-00010101000000-000000000000"
  fi
}

: >"$tmp/list"
while IFS=$'\t' read -r ip dir; do
  [ -n "$ip" ] || continue
  case "$dir" in "$gocode"/*) ;; *) echo "vendor-go: $ip is not under $gocode ($dir)" >&2; exit 1 ;; esac
  m="$dir"
  while [ "$m" != "$gocode" ] && [ ! -f "$m/go.mod" ]; do m=$(dirname "$m"); done
  if [ -f "$m/go.mod" ]; then
    mpath=$(awk '$1=="module"{gsub(/"/,"",$2); print $2; exit}' "$m/go.mod")
    mgo=$(awk '$1=="go"{print $2; exit}' "$m/go.mod")
    # the import path as the module names it (GOPATH mode drops a /vN suffix)
    rel=${dir#"$m"}; ip="$mpath$rel"
  else # a pre-module package: its repository root is the module
    case "$ip" in gopkg.in/*) mpath=$(echo "$ip" | cut -d/ -f1-2) ;; *) mpath=$(echo "$ip" | cut -d/ -f1-3) ;; esac
    m="$gocode/$mpath"; mgo=""
  fi
  printf '%s\t%s\t%s\t%s\n' "$mpath" "$ip" "$m" "${mgo:-}" >>"$tmp/list"
  mkdir -p "$tmp/stage/vendor/$ip"
  find "$dir" -maxdepth 1 -type f ! -name '*_test.go' -exec cp -p {} "$tmp/stage/vendor/$ip/" \;
done <<<"$pkgs"

# modules.txt and the require block, sorted by module path
sort -t$'\t' -k1,1 -k2,2 "$tmp/list" >"$tmp/sorted"
: >"$tmp/modules.txt"; : >"$tmp/require"
prev=""
while IFS=$'\t' read -r mpath ip mdir mgo; do
  if [ "$mpath" != "$prev" ]; then
    v=$(debver "$(find "$mdir" -maxdepth 1 -type f | head -n1)")
    printf '# %s %s\n## explicit%s\n' "$mpath" "$v" "${mgo:+; go $mgo}" >>"$tmp/modules.txt"
    printf '\t%s %s\n' "$mpath" "$v" >>"$tmp/require"
    prev=$mpath
  fi
  echo "$ip" >>"$tmp/modules.txt"
done <"$tmp/sorted"
kvxv=v0.0.0-00010101000000-000000000000
printf '# kvx.dev/kvx %s => ../\n## explicit; go 1.19\nkvx.dev/kvx\n# kvx.dev/kvx => ../\n' "$kvxv" >>"$tmp/modules.txt"
printf '\tkvx.dev/kvx %s\n' "$kvxv" >>"$tmp/require"

{
  echo "module kvx.dev/transfer"
  echo
  echo "go 1.19"
  echo
  echo "// Debian's packages, vendored by scripts/vendor-go.sh (no network)."
  echo "require ("
  sort "$tmp/require"
  echo ")"
  echo
  echo "replace kvx.dev/kvx => ../"
} >"$tmp/go.mod"

mkdir -p "$tmp/stage/vendor/kvx.dev"
ln -s ../../.. "$tmp/stage/vendor/kvx.dev/kvx"
if ! cmp -s "$tmp/go.mod" "$mod/go.mod"; then
  cp "$tmp/go.mod" "$mod/go.mod"
  say "go.mod written (the Debian packages' versions changed, or first run)"
fi
# modules.txt last: it is the stamp the up-to-date check compares against
mv "$tmp/modules.txt" "$tmp/stage/vendor/modules.txt"
old="$mod/.vendor.old.$$"
[ -e "$mod/vendor" ] && mv "$mod/vendor" "$old"
cp -a "$tmp/stage/vendor" "$mod/vendor"
rm -rf "$old"
say "$(grep -c '^## explicit' "$mod/vendor/modules.txt") modules, $(grep -vc '^#' "$mod/vendor/modules.txt") packages in bindings/go/transfer/vendor"
