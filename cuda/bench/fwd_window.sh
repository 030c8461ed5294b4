#!/usr/bin/env bash
# cuda/bench/fwd_window.sh — the sliding-window forward beside plain causal on the H100, and the
# plain forwards beside SDPA's cuDNN backend: the rows of cuda/results/fwd_window.csv.
#
#   fwd_window.sh [BIN_DIR] [OUT_DIR]   on the GPU machine, from the repository root
#
# BIN_DIR (default gpu-carry) holds `flashlab` built with the cuda preset and `commit` (git describe
# of the tree that built it, as measure.sh wants); OUT_DIR (default /tmp/flashlab-window, outside
# the tree) gets the raw bench CSVs and SDPA's log, and fwd_window.csv: date, device, commit, then
# dtype, pass, kernel, d, causal, window_left, window_right, N, H, B, median_ms, min_ms, max_ms,
# tflops (the pairs inside the band: bench.hpp), band_fraction (those pairs over the causal
# triangle's), cudnn_bnhd_tflops, cudnn_bhnd_tflops (plain rows only; SDPA has no window).
#
# Shapes: bf16, d = 128, H = 16, B = 1; N = 8192 and 32768 causal with window (4096, 0), (1024, 0)
# and none, on tma-ws and mma; then tma-ws without a window at N = 8192, d = 64 and 128, causal
# and not, beside SDPA (cuda/bench/sdpa_bench.py, same session).
set -u
. "$(dirname "$0")/run_context.sh" "${1:-gpu-carry}" "${2:-/tmp/flashlab-window}"
band=(--pass fwd --dim 128 --heads 16 --batch 1 --causal --seq 8192,32768)
for k in tma-ws mma; do
  for w in none 4096,0 1024,0; do
    flags=(); [ "$w" = none ] || flags=(--window "$w")
    "$bin/flashlab" bench attention --csv "${band[@]}" --fwd-kernel "$k" "${flags[@]}" \
      >"$out/band_${k}_${w/,/_}.csv" || status=1
  done
done
"$bin/flashlab" bench attention --csv --pass fwd --seq 8192 --dim 64,128 --heads 16 --both --fwd-kernel tma-ws \
  >"$out/plain.csv" || status=1
PYTHONUNBUFFERED=1 python3 "$here/sdpa_bench.py" "$out/plain.csv" --out "$out/sdpa_plain.csv" >"$out/sdpa.log" 2>&1 ||
  status=1
python3 - "$out" "$date" "$device" "$commit" <<'EOF' || status=1
import csv, glob, os, sys
out, date, device, commit = sys.argv[1:5]
sdpa = {}
if os.path.exists(f"{out}/sdpa_plain.csv"):
    for r in csv.DictReader(open(f"{out}/sdpa_plain.csv")):
        sdpa[(r["d"], r["causal"], r["N"])] = (r["cudnn_bnhd_tflops"], r["cudnn_bhnd_tflops"])
def pairs(n, left, right, causal):  # query-key pairs the mask leaves (N_k = N)
    total = 0
    for i in range(n):
        lo = 0 if left < 0 else max(0, i - left)
        hi = i if causal else (n - 1 if right < 0 else min(n - 1, i + right))
        total += max(0, hi - lo + 1)
    return total
cols = ["date", "device", "commit", "dtype", "pass", "kernel", "d", "causal", "window_left", "window_right", "N", "H",
        "B", "median_ms", "min_ms", "max_ms", "tflops", "band_fraction", "cudnn_bnhd_tflops", "cudnn_bhnd_tflops"]
w = csv.writer(open(f"{out}/fwd_window.csv", "w", newline=""), lineterminator="\n")
w.writerow(cols)
for f in sorted(glob.glob(f"{out}/band_*.csv")) + [f"{out}/plain.csv"]:
    for r in csv.DictReader(open(f)):
        n, left, right, causal = int(r["N"]), int(r["window_left"]), int(r["window_right"]), r["causal"] == "1"
        frac = pairs(n, left, right, causal) / (n * (n + 1) / 2) if causal else ""
        cud = ("", "") if left >= 0 or right >= 0 else sdpa.get((r["d"], r["causal"], r["N"]), ("", ""))
        w.writerow([date, device, commit, r["dtype"], r["pass"], r["fwd_kernel"], r["d"], r["causal"], left, right, n,
                    r["H"], r["B"], r["ms"], r["min_ms"], r["max_ms"], r["tflops"],
                    f"{frac:.4f}" if frac != "" else "", *cud])
EOF
echo "fwd_window: status $status ($out/fwd_window.csv)"
exit $status
