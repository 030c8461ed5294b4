#!/usr/bin/env bash
# bench/measure_cpu.sh — the CPU benchmark figures of the README, as the rows of bench/results/cpu.csv.
#
#   bash bench/measure_cpu.sh [BENCH_DIR]  > /tmp/cpu.csv     (BENCH_DIR default build/cpu/bench)
#
# Runs bench_toymachine, bench_attention and bench_stream with their default configurations (about
# a minute on 2 cores; run it on an otherwise idle machine), prints a CSV on stdout with the header
# of bench/results/cpu.csv, and the programs' own output on stderr. Then: copy the rows into
# bench/results/cpu.csv and `cmake --build --preset cpu --target results-pages`.
set -eu
dir=${1:-build/cpu/bench}
date=$(date -u '+%Y-%m-%d %H:%M')
commit=$(git describe --always --dirty --abbrev=7 2>/dev/null || echo unknown)  # the tree the programs were built from
machine="$(nproc)-core $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
cd "$dir"   # bench_toymachine finds its traces relative to the build tree
toy=$(./bench_toymachine | tee /dev/stderr)
att=$(./bench_attention | tee /dev/stderr)
str=$(./bench_stream | tee /dev/stderr)
pick() {  # pick TEXT ERE: the first capture of ERE (sed -E) in TEXT, or fail naming ERE
  local v
  v=$(printf '%s\n' "$1" | sed -n -E "s#.*$2.*#\\1#p" | head -1)
  [ -n "$v" ] || { echo "measure_cpu: no match for '$2'" >&2; exit 1; }
  printf '%s' "$v"
}
row() { printf '%s,"%s",%s,"%s",%s,"%s","%s","%s"\n' "$date" "$machine" "$commit" "$1" "$2" "$3" "$4" "$5"; }
echo "date,machine,commit,benchmark,value,unit,target,command"
row "toy-machine executor, numeric-only (the slower of two traces' medians)" \
  "$(pick "$toy" 'numeric-only executor: ([0-9.]+) M instructions/s')" "M instructions/s" "≥ 20" "bench_toymachine"
row "attention forward FA2, N = 4096, d = 64, 1 head, fp32, one thread" \
  "$(pick "$att" '^flash forward FA2 [^:]*: +([0-9.]+) ms')" "ms" "" "bench_attention"
row "attention forward naive (Eigen, S and P materialised), same shape" \
  "$(pick "$att" '^naive forward [^:]*: +([0-9.]+) ms')" "ms" "" "bench_attention"
row "FA2 time / naive time" "$(pick "$att" 'FA2 / naive time: ([0-9.]+)')" "" "≤ 2" "bench_attention"
row "STREAM estimate, T = 131072, D = 64, b_q = b_k = 64, k = 8: median time" \
  "$(pick "$str" 'estimate time: median ([0-9.]+) s')" "s" "" "bench_stream"
row "STREAM estimate: peak RSS after the estimate (no T × T buffer)" \
  "$(pick "$str" 'after estimate ([0-9.]+) MiB')" "MiB" "" "bench_stream"
