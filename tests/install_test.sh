#!/bin/sh
# install_test.sh - kvx installed like a system library, checked as a new
# user would: `cmake --install BUILD --prefix P` into two scratch prefixes
# (never /usr/local), then with nothing but pkg-config (PKG_CONFIG_PATH =
# P's pkgconfig directory) a C program is compiled, linked against
# libkvx.so (found through an rpath) and against libkvx.a (plus what
# `pkg-config --static --libs kvx` lists), and run. The second prefix is
# also moved after install: kvx.pc is relocatable (prefix from
# ${pcfiledir}). The man page (man kvx with MANPATH=P/share/man) and the
# bash completion are checked in both, and install_manifest.txt against
# the files installed. When the build has the Python binding, the package is
# imported from the prefix; when `go` is there, the Go example is built
# with -tags kvx_system (`#cgo pkg-config: kvx`) and run. Registered in
# ctest (install_test).
#
#   tests/install_test.sh SOURCE_DIR BUILD_DIR CC [PYTHON]
set -eu
src=$1 build=$2 cc=$3 python=${4:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvx-install-test.XXXXXX")
# cmake --install rewrites BUILD/install_manifest.txt: a real install's
# manifest there is put back afterwards.
manifest="$build/install_manifest.txt"
if [ -f "$manifest" ]; then cp -p "$manifest" "$tmp/manifest.saved"; fi
restore() {
    if [ -f "$tmp/manifest.saved" ]; then cp -p "$tmp/manifest.saved" "$manifest"; else rm -f "$manifest"; fi
    rm -rf "$tmp"
}
trap restore EXIT
fail() { echo "install_test: $*" >&2; exit 1; }

check_prefix() {
    p=$1
    pc=$(find "$p" -name kvx.pc -path '*/pkgconfig/*' | head -n 1)
    [ -n "$pc" ] || fail "no kvx.pc under $p"
    export PKG_CONFIG_PATH="${pc%/kvx.pc}"
    libdir=$(pkg-config --variable=libdir kvx)
    incdir=$(pkg-config --variable=includedir kvx)
    [ -f "$incdir/kvx.h" ] || fail "pkg-config's includedir $incdir has no kvx.h"
    case "$(cd "$libdir" && pwd -P)" in
        "$(cd "$p" && pwd -P)"/*) ;;
        *) fail "pkg-config's libdir $libdir is not under $p" ;;
    esac
    "$p/bin/kvx" --version >/dev/null || fail "$p/bin/kvx --version failed"
    # kvxd (tl.kv.v1 daemon) is installed when the build made it (go and Debian's gRPC there)
    if [ -x "$build/kvxd" ]; then
        "$p/bin/kvxd" --help | grep -q 'kvxd <command>' || fail "$p/bin/kvxd --help failed"
    fi
    [ -f "$p/share/man/man1/kvx.1" ] || fail "no man page at $p/share/man/man1/kvx.1"
    if command -v man >/dev/null 2>&1; then
        MANPATH="$p/share/man" MANPAGER=cat MANWIDTH=80 man kvx 2>/dev/null | grep -q 'kvx warmup' ||
            fail "man kvx (MANPATH=$p/share/man) shows no page"
    fi
    comp="$p/share/bash-completion/completions/kvx"
    [ -f "$comp" ] || fail "no bash completion at $comp"
    if command -v bash >/dev/null 2>&1; then
        words=$(bash -c '. "$1"; COMP_WORDS=(kvx warmup --sink ""); COMP_CWORD=3; _kvx; echo "${COMPREPLY[*]}"' sh "$comp")
        [ "$words" = "host gpu discard" ] || fail "the bash completion of kvx warmup --sink gave '$words'"
    fi
    # Shared: -lkvx finds libkvx.so; the rpath lets it run.
    # shellcheck disable=SC2046
    "$cc" -std=c11 -Wall -Wextra -Werror -o "$tmp/prog-shared" "$src/tests/install_prog.c" \
        $(pkg-config --cflags --libs kvx) -Wl,-rpath,"$libdir"
    "$tmp/prog-shared" "$tmp/store-shared-$2" >/dev/null || fail "the shared build failed to run ($p)"
    readelf -d "$tmp/prog-shared" | grep -q 'NEEDED.*libkvx\.so' || fail "the shared build does not need libkvx.so"
    # Static: libkvx.a in place of -lkvx, then every library --static lists
    # (as Debian ships them: ISA-L has no static archive, it stays shared).
    static_libs=$(pkg-config --static --libs kvx | sed 's/-lkvx /-l:libkvx.a /')
    # shellcheck disable=SC2046,SC2086
    "$cc" -std=c11 -Wall -Wextra -Werror -o "$tmp/prog-static" "$src/tests/install_prog.c" \
        $(pkg-config --cflags kvx) $static_libs
    if readelf -d "$tmp/prog-static" | grep -q 'NEEDED.*libkvx\.so'; then fail "the static build needs libkvx.so"; fi
    "$tmp/prog-static" "$tmp/store-static-$2" >/dev/null || fail "the static build failed to run ($p)"
    echo "install_test: $p: C program built and run, shared and static"
}

cmake --install "$build" --prefix "$tmp/one" >/dev/null
cp "$manifest" "$tmp/manifest.one"
cmake --install "$build" --prefix "$tmp/two/nested/prefix" >/dev/null
mv "$tmp/two/nested/prefix" "$tmp/moved"   # relocated after install
check_prefix "$tmp/one" one
check_prefix "$tmp/moved" moved

# The Go example with -tags kvx_system (`#cgo pkg-config: kvx`): libkvx.so
# linked dynamically, found through the rpath. Debian's golang, offline.
if command -v go >/dev/null 2>&1 && [ -f "$src/bindings/go/go.mod" ]; then
    PKG_CONFIG_PATH=$(dirname "$(find "$tmp/one" -name kvx.pc | head -n 1)")
    export PKG_CONFIG_PATH
    [ -n "${HOME:-}${XDG_CACHE_HOME:-}${GOCACHE:-}" ] || export GOCACHE="$tmp/gocache"
    libdir=$(pkg-config --variable=libdir kvx)
    (cd "$src/bindings/go" && GOPROXY=off GOFLAGS=-buildvcs=false CGO_LDFLAGS="-Wl,-rpath,$libdir" \
        go build -tags kvx_system -o "$tmp/kvx-example" ./cmd/kvx-example) || fail "go build -tags kvx_system failed"
    readelf -d "$tmp/kvx-example" | grep -q 'NEEDED.*libkvx\.so' || fail "the Go example does not need libkvx.so"
    "$tmp/kvx-example" -store "$tmp/go-store" >/dev/null || fail "the Go example (kvx_system) failed to run"
    echo "install_test: go: kvx-example built with -tags kvx_system and run"
else
    echo "install_test: go: no go command, the Go check is left out"
fi

# The Python package, when the build has it: imported from the prefix.
if [ -n "$python" ]; then
    pydir=$(find "$tmp/one" -type d -name kvx -path '*-packages/kvx' | head -n 1)
    [ -n "$pydir" ] || fail "the build has the Python binding but no kvx package was installed under $tmp/one"
    (cd / && PYTHONPATH="${pydir%/kvx}" PYTHONDONTWRITEBYTECODE=1 "$python" -c '
import sys, kvx
if not kvx.__file__.startswith(sys.argv[1]):
    sys.exit("kvx imported from %s, not from the prefix" % kvx.__file__)
print("install_test: python: kvx", kvx.__version__, "from the prefix")' "$tmp/one/") ||
        fail "the installed Python package does not import"
fi

# The manifest names every file installed (README: removing an install):
# after xargs rm, only directories are left.
[ -n "$(find "$tmp/one" ! -type d)" ] || fail "nothing was installed under $tmp/one"
(cd "$tmp/one" && find "$PWD" ! -type d | sort) >"$tmp/found"
sort "$tmp/manifest.one" | diff - "$tmp/found" >&2 || fail "install_manifest.txt and the files under the prefix differ"
xargs rm <"$tmp/manifest.one"
[ -z "$(find "$tmp/one" ! -type d)" ] || fail "xargs rm < install_manifest.txt left files behind"
echo "install_test: install_manifest.txt names every installed file; xargs rm removes them"
