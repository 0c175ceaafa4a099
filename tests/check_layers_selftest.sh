#!/usr/bin/env bash
# check_layers_selftest.sh CHECK_LAYERS - a self-test of
# scripts/check-layers.sh: the script is copied into small synthetic trees
# in a temp dir (common/ format/ index/ engine/ io/ cli/ with tiny .c/.h
# files). A clean tree passes (LMDB in index/, a 900-line .c, allowed
# edges only); each rule broken on its own makes it fail (exit 1) with a
# message naming the file and the rule: an include that DESIGN.md does
# not allow (format -> engine, io -> engine), cli/ reaching past kvx.h, an
# mdb_ call or <lmdb.h> outside index/, an include cycle, a .c over 900
# lines, an include of another folder's header without its folder. With
# cc and nm, tiny objects laid out like the build's
# (BUILD_DIR/CMakeFiles/kvx_objects.dir/<folder>/x.c.o) check a call edge
# no include shows and a global symbol without the kvx_ prefix (weak too).
# Registered with ctest (tests/CMakeLists.txt).
set -u
script=${1:?usage: check_layers_selftest.sh path/to/check-layers.sh}
[ -f "$script" ] || { echo "selftest: $script: no such file" >&2; exit 1; }
script=$(cd "$(dirname "$script")" && pwd)/$(basename "$script")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tree=$tmp/t
passed=0
failed=0

pass() { passed=$((passed + 1)); printf 'ok   %s\n' "$1"; }
fail() { failed=$((failed + 1)); printf 'FAIL %s: %s\n' "$1" "$2"; sed 's/^/     | /' "$tmp/err"; }

# A clean tree: every edge allowed, LMDB only in index/.
make_tree() {
  rm -rf "$tree"
  mkdir -p "$tree/scripts" "$tree/include" "$tree"/{common,format,index,engine,io,cli}
  cp "$script" "$tree/scripts/check-layers.sh"
  cd "$tree" || exit 1
  echo 'int kvx_version(void);' >include/kvx.h
  printf '#ifndef COMMON_H\n#define COMMON_H\nint kvx_common_fn(void);\n#endif\n' >common/common.h
  printf '#ifndef INTERNAL_H\n#define INTERNAL_H\nint kvx_common_internal(void);\n#endif\n' >common/internal.h
  printf '#include "common.h"\n#include "internal.h"\nint kvx_common_internal(void) { return 1; }\nint kvx_common_fn(void) { return kvx_common_internal(); }\n' >common/common.c
  printf '#include "common/common.h"\nint kvx_format_fn(void);\n' >format/format.h
  printf '#include "format.h"\nint kvx_format_fn(void) { return kvx_common_fn(); }\n' >format/format.c
  printf '#include "common/common.h"\nint kvx_index_fn(void);\n' >index/index.h
  printf '#include <lmdb.h>\n#include "index.h"\nint kvx_index_fn(void) { return mdb_get(0, 0, 0, 0); }\n' >index/index.c
  printf '#include "index/index.h"\n#include "format/format.h"\nint kvx_engine_fn(void);\n' >engine/engine.h
  # kvx_mdb_wrap( is not an LMDB call (no word boundary before mdb_)
  printf '#include "kvx.h"\n#include "common/common.h"\n#include "engine.h"\nint kvx_mdb_wrap(void);\nint kvx_engine_fn(void) { return kvx_format_fn() + kvx_common_fn(); }\nint kvx_mdb_wrap(void) { return 0; }\n' >engine/engine.c
  { echo '/* exactly 900 lines: at the limit */'; for _ in $(seq 899); do echo; done; } >engine/long.c
  printf '#include "format/format.h"\n#include "common/common.h"\nint kvx_io_fn(void);\n' >io/io.h
  printf '#include "io.h"\nint kvx_io_fn(void) { return kvx_format_fn(); }\n' >io/io.c
  printf 'int cli_util(void);\n' >cli/util.h
  printf '#include "kvx.h"\n#include "util.h"\nint main(void) { return cli_util(); }\n' >cli/main.c
}

# run [BUILD_DIR]: the copied script on $tree; stdout and stderr kept.
run() { (cd "$tree" && bash scripts/check-layers.sh "$@" >"$tmp/out" 2>"$tmp/err"); echo $?; }

# expect_ok NAME [BUILD_DIR]
expect_ok() {
  local name=$1 rc
  shift
  rc=$(run "$@")
  if [ "$rc" = 0 ] && grep -q '^check-layers: ok$' "$tmp/out"; then pass "$name"; else fail "$name" "exit $rc, want 0 and 'check-layers: ok'"; fi
}

# expect_fail NAME FILE RULE [BUILD_DIR]: exit 1, and one line of stderr
# names both FILE and RULE (fixed strings).
expect_fail() {
  local name=$1 file=$2 rule=$3 rc
  shift 3
  rc=$(run "$@")
  if [ "$rc" != 1 ]; then fail "$name" "exit $rc, want 1"; return; fi
  if grep -F -- "$file" "$tmp/err" | grep -qF -- "$rule"; then pass "$name"; else fail "$name" "no message naming '$file' and '$rule'"; fi
}

make_tree
expect_ok "clean tree passes"
if grep -Eq '^  engine +-> common format index $' "$tmp/out"; then pass "graph: engine -> common format index"; else fail "graph: engine -> common format index" "not in the printed graph"; cat "$tmp/out"; fi

