#!/usr/bin/env bash
# mta_o_order.sh BIN_DIR OUT_CSV — what keeping O on chip saves in the fast MTA forward: times the
# fast forward at the bar shape (bf16, causal, H = 16, N = 4096, d = 64, 3 x 3) in both O orders
# (`flashlab bench mta --o-order on-chip|source`) with the CUPTI bytes of one launch (--traffic),
# and writes their rows, date and device first, to OUT_CSV (cuda/results/mta_fast_o_order.csv).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BIN_DIR OUT_CSV (BIN_DIR holds flashlab)" >&2; exit 2; }
bin=$1 out=$2
date=$(date -u '+%Y-%m-%d %H:%M')
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for order in on-chip source; do
  "$bin/flashlab" bench mta --csv --heads 16 --seq 4096 --dim 64 --cq 3 --ck 3 --pass fwd --reps 20 \
    --o-order "$order" --traffic >"$tmp/$order.csv"
done
awk -v date="$date" -v device="$device" '
  FNR == 1 { if (NR == 1) print "date,device," $0; next }
  NF > 0 { print date "," device "," $0 }' "$tmp/on-chip.csv" "$tmp/source.csv" >"$out"
cat "$out"
