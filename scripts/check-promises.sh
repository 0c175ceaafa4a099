#!/usr/bin/env bash
# scripts/check-promises.sh [--write] - the promises of docs/PROMISES.md
# and the tests that prove them (run by ctest as docs/promises, so by CI).
#
# docs/PROMISES.md lists every promise the documents make, one line each,
# "- **ID** text" (ID: PREFIX-N), or "- **ID** *retired, replaced by
# NEW-ID*: text" for one that no longer holds as written. A test proves a
# promise by a marker naming its ID (several: "A-1, B-2"):
#
#   C       /* PROMISE: RECOVER-7 */  the line before `static void test_x(`
#                                     or the first line of its body
#   Go      // PROMISE: GO-1          the line before `func TestX(` / FuzzX
#   Python  # PROMISE: PY-1           the line before `def test_x(`
#
# Test sources are found recursively: tests/**/*.c, bindings/go/**/*_test.go
# (no vendor/), bindings/python/tests/**/*.py. Only comment lines (and
# Python decorators) may stand between a marker and its function.
#
# Fails, naming each case, when:
#  - a live promise has no test citing it;
#  - a marker names an ID that does not exist or is retired, or stands
#    where no test function follows it;
#  - an ID is listed twice, or a retired one names no live successor;
#  - a document cites a promise ID that is not listed, or is retired;
#  - a document names a test that does not exist: every backticked C or
#    Python `test_*` (a function, or a test file's name), Go `Test*` /
#    `Fuzz*`, in docs/*.md, README.md, CONTRIBUTING.md, fuzz/README.md,
#    bench/RESULTS.md, tests/**/*.md and every README.md under bindings/
#    (not vendor/); a backticked path under tests/ or bindings/python/tests/,
#    or a `*_test.go` file, must exist; a pair `FILE` `fn` (FILE a .c,
#    .py or _test.go test file) must name a function of that very file;
#  - the coverage table in docs/PROMISES.md (between its BEGIN/END
#    coverage lines) is not the one this script generates now.
#
# It prints the coverage table (promise -> tests). --write regenerates the
# table in docs/PROMISES.md first, then checks.
set -euo pipefail
cd "$(dirname "$0")/.."
export LC_ALL=C
write=0
case "${1:-}" in
  --write) write=1 ;;
  "") ;;
  -h | --help) sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: scripts/check-promises.sh [--write]" >&2; exit 2 ;;
