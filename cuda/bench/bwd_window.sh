#!/usr/bin/env bash
# cuda/bench/bwd_window.sh — the sliding-window atomic backward beside the plain causal one on the
# H100: the rows of bwd_window.csv (for the cuda/results folder).
#
#   bwd_window.sh [BIN_DIR] [OUT_DIR]   on the GPU machine, from the repository root
#
# BIN_DIR (default gpu-carry) holds `flashlab` built with the cuda preset and `commit` (git describe
# of the tree that built it, as measure.sh wants); OUT_DIR (default /tmp/flashlab-bwd-window, outside
# the tree) gets the raw bench CSVs and bwd_window.csv: date, device, commit, then dtype, pass,
# kernel, d, causal, window_left, window_right, N, H, B, median_ms, min_ms, max_ms, tflops (the pairs
# inside the band: bench.hpp), band_fraction (those pairs over the causal triangle's).
#
# Shapes: bf16, d = 128, H = 16, B = 1; N = 8192 and 32768 causal with window (4096, 0), (1024, 0)
# and none, on the wgmma-ws and mma kernels of the atomic design.
set -u
. "$(dirname "$0")/run_context.sh" "${1:-gpu-carry}" "${2:-/tmp/flashlab-bwd-window}"
band=(--pass bwd --bwd-design atomic --dim 128 --heads 16 --batch 1 --causal --seq 8192,32768)
for k in wgmma-ws mma; do
  for w in none 4096,0 1024,0; do
    flags=(); [ "$w" = none ] || flags=(--window "$w")
    "$bin/flashlab" bench attention --csv "${band[@]}" --bwd-kernel "$k" "${flags[@]}" \
      >"$out/band_${k}_${w/,/_}.csv" || status=1
  done
done
python3 - "$out" "$date" "$device" "$commit" <<'PY' || status=1
import csv, glob, sys
out, date, device, commit = sys.argv[1:5]
def pairs(n, left):  # query-key pairs of the causal band (N_k = N)
    return sum(i - (0 if left < 0 else max(0, i - left)) + 1 for i in range(n))
cols = ["date", "device", "commit", "dtype", "pass", "kernel", "d", "causal", "window_left", "window_right", "N", "H",
        "B", "median_ms", "min_ms", "max_ms", "tflops", "band_fraction"]
w = csv.writer(open(f"{out}/bwd_window.csv", "w", newline=""), lineterminator="\n")
w.writerow(cols)
for f in sorted(glob.glob(f"{out}/band_*.csv")):
    for r in csv.DictReader(open(f)):
        n, left = int(r["N"]), int(r["window_left"])
        w.writerow([date, device, commit, r["dtype"], r["pass"], r["bwd_design"], r["d"], r["causal"], left,
                    r["window_right"], n, r["H"], r["B"], r["ms"], r["min_ms"], r["max_ms"], r["tflops"],
                    f"{pairs(n, left) / (n * (n + 1) / 2):.4f}"])
PY
echo "bwd_window: status $status ($out/bwd_window.csv)"
exit $status
