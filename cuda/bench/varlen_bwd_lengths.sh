#!/usr/bin/env bash
# cuda/bench/varlen_bwd_lengths.sh — how the wgmma-ws backward's rate falls with the sequences'
# length, dense and packed at equal lengths: which part of the packed mixed lengths' loss
# (varlen.sh) is the packing and which the shorter sequences. The rows of
# cuda/results/bwd_varlen_lengths.csv.
#
#   varlen_bwd_lengths.sh BIN_DIR [OUT_DIR]    on the GPU machine, from the repository root
#   varlen_bwd_lengths.sh --tabulate OUT_DIR   the CSV again from a run's files
#
# BIN_DIR holds `flashlab` (cuda preset) and `commit`. Shapes: bf16, H = 16, d = 128 and 64, causal
# and not, 65536 tokens in all: dense B = 8, N = 8192; the mixed lengths of varlen.sh rounded to
# multiples of 128 (no ragged tile: packed-r128); dense B = 16, N = 4096 and the same 16 × 4096
# packed; dense B = 64, N = 1024 and 64 × 1024 packed. One process each, one round. OUT_DIR
# (default /tmp/flashlab-varlen-lengths) gets the lengths files, one bench CSV per process,
# `context` (date, device, commit) and lengths.csv: date, device, commit, dtype, pass, kernel, d,
# causal, layout, sequences, longest, total_q, H, median_ms, min_ms, max_ms, tflops (every
# sequence's own visible pairs), of_dense_same_lengths (over the dense row of the same lengths;
# empty for the rounded mixed lengths), of_dense_8192 (over the dense B = 8, N = 8192 row).
set -u
tabulate() {  # tabulate OUT_DIR
  python3 - "$1" <<'EOF'
import csv, sys
out = sys.argv[1]
date, device, commit = open(f"{out}/context").read().rstrip("\n").split(",")
runs = [("dense8192", "dense", "dense8192"), ("r128", "packed-r128", None), ("dense4096", "dense", "dense4096"),
        ("s4096", "packed", "dense4096"), ("dense1024", "dense", "dense1024"), ("s1024", "packed", "dense1024")]
rows = {name: {(r["d"], r["causal"]): r for r in csv.DictReader(open(f"{out}/{name}.csv"))} for name, _, _ in runs}
w = csv.writer(open(f"{out}/lengths.csv", "w", newline=""), lineterminator="\n")
w.writerow(["date", "device", "commit", "dtype", "pass", "kernel", "d", "causal", "layout", "sequences", "longest",
            "total_q", "H", "median_ms", "min_ms", "max_ms", "tflops", "of_dense_same_lengths", "of_dense_8192"])
for name, layout, ref in runs:
    for key, r in rows[name].items():
        t = float(r["tflops"])
        same = f"{t / float(rows[ref][key]['tflops']):.4f}" if ref else ""
        total = int(r["total_q"]) or int(r["B"]) * int(r["N"])
        w.writerow([date, device, commit, r["dtype"], r["pass"], r["bwd_design"], r["d"], r["causal"], layout, r["B"],
                    r["N"], total, r["H"], r["ms"], r["min_ms"], r["max_ms"], r["tflops"], same,
                    f"{t / float(rows['dense8192'][key]['tflops']):.4f}"])
        print(f"{layout:12} {r['B']:>3} x {r['N']:>5}  d={r['d']:>3} causal={r['causal']}  {t:7.1f} TFLOP/s  "
              f"of dense, same lengths {same or '-':6}  of dense 8 x 8192 {t / float(rows['dense8192'][key]['tflops']):.4f}")
EOF
}
if [ "${1:-}" = --tabulate ]; then
  tabulate "$2"
  exit $?
fi
bin=$1
out=${2:-/tmp/flashlab-varlen-lengths}
mkdir -p "$out"
echo "$(date -u '+%Y-%m-%d %H:%M'),$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1),$(cat "$bin/commit" 2>/dev/null || echo unknown)" >"$out/context"
python3 "$(dirname "$0")"/varlen_lengths.py "$out" r128 s4096 s1024 || exit 2
status=0
b=(bench attention --csv --pass bwd --heads 16 --dim 128,64 --both --reps 20 --bwd-kernel wgmma-ws)
"$bin/flashlab" "${b[@]}" --batch 8 --seq 8192 >"$out/dense8192.csv" || status=1
"$bin/flashlab" "${b[@]}" --cu-seqlens "$out/r128.txt" >"$out/r128.csv" || status=1
"$bin/flashlab" "${b[@]}" --batch 16 --seq 4096 >"$out/dense4096.csv" || status=1
"$bin/flashlab" "${b[@]}" --cu-seqlens "$out/s4096.txt" >"$out/s4096.csv" || status=1
"$bin/flashlab" "${b[@]}" --batch 64 --seq 1024 >"$out/dense1024.csv" || status=1
"$bin/flashlab" "${b[@]}" --cu-seqlens "$out/s1024.txt" >"$out/s1024.csv" || status=1
tabulate "$out" || status=1
echo "varlen_bwd_lengths: status $status ($out/lengths.csv)"
exit $status
