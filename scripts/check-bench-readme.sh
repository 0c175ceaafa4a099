#!/usr/bin/env bash
# scripts/check-bench-readme.sh - README's benchmark table quotes
# bench/RESULTS.md's summary table (run by ctest as docs/bench_readme).
#
# README.md's table is the one whose header starts
#   | measure | reference (same run) | kvx / reference | target | date |
# and bench/RESULTS.md's summary table the one whose header starts
#   | measure | reference (same run) | kvx / reference | limit | date | section |
# Every README row must name a measure of the summary table (the first
# cell, compared as written) and show the same figure (third cell) and
# date (fifth cell), character for character. Fails, naming each row that
# does not, or when either table is missing or empty.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
readme=${1:-$root/README.md}
results=${2:-$root/bench/RESULTS.md}

# rows FILE HEADER: the table under the first line starting with HEADER, one
# row a line as "measure<TAB>figure<TAB>date" (cells trimmed)
rows() {
    awk -v head="$2" '
        function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
        !intable && index($0, head) == 1 { intable = 1; next }
        intable == 1 && /^\|[-| ]+\|[ \t]*$/ { intable = 2; next }
        intable == 2 {
            if ($0 !~ /^\|/) exit
            n = split($0, c, "|")
            print trim(c[2]) "\t" trim(c[4]) "\t" trim(c[6])
        }
    ' "$1"
}

readme_rows=$(rows "$readme" "| measure | reference (same run) | kvx / reference | target | date |")
summary_rows=$(rows "$results" "| measure | reference (same run) | kvx / reference | limit | date | section |")
fail=0
if [ -z "$readme_rows" ]; then
    echo "check-bench-readme: $readme has no benchmark table (| measure | reference (same run) | kvx / reference | target | date |)" >&2
    exit 1
fi
if [ -z "$summary_rows" ]; then
    echo "check-bench-readme: $results has no summary table (| measure | reference (same run) | kvx / reference | limit | date | section |)" >&2
    exit 1
fi
n=0
while IFS=$'\t' read -r measure figure date; do
    n=$((n + 1))
    match=$(awk -F'\t' -v m="$measure" '$1 == m' <<<"$summary_rows")
    if [ -z "$match" ]; then
        echo "check-bench-readme: README row \"$measure\" is not a row of bench/RESULTS.md's summary table" >&2
        fail=1
        continue
    fi
    IFS=$'\t' read -r _ sfigure sdate <<<"$(head -n1 <<<"$match")"
    if [ "$figure" != "$sfigure" ]; then
        echo "check-bench-readme: \"$measure\": README shows \"$figure\", bench/RESULTS.md's summary \"$sfigure\"" >&2
        fail=1
    fi
    if [ "$date" != "$sdate" ]; then
        echo "check-bench-readme: \"$measure\": README dates it \"$date\", bench/RESULTS.md's summary \"$sdate\"" >&2
        fail=1
    fi
done <<<"$readme_rows"
[ "$fail" = 0 ] && echo "check-bench-readme: ok: the README's $n benchmark rows quote bench/RESULTS.md's summary table"
exit "$fail"