esac
promises=docs/PROMISES.md
begin='<!-- BEGIN coverage'
end='<!-- END coverage'
[ -f "$promises" ] || { echo "check-promises: $promises is missing" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
problems="$tmp/problems"
: > "$problems"

# --- the promises: ID<TAB>live|retired<TAB>successor, in document order
awk -v begin="$begin" -v end="$end" '
  index($0, begin) == 1 { gen = 1 }
  index($0, end) == 1 { gen = 0; next }
  gen { next }
  /^- \*\*[A-Z][A-Z0-9]*-[0-9][0-9]*\*\*/ {
    id = $2; gsub(/\*/, "", id)
    rest = substr($0, index($0, id) + length(id) + 2)
    if (rest ~ /^ \*retired/) {
      succ = rest; sub(/^ \*retired[^A-Z]*/, "", succ)
      if (match(succ, /^[A-Z][A-Z0-9]*-[0-9][0-9]*/)) succ = substr(succ, 1, RLENGTH); else succ = ""
      print id "\tretired\t" succ "\t" NR
    } else print id "\tlive\t-\t" NR
  }' "$promises" > "$tmp/ids"
awk -F'\t' -v P="$promises" '{ n[$1]++; if (n[$1] == 2) printf "%s:%s: %s is listed twice\n", P, $4, $1 }' \
  "$tmp/ids" >> "$problems"
awk -F'\t' -v P="$promises" 'NR == FNR { st[$1] = $2; next } # the same file twice
  $2 == "retired" && ($3 == "" || st[$3] != "live") {
    printf "%s:%s: %s is retired but names no live promise replacing it (\"*retired, replaced by ID*\")\n", P, $4, $1 }' \
  "$tmp/ids" "$tmp/ids" >> "$problems"

# --- the test sources and what they define and cite
{
  find tests -name '*.c' -type f
  find bindings/go -name vendor -prune -o -name '*_test.go' -type f -print
  find bindings/python/tests -name '*.py' -type f 2>/dev/null || true
} | sort > "$tmp/srcs"
# records: def<TAB>lang<TAB>file<TAB>line<TAB>name
#          cite<TAB>lang<TAB>file<TAB>line<TAB>name<TAB>ID   (line: the marker's)
#          bad<TAB>file<TAB>line<TAB>why
xargs awk '
  function lang_of(f) { return f ~ /\.c$/ ? "c" : f ~ /\.go$/ ? "go" : "py" }
  function defname(s, l,   m) {
    if (l == "c" && match(s, /^(static )?(void|int) test_[A-Za-z0-9_]+\(/)) {
      m = substr(s, RSTART, RLENGTH - 1); sub(/.* /, "", m); return m }
    if (l == "go" && match(s, /^func (Test|Fuzz|Benchmark)[A-Za-z0-9_]*\(/)) {
      m = substr(s, 6, RLENGTH - 6); return m }
    if (l == "py" && match(s, /^[ \t]*(async[ \t]+)?def[ \t]+test_[A-Za-z0-9_]+\(/)) {
      m = substr(s, RSTART, RLENGTH - 1); sub(/.*def[ \t]+/, "", m); return m }
    return ""
  }
  function flush_pending(why) {
    if (npend) printf "bad\t%s\t%s\t%s\n", pfile, pline[1], why
    npend = 0
  }
  FNR == 1 { if (NR > 1) flush_pending("a PROMISE marker with no test function after it")
             lang = lang_of(FILENAME); pfile = FILENAME; lastdef = ""; sincedef = 99 }
  {
    line = $0
    if (line ~ /^[ \t]*(\/\*|\/\/|#)[ \t]*PROMISE:/) {
      ids = substr(line, index(line, "PROMISE:") + 8)
      sub(/\*\/[ \t]*$/, "", ids)
      chk = ids; gsub(/[A-Z][A-Z0-9]*-[0-9][0-9]*/, "", chk); gsub(/[ \t,]/, "", chk)
      if (chk != "" || ids !~ /[A-Z]-[0-9]/) {
        printf "bad\t%s\t%d\t%s\n", FILENAME, FNR, "a malformed PROMISE marker (PROMISE: ID[, ID...])"; next }
      n = split(ids, a, /[ \t,]+/)
      # the first line of a body: cite the function just defined
      if (!npend && lastdef != "" && sincedef == 1) {
        for (i = 1; i <= n; i++) if (a[i] != "") printf "cite\t%s\t%s\t%d\t%s\t%s\n", lang, FILENAME, FNR, lastdef, a[i]
        next
      }
      for (i = 1; i <= n; i++) if (a[i] != "") { npend++; pid[npend] = a[i]; pline[npend] = FNR }
      next
    }
    d = defname(line, lang)
    if (d != "") {
      printf "def\t%s\t%s\t%d\t%s\n", lang, FILENAME, FNR, d
      for (i = 1; i <= npend; i++) printf "cite\t%s\t%s\t%d\t%s\t%s\n", lang, FILENAME, pline[i], d, pid[i]
      npend = 0; lastdef = d
      # 1: its body is open; 0: its body opens on the next line (C); 99: a one-liner
      sincedef = line ~ /[{:][ \t]*$/ ? 1 : line ~ /\{/ ? 99 : 0
      next
    }
    if (line ~ /^[ \t]*$/) { if (npend) flush_pending("a PROMISE marker with no test function after it"); next }
    if (line ~ /^[ \t]*(\/\/|\/\*|\*|#|@)/) { sincedef = 99; next }
    if (lastdef != "" && sincedef == 0 && line ~ /^\{[ \t]*$/) { sincedef = 1; next }
    sincedef = 99
    if (npend) flush_pending("a PROMISE marker with no test function after it")
  }
  END { flush_pending("a PROMISE marker with no test function after it") }
' < "$tmp/srcs" > "$tmp/recs"
awk -F'\t' '$1 == "bad" { printf "%s:%s: %s\n", $2, $3, $4 }' "$tmp/recs" >> "$problems"
# citations of IDs that do not exist or are retired
awk -F'\t' 'FILENAME == ARGV[1] { st[$1] = $2; succ[$1] = $3; next }
  $1 == "cite" && !($6 in st) { printf "%s:%s: %s cites %s, which docs/PROMISES.md does not list\n", $3, $4, $5, $6 }
  $1 == "cite" && st[$6] == "retired" {
    printf "%s:%s: %s cites %s, which is retired (replaced by %s)\n", $3, $4, $5, $6, succ[$6] }' \
  "$tmp/ids" "$tmp/recs" >> "$problems"

# --- the coverage table, promises in document order
awk -F'\t' '$1 == "cite" {
    k = ($2 == "c" ? 1 : $2 == "go" ? 2 : 3)
    printf "%s\t%d\t%s\t%s\n", $6, k, $3, $5 }' "$tmp/recs" | sort -u > "$tmp/cites"
awk -F'\t' 'FILENAME == ARGV[1] { t = "`" $4 "` (" $3 ")"; c[$1] = c[$1] ? c[$1] ", " t : t; n[$1]++; next }
  $2 == "live" { printf "| %s | %s |\n", $1, (n[$1] ? c[$1] : "**none**") }' "$tmp/cites" "$tmp/ids" > "$tmp/rows"
{
  echo "$begin: generated by scripts/check-promises.sh --write; do not edit -->"
  echo
  echo "| promise | tests |"
  echo "|---|---|"
  cat "$tmp/rows"
  echo
  echo "$end -->"
} > "$tmp/table"
awk -F'\t' -v P="$promises" 'FILENAME == ARGV[1] { if ($1 == "cite") cited[$6] = 1; next }
  $2 == "live" && !cited[$1] { printf "%s:%s: %s has no test: add a PROMISE marker to the tests that prove it\n", P, $4, $1 }' \
  "$tmp/recs" "$tmp/ids" >> "$problems"

if [ "$write" = 1 ]; then
  if ! grep -q "^$begin" "$promises" || ! grep -q "^$end" "$promises"; then
    echo "check-promises: $promises has no '$begin' ... '$end' lines to write the table between" >&2
    exit 1
  fi
  awk -v begin="$begin" -v end="$end" -v table="$tmp/table" '
    index($0, begin) == 1 { while ((getline l < table) > 0) print l; skip = 1; next }
    index($0, end) == 1 { skip = 0; next }
    !skip' "$promises" > "$tmp/new"
  cat "$tmp/new" > "$promises"
fi
awk -v begin="$begin" -v end="$end" 'index($0, begin) == 1 { on = 1 } on { print } index($0, end) == 1 { on = 0 }' \
  "$promises" > "$tmp/current"
if ! cmp -s "$tmp/current" "$tmp/table"; then
  echo "$promises: the coverage table is stale: run scripts/check-promises.sh --write" >> "$problems"
fi

# --- every test a document names exists
docs=(docs/*.md README.md CONTRIBUTING.md fuzz/README.md bench/RESULTS.md)
while IFS= read -r f; do docs+=("$f"); done < <({ find bindings -name vendor -prune -o -name '.*' -prune -o \
  -name README.md -type f -print; find tests -name '*.md' -type f; } 2>/dev/null | sort)
{
  awk -F'\t' '$1 == "def" { print $5 }' "$tmp/recs"
  # test files by name, with and without their extension
  awk '{ n = $0; sub(/.*\//, "", n); print n; sub(/\.(c|py)$/, "", n); print n }' "$tmp/srcs"
} | sort -u > "$tmp/defined"
for d in "${docs[@]}"; do
  [ -f "$d" ] || continue
  # names inside backticks only (prose may say "test_" loosely)
  { grep -oE '`[^`]*`' "$d" || true; } | { grep -oE '\b(test_[A-Za-z0-9_]+(\.c|\.py)?|(Test|Fuzz)[A-Z][A-Za-z0-9_]*)\b\*?' || true; } |
    sort -u | while read -r name; do
      case $name in *'*') continue ;; esac # a pattern (test_battery_*)
      grep -qxF "$name" "$tmp/defined" || echo "$d: names \`$name\`, which no test defines"
    done
  # paths of tests and Go test files
  { grep -oE '`[^` ]*`' "$d" || true; } | tr -d '`' | sort -u | while read -r p; do
    case $p in *'*'* | *'{'* | *'<'*) continue ;; esac
    case $p in
      tests/* | bindings/python/tests/*) # from the root, or from the document's folder
        [ -e "${p%:*}" ] || [ -e "$(dirname "$d")/${p%:*}" ] || echo "$d: names \`$p\`, which does not exist" ;;
      *_test.go) if [ "${p#*/}" != "$p" ]; then [ -e "$p" ] || [ -e "bindings/go/$p" ] || echo "$d: names \`$p\`, which does not exist"
                 else grep -q "/$p\$" "$tmp/srcs" || echo "$d: names \`$p\`, which does not exist"; fi ;;
    esac
  done
  # `FILE` `fn`: fn is defined in that file (a path, or any file of that name)
  { grep -oE '`[A-Za-z0-9_./-]+(\.c|\.py|_test\.go)` `(test_[A-Za-z0-9_]+|(Test|Fuzz)[A-Za-z0-9_]+)`' "$d" || true; } | sort -u |
    while read -r f fn; do
      f=${f//\`/}; fn=${fn//\`/}
      if [ "${f#*/}" != "$f" ]; then files=$(grep -xF "$f" "$tmp/srcs" || grep -F "/$f" "$tmp/srcs" || true)
      else files=$(grep -E "(^|/)${f//./\\.}\$" "$tmp/srcs" || true); fi
      [ -n "$files" ] || continue # the missing file is reported above
      if ! echo "$files" | awk -F'\t' -v fn="$fn" 'NR == FNR { want[$0] = 1; next }
             $1 == "def" && want[$3] && $5 == fn { found = 1 } END { exit !found }' - "$tmp/recs"; then
        echo "$d: names \`$f\` \`$fn\`, but $fn is not in $(echo $files)"
      fi
    done
done >> "$problems"

# --- every promise ID a document cites exists and is live
pfx=$(cut -f1 "$tmp/ids" | sed 's/-[0-9]*$//' | sort -u | paste -sd'|' -)
if [ -n "$pfx" ]; then
  for d in "${docs[@]}"; do
    [ -f "$d" ] && [ "$d" != "$promises" ] || continue
    { grep -noE "\b($pfx)-[0-9]+\b" "$d" || true; } | while IFS=: read -r ln id; do
      st=$(awk -F'\t' -v id="$id" '$1 == id { print $2 "\t" $3; exit }' "$tmp/ids")
      case $st in
        "") echo "$d:$ln: cites $id, which docs/PROMISES.md does not list" ;;
        retired*) echo "$d:$ln: cites $id, which is retired (replaced by ${st#retired	})" ;;
      esac
    done
  done >> "$problems"
fi

sed -n '/^| /p' "$tmp/table"
live=$(awk -F'\t' '$2 == "live"' "$tmp/ids" | wc -l)
retired=$(awk -F'\t' '$2 == "retired"' "$tmp/ids" | wc -l)
ntests=$(cut -f3,4 "$tmp/cites" | sort -u | wc -l)
if [ -s "$problems" ]; then
  echo
  cat "$problems" >&2
  echo "check-promises: $(wc -l < "$problems") problem(s)" >&2
  exit 1
fi
echo "check-promises: ok: $live live promises ($retired retired), each proved by a test; $ntests tests cite them; every test the docs name exists"
