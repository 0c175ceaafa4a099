#!/usr/bin/env bash
# scripts/check-doc-tests.sh - every test a document names exists.
#
# docs/ promise behaviour and name the test that proves it; a renamed or
# deleted test leaves a promise without proof. This lists every
# backticked test name in docs/*.md, README.md, fuzz/README.md,
# bench/RESULTS.md and every README.md under bindings/ (bindings/go,
# bindings/python; not vendored code) - C `test_*` (a cmocka test
# function, or a tests/*.c file), Go `Test*` / `Fuzz*`, Python `test_*`
# (a function, or a test_*.py file) - and fails naming each one no test
# source defines. A pair `test_x.c` `test_fn` (or `test_x.py` `test_fn`)
# must name a function of that very file.
set -euo pipefail
cd "$(dirname "$0")/.."
docs=(docs/*.md README.md fuzz/README.md bench/RESULTS.md)
while IFS= read -r f; do docs+=("$f"); done < <(find bindings -name vendor -prune -o -name '.*' -prune -o \
  -name README.md -type f -print 2>/dev/null | sort)
# C test sources: tests/<folder>/<file>.c (tests/lib/ holds fixtures)
csrcs=$(find tests -name '*.c' -not -path 'tests/lib/*' | sort)
srcs=$(echo "$csrcs"; find bindings -name '*_test.go' -not -path '*/vendor/*'; \
       find bindings -path '*/vendor' -prune -o -name 'test_*.py' -print)
# Until the docs name the new files, tests/MOVES.tsv says where each test
# of the old flat layout (tests/test_x.c) went: old_file, function,
# new_file (function "*": the whole file).
moves=tests/MOVES.tsv
moved() { [ -f "$moves" ] && awk -F'\t' -v o="$1" -v fn="$2" '$1 == o && ($2 == fn || $2 == "*") {print $3; exit}' "$moves"; }
defined=$(mktemp)
trap 'rm -f "$defined"' EXIT
{
  # C: static void test_x(void **state) / int test_x(...) and file names
  grep -ohE '^(static )?(void|int) (test_[A-Za-z0-9_]+)\(' $csrcs | sed -E 's/.* (test_[A-Za-z0-9_]+)\(/\1/'
  for f in $csrcs $([ -f "$moves" ] && awk -F'\t' '!/^#/ {print $1}' "$moves" | sort -u); do n=${f##*/}; echo "${n%.c}"; echo "$n"; done
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
    file=tests/$f
    if [ ! -f "$file" ]; then
      # a file of the old layout: the one its function moved to
      awk -F'\t' -v o="tests/$f" '$1 == o {found=1} END {exit !found}' "$moves" 2>/dev/null || continue # reported above
      file=$(moved "tests/$f" "$fn") # empty: the old file had no such function
    fi
    if [ -z "$file" ] || ! grep -qE "^(static )?(void|int) $fn\(" "$file"; then
      echo "$d: names \`$f\` \`$fn\`, but $fn is not in tests/$f"
      echo x >> "$defined.missing"
    fi
  done
done
# `test_x.py` `test_fn`: test_fn is a def of that file (any test_x.py
# under bindings/ holding it)
for d in "${docs[@]}"; do
  [ -f "$d" ] || continue
  { grep -oE '`([A-Za-z0-9_./-]*/)?test_[a-z0-9_]+\.py` `test_[A-Za-z0-9_]+`' "$d" || true; } | sort -u |
  while read -r pair; do
    f=$(echo "$pair" | sed -E 's/^`([A-Za-z0-9_./-]*\/)?(test_[a-z0-9_]+\.py)`.*/\2/')
    fn=$(echo "$pair" | sed -E 's/.*` `(test_[A-Za-z0-9_]+)`$/\1/')
    files=$(echo "$srcs" | grep -E "(^|/)$f\$" || true)
    [ -n "$files" ] || continue # the missing file is reported above
    if ! grep -qE "^\s*def $fn\(" $files; then
      echo "$d: names \`$f\` \`$fn\`, but $fn is not in $(echo $files)"
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