make_tree
echo '#include "engine/engine.h"' >format/up.c
expect_fail "format/ includes engine/x.h" format/up.c 'format -> engine is not an allowed edge'
expect_fail "format/ includes engine/x.h: a cycle between folders" engine 'a cycle between folders'

make_tree
echo '#include "engine/engine.h"' >>io/io.c
expect_fail "io/ includes an engine header" io/io.c 'io -> engine is not an allowed edge'

make_tree
echo '#include "common/internal.h"' >cli/peek.c
expect_fail "cli/ includes common/internal.h" cli/peek.c 'cli/ uses include/kvx.h only'

make_tree
printf 'int kvx_engine_peek(void *t) { return mdb_get(t, 0, 0, 0); }\n' >engine/peek.c
expect_fail "mdb_get( in engine/" engine/peek.c:1: 'LMDB outside index/'

make_tree
printf '/* ok */\n#include <lmdb.h>\n' >engine/peek.c
expect_fail "<lmdb.h> in engine/" engine/peek.c:2: 'LMDB outside index/'

make_tree
printf '#include "b.h"\n' >engine/a.h
printf '#include "a.h"\n' >engine/b.h
expect_fail "include cycle between two files" engine/a.h 'a cycle between files'
expect_fail "include cycle between two files (both named)" engine/b.h 'a cycle between files'

make_tree
{ cat engine/long.c; echo; } >engine/big.c
expect_fail "901-line .c in engine/" engine/big.c 'has 901 lines (at most 900'

make_tree
echo '#include "format.h"' >>engine/engine.c # format/format.h, written without format/
expect_fail "another folder's header without its folder" engine/engine.c '"format.h": no such project file'

make_tree
echo '#include <engine/engine.h>' >>io/io.c # a project header through <...>
expect_fail "io/ reaches an engine header with <engine/x.h>" io/io.c 'io -> engine is not an allowed edge'

make_tree
mkdir -p bindings/go
printf '#include "kvx.h"\n#include "shim.h"\n' >bindings/go/shim.c
printf 'int shim(void);\n' >bindings/go/shim.h
expect_ok "bindings/ with kvx.h and its own header passes"
echo '#include "engine/engine.h"' >>bindings/go/shim.c
expect_fail "bindings/ includes an engine header" bindings/go/shim.c 'bindings/ uses include/kvx.h only'

# Call edges and symbols, from objects compiled like the build's.
if command -v cc >/dev/null && command -v nm >/dev/null; then
  build_objects() { # build_objects FILE...: BUILD_DIR at $tree/b
    local obj=$tree/b/CMakeFiles/kvx_objects.dir f
    rm -rf "$tree/b"
    for f in "$@"; do
      mkdir -p "$obj/$(dirname "$f")"
      cc -c -I"$tree" -I"$tree/include" -o "$obj/$f.o" "$tree/$f" || return 1
    done
  }
  objs=(common/common.c format/format.c engine/engine.c io/io.c)

  make_tree
  if build_objects "${objs[@]}"; then
    expect_ok "objects: clean tree passes" b
    rc=$(run "$tmp/none")
    if [ "$rc" = 2 ] && grep -qF 'kvx_objects.dir: no objects (build first)' "$tmp/err"; then
      pass "objects: a BUILD_DIR without objects exits 2"
    else
      fail "objects: a BUILD_DIR without objects exits 2" "exit $rc"
    fi
  else
    fail "objects: clean tree" "cc failed"
  fi

  make_tree
  # a call up that no include shows: format/ declares engine's function itself
  printf 'int kvx_engine_fn(void);\nint kvx_format_up(void) { return kvx_engine_fn(); }\n' >>format/format.c
  build_objects "${objs[@]}" && expect_fail "objects: format/ calls into engine/" format/format.c \
    'calls kvx_engine_fn (engine/engine.c): format -> engine is not an allowed edge' b

  make_tree
  printf 'int helper(void) { return 2; }\n' >>engine/engine.c
  build_objects "${objs[@]}" && expect_fail "objects: a global symbol without kvx_" engine/engine.c.o \
    'defines global symbol helper without the kvx_ prefix' b

  make_tree
  printf '__attribute__((weak)) int weak_helper(void) { return 2; }\n' >>engine/engine.c # nm type W
  build_objects "${objs[@]}" && expect_fail "objects: a weak global symbol without kvx_" engine/engine.c.o \
    'defines global symbol weak_helper without the kvx_ prefix' b

  make_tree
  # an LMDB call the source grep cannot see: the name is pasted by a macro
  printf '#define LMDB(f) mdb_##f\nextern int LMDB(get)(void *, void *, void *, void *);\nint kvx_engine_hidden(void) { return LMDB(get)(0, 0, 0, 0); }\n' >>engine/engine.c
  build_objects "${objs[@]}" && expect_fail "objects: an LMDB call hidden behind a macro" engine/engine.c.o \
    'LMDB outside index/: engine/engine.c.o calls mdb_get' b

  make_tree
  printf 'int helper(void) { return 2; }\n' >engine/gone.c
  build_objects "${objs[@]}" engine/gone.c && rm engine/gone.c && expect_ok "objects: an object whose source is gone is skipped" b
else
  echo "skip objects: no cc or nm"
fi

echo "check_layers_selftest: $passed passed, $failed failed"
[ "$failed" = 0 ]
