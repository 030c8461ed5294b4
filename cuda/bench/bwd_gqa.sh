#!/usr/bin/env bash
# cuda/bench/bwd_gqa.sh — the fast backward with grouped K/V on the H100 beside SDPA's cuDNN backend
# (enable_gqa=True), and the multi-head backward of the same binary as the anchor: the rows of
# cuda/results/bwd_gqa.csv.
#
#   bwd_gqa.sh [BIN_DIR] [OUT_DIR]   on the GPU machine, from the repository root
#
# BIN_DIR (default gpu-carry) holds `flashlab` built with the cuda preset and `commit` (git describe
# of the tree that built it, as measure.sh wants); OUT_DIR (default /tmp/flashlab-bwd-gqa, outside
# the tree) gets the raw bench CSVs and SDPA's log, and bwd_gqa.csv: date, device, commit, then
# command, dtype, kernel, d, causal, N, N_k, H, H_kv, B, median_ms, tflops (2.5 × 4·d·H·B × the
# visible query-key pairs, bench.hpp), cudnn_bnhd_tflops, cudnn_bhnd_tflops (SDPA's cuDNN backward in
# the same run, enable_gqa=True where H_kv < H; sdpa_bench.py), ours_over_cudnn_bnhd.
#
# Shapes: bf16, B = 1, N = N_k = 8192, d = 128, causal and not: H = 32 over H_kv = 8 on wgmma-ws
# (beside cuDNN) and on mma; H = H_kv = 16 on wgmma-ws (beside cuDNN), the plain backward. Then the
# anchors of the grouped kernel, on wgmma-ws: H = H_kv = 32 (the plain kernel on the grouped rows'
# work), H = 16 against N_k = 8191 (the grouped instantiation with one head per group), and the
# same with an unbounded window (--window 100000,100000, not causal: the band instantiation; kernel
# label wgmma-ws-band).
set -u
. "$(dirname "$0")/run_context.sh" "${1:-gpu-carry}" "${2:-/tmp/flashlab-bwd-gqa}"
shape=(--pass bwd --seq 8192 --dim 128 --batch 1 --both --reps 30 --csv)
"$bin/flashlab" bench attention "${shape[@]}" --heads 32 --heads-kv 8 --bwd-kernel wgmma-ws >"$out/gqa_ws.csv" || status=1
"$bin/flashlab" bench attention "${shape[@]}" --heads 16 --bwd-kernel wgmma-ws >"$out/plain_ws.csv" || status=1
"$bin/flashlab" bench attention "${shape[@]}" --heads 32 --heads-kv 8 --bwd-kernel mma >"$out/gqa_mma.csv" || status=1
"$bin/flashlab" bench attention "${shape[@]}" --heads 32 --bwd-kernel wgmma-ws >"$out/plain32_ws.csv" || status=1
"$bin/flashlab" bench attention "${shape[@]}" --heads 16 --seq-k 8191 --bwd-kernel wgmma-ws >"$out/g1_ws.csv" || status=1
"$bin/flashlab" bench attention --pass bwd --seq 8192 --dim 128 --batch 1 --no-causal --reps 30 --csv --heads 16 \
  --seq-k 8191 --window 100000,100000 --bwd-kernel wgmma-ws >"$out/band_ws.csv" || status=1
python3 - "$out" <<'EOF' || status=1
import csv, sys
out = sys.argv[1]
rows = [r for f in ("gqa_ws", "plain_ws") for r in csv.DictReader(open(f"{out}/{f}.csv"))]
with open(f"{out}/for_sdpa.csv", "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
EOF
PYTHONUNBUFFERED=1 python3 "$here/sdpa_bench.py" "$out/for_sdpa.csv" --reps 30 --out "$out/sdpa.csv" >"$out/sdpa.log" 2>&1 ||
  status=1
python3 - "$out" "$date" "$device" "$commit" <<'EOF' || status=1
import csv, os, sys
out, date, device, commit = sys.argv[1:5]
sdpa = {}
if os.path.exists(f"{out}/sdpa.csv"):
    for r in csv.DictReader(open(f"{out}/sdpa.csv")):
        sdpa[(r["d"], r["causal"], r["N"], r["H"], r["H_kv"])] = (r["cudnn_bnhd_tflops"], r["cudnn_bhnd_tflops"])
cols = ["date", "device", "commit", "command", "dtype", "kernel", "d", "causal", "N", "N_k", "H", "H_kv", "B",
        "median_ms", "tflops", "cudnn_bnhd_tflops", "cudnn_bhnd_tflops", "ours_over_cudnn_bnhd"]
w = csv.writer(open(f"{out}/bwd_gqa.csv", "w", newline=""), lineterminator="\n")
w.writerow(cols)
files = (("gqa_ws", "wgmma-ws"), ("plain_ws", "wgmma-ws"), ("gqa_mma", "mma"), ("plain32_ws", "wgmma-ws"),
         ("g1_ws", "wgmma-ws"), ("band_ws", "wgmma-ws-band"))
for f, kernel in files:
    if not os.path.exists(f"{out}/{f}.csv"):
        continue
    for r in csv.DictReader(open(f"{out}/{f}.csv")):
        hkv, nk, compared = r["H_kv"] or r["H"], r["N_k"] or r["N"], f in ("gqa_ws", "plain_ws")
        win = r["window_left"] not in ("", "-1")
        cmd = (f"flashlab bench attention --pass bwd --seq {r['N']} --dim {r['d']} --heads {r['H']}"
               + (f" --heads-kv {hkv}" if hkv != r["H"] else "") + (f" --seq-k {nk}" if nk != r["N"] else "")
               + (f" --window {r['window_left']},{r['window_right']} --no-causal" if win else " --both")
               + f" --reps 30 --csv --bwd-kernel {kernel.replace('-band', '')}"
               + ("; python3 cuda/bench/sdpa_bench.py (its rows) --reps 30" if compared else ""))
        bnhd, bhnd = sdpa.get((r["d"], r["causal"], r["N"], r["H"], hkv), ("", "")) if compared else ("", "")
        ratio = f"{float(r['tflops']) / float(bnhd):.3f}" if bnhd not in ("", "n/a") else ""
        w.writerow([date, device, commit, cmd, r["dtype"], kernel, r["d"], r["causal"], r["N"], nk,
                    r["H"], hkv, r["B"], r["ms"], r["tflops"], bnhd, bhnd, ratio])
EOF
echo "bwd_gqa: status $status ($out/bwd_gqa.csv)"
exit $status
