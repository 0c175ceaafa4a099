#!/usr/bin/env bash
# Draws bench/ratios.png from bench/ratios.tsv: every measure as a ratio to
# its physical reference (memcpy, fio, bare mdb_get, ...) measured in the
# same run, with the target beside it. bench/RESULTS.md holds the commands
# and raw numbers behind each row.
#   bench/plot.sh            (needs gnuplot: apt-get install gnuplot-nox)
set -euo pipefail
cd "$(dirname "$0")"
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
