#!/usr/bin/env bash
# Draws the benchmark charts (needs gnuplot: apt-get install gnuplot-nox).
#
#   bench/plot.sh                     both charts from the committed tables
#   bench/plot.sh peers A.tsv B.tsv C.tsv
#                                     bench/peers.tsv from bench_peers --tsv
#                                     runs (the median ratio of each row and
#                                     peer), then both charts
#
# bench/ratios.png from bench/ratios.tsv: every measure as a ratio to its
# physical reference (memcpy, fio, bare mdb_get, ...) measured in the same
# run, with the target beside it.
# bench/peers.png from bench/peers.tsv: kvx against the stores engine teams
# use instead (issue 16), each row as a ratio to the best peer of the same
# run (1 = best). bench/RESULTS.md holds the commands and raw numbers.
set -euo pipefail
cd "$(dirname "$0")"

peers_order=("kvx" "file per block" "RocksDB (BlobDB)" "LMDB values")
rows_order=("put MB/s" "restart ms" "cold GB/s" "p50 us" "p99 us" "space amp" "trace hit ratio" "trace GB written")

if [ "${1:-}" = peers ]; then
    shift
    [ $# -ge 1 ] || { echo "usage: bench/plot.sh peers RUN.tsv..." >&2; exit 2; }
    {
        printf '# row'
        for p in "${peers_order[@]}"; do printf '\t%s' "$p"; done
        printf '\n# median over %d run(s) of each row'"'"'s ratio to the best peer of its run (1 = best)\n' $#
        for r in "${rows_order[@]}"; do
            printf '%s' "$r"
            for p in "${peers_order[@]}"; do
                m=$(awk -F'\t' -v r="$r" -v p="$p" '$1 == r && $2 == p { print $4 }' "$@" | sort -g |
                    awk '{ v[NR] = $1 } END { if (NR == 0) print "NaN"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
                printf '\t%s' "$m"
            done
            printf '\n'
        done
    } > peers.tsv
    echo "wrote bench/peers.tsv"
fi

rows=$(grep -vc '^#' ratios.tsv)
height=$((120 + rows * 28))
gnuplot <<GP
set terminal pngcairo size 1000,${height} font "sans,10" noenhanced
set output "ratios.png"
set datafile separator "\t"
set title "kvx: each measure as a ratio to its physical reference (same run)"
set style fill solid 0.8 border -1
set yrange [-0.7:${rows}-0.3]
set xrange [0:*]
set xlabel "ratio to reference (higher is better; the cost rows are inverted: reference/kvx)"
set ytics scale 0
set grid xtics
set key outside top center horizontal
set arrow from 1,graph 0 to 1,graph 1 nohead dt 2 lc rgb "#555555"
unset colorbox
plot "ratios.tsv" using (\$2/2.0):(\$0):(\$2/2.0):(0.35):yticlabels(sprintf("%s  (vs %s)", stringcolumn(1), stringcolumn(4))) \
       with boxxyerror lc rgb "#3b7dd8" title "kvx", \
     "" using 3:0 with points pt 7 ps 1.2 lc rgb "#d83b3b" title "target"
GP
echo "wrote bench/ratios.png"

if [ -f peers.tsv ]; then
    gnuplot <<GP
set terminal pngcairo size 1000,460 font "sans,10" noenhanced
set output "peers.png"
set datafile separator "\t"
set title "kvx against its peers, each row as a ratio to the best peer of the same run (1 = best; median of the runs in RESULTS.md)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set yrange [0:1.15]
set ylabel "ratio to the best peer (higher is better; cost rows inverted)"
set grid ytics
set key outside bottom center horizontal
set xtics scale 0
set arrow from graph 0,first 1 to graph 1,first 1 nohead dt 2 lc rgb "#555555"
plot "peers.tsv" using 2:xticlabels(1) title "kvx (verified)" lc rgb "#3b7dd8", \
     "" using 3 title "file per block (unverified)" lc rgb "#aaaaaa", \
     "" using 4 title "RocksDB (BlobDB) (unverified)" lc rgb "#e08a3c", \
     "" using 5 title "LMDB values (unverified)" lc rgb "#6aa84f"
GP
    echo "wrote bench/peers.png"
fi
