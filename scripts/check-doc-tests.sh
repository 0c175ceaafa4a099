#!/usr/bin/env bash
# scripts/check-doc-tests.sh - every test a document names exists.
#
# docs/ promise behaviour and name the test that proves it; a renamed or
# deleted test leaves a promise without proof. This lists every
# backticked test name in docs/*.md, README.md, fuzz/README.md and
# bench/RESULTS.md - C `test_*` (a cmocka test function, or a tests/*.c
# file), Go `Test*` / `Fuzz*`, Python `test_*` - and fails naming each one
# no test source defines.
set -euo pipefail
cd "$(dirname "$0")/.."
docs=(docs/*.md README.md fuzz/README.md bench/RESULTS.md)
srcs=$(ls tests/*.c 2>/dev/null; find bindings -name '*_test.go' -not -path '*/vendor/*'; \
       find bindings -path '*/vendor' -prune -o -name 'test_*.py' -print)
defined=$(mktemp)
trap 'rm -f "$defined"' EXIT
{
  # C: static void test_x(void **state) / int test_x(...) and file names
  grep -ohE '^(static )?(void|int) (test_[A-Za-z0-9_]+)\(' tests/*.c | sed -E 's/.* (test_[A-Za-z0-9_]+)\(/\1/'
  for f in tests/test_*.c; do n=${f##*/}; echo "${n%.c}"; echo "$n"; done
  # Go: func TestX(t *testing.T) / func FuzzX(f *testing.F)
  grep -ohE '^func (Test|Fuzz|Benchmark)[A-Za-z0-9_]+' $(echo "$srcs" | grep '\.go$') | sed 's/^func //'
  # Python: def test_x( and the test files
  for f in $(echo "$srcs" | grep '\.py$'); do
    grep -ohE '^\s*def (test_[A-Za-z0-9_]+)\(' "$f" | sed -E 's/.*def (test_[A-Za-z0-9_]+)\(/\1/'
    n=${f##*/}; echo "${n%.py}"; echo "$n"
  done
} | sort -u > "$defined"
missing=0
for d in "${docs[@]}"; do
  [ -f "$d" ] || continue
  # names inside backticks only (prose may say "test_" loosely)
  { grep -oE '`[^`]*`' "$d" || true; } | { grep -oE '\b(test_[A-Za-z0-9_]+(\.c|\.py)?|(Test|Fuzz)[A-Z][A-Za-z0-9_]*)\b\*?' || true; } | sort -u |
  while read -r name; do
    case $name in *'*') continue ;; esac # a pattern (test_battery_*)
    if ! grep -qxF "$name" "$defined"; then
      echo "$d: names \`$name\`, which no test defines"
      echo x >> "$defined.missing"
    fi
  done
done
# `tests/test_x.c` `test_fn`: test_fn is defined in that file
for d in "${docs[@]}"; do
  [ -f "$d" ] || continue
  { grep -oE '`(tests/)?test_[a-z0-9_]+\.c` `test_[A-Za-z0-9_]+`' "$d" || true; } | sort -u |
  while read -r pair; do
    f=$(echo "$pair" | sed -E 's/^`(tests\/)?(test_[a-z0-9_]+\.c)`.*/\2/')
    fn=$(echo "$pair" | sed -E 's/.*` `(test_[A-Za-z0-9_]+)`$/\1/')
    [ -f "tests/$f" ] || continue # the missing file is reported above
    if ! grep -qE "^(static )?(void|int) $fn\(" "tests/$f"; then
      echo "$d: names \`$f\` \`$fn\`, but $fn is not in tests/$f"
      echo x >> "$defined.missing"
    fi
  done
done
if [ -s "$defined.missing" ]; then
  n=$(wc -l < "$defined.missing"); rm -f "$defined.missing"
  echo "check-doc-tests: $n test name(s) in the docs are not defined" >&2
  exit 1
fi
rm -f "$defined.missing"
echo "check-doc-tests: every test the docs name exists"
