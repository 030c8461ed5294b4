#!/usr/bin/env bash
# cuda/bench/bwd_d256.sh — the fast backward at head dim d = 256 on the H100 (the atomic design's two
# kernels there: mma, attention_bwd_d256.cu, and wgmma-ws, attention_bwd_d256_ws.cu, with its fixed-order
# variant wgmma-ws-det): their tests, the backward at N = 8192 of the three interleaved (REPEATS rounds
# of mma, wgmma-ws, wgmma-ws-det, default 3; each row: the median of the rounds' medians, the min
# and max over all) beside SDPA's cuDNN and flash backends, with the backward at d = 128 (the fastest
# kernel there) as the anchor of the same run, then the sanitizers: the rows of
# cuda/results/bwd_d256.csv and bwd_d256_checks.csv.
#
#   bwd_d256.sh [BIN_DIR] [OUT_DIR]   on the GPU machine, from the repository root
#
# BIN_DIR (default gpu-carry) holds `flashlab`, `test_cuda` and `test_cuda_fast_limits` built with the
# cuda preset and `commit` (git describe of the tree that built them); OUT_DIR (default
# /tmp/flashlab-bwd-d256) gets the logs, the raw bench CSV, SDPA's CSV and the two CSVs, whose
# columns are those of fwd_d256.sh's (fwd_d256.csv, fwd_d256_checks.csv).
# Shapes: bf16, H = 16, B = 1, N = 8192, causal and not, d = 256 and 128; REPS (default 20, the least
# `bench attention --reps` takes) timed launches per shape.
set -u
here=$(dirname "$0")
bin=${1:-gpu-carry}
out=${2:-/tmp/flashlab-bwd-d256}
logs=$out/logs
mkdir -p "$logs"
export PATH=$PATH:/usr/local/cuda/bin
commit=$(head -1 "$bin/commit" 2>/dev/null || echo unknown)
date=$(date -u '+%Y-%m-%d %H:%M')
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
status=0
step() {  # step TIMEOUT LOG CMD...: stdout into LOG, stderr into LOG.err, the command into LOG.cmd, rc into LOG.rc
  local limit=$1 log=$2; shift 2
  echo "=== $*" | tee "$log.cmd"
  timeout "$limit" "$@" >"$log" 2>"$log.err"
  local rc=$?
  echo "$rc" >"$log.rc"
  [ "$rc" -eq 0 ] || { echo "    failed: rc=$rc (see $log.err)"; status=1; }
}
step 120 "$logs/test_cuda_bwd_d256.log" "$bin/test_cuda" '[fast-bwd-d256]' --durations yes
# A test run that timed out may be a kernel that hangs: its timings would too.
hung=$([ "$(cat "$logs/test_cuda_bwd_d256.log.rc")" = 124 ] && echo 1 || echo 0)
step 20 "$logs/test_cuda_fast_limits.log" "$bin/test_cuda_fast_limits" '[fast-d256]'
bench() {  # bench LOG KERNEL DIM: one `flashlab bench attention` backward run at N = 8192
  step 40 "$1" "$bin/flashlab" bench attention --csv --pass bwd --seq 8192 --heads 16 --batch 1 --both --dim "$3" \
    --bwd-kernel "$2" --reps "${REPS:-20}"
}
for r in $(seq 1 "${REPEATS:-3}"); do
  bench "$logs/bench_bwd_mma_$r.csv" mma 256
  [ "$hung" = 1 ] || bench "$logs/bench_bwd_ws_$r.csv" wgmma-ws 256
  [ "$hung" = 1 ] || bench "$logs/bench_bwd_det_$r.csv" wgmma-ws-det 256
done
bench "$logs/bench_bwd_128.csv" auto 128
# SDPA once per shape: the first round's d = 256 rows and the d = 128 rows.
{ cat "$logs/bench_bwd_mma_1.csv"; tail -n +2 "$logs/bench_bwd_128.csv"; } >"$logs/bench_shapes.csv"
step 60 "$logs/sdpa.log" env PYTHONUNBUFFERED=1 python3 "$here/sdpa_bench.py" "$logs/bench_shapes.csv" --reps "${REPS:-20}" \
  --out "$logs/sdpa.csv"
for tool in memcheck racecheck; do
  step 90 "$logs/sanitize_$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/test_cuda" \
    '[fast-bwd-d256-sanitize]'
done
python3 - "$out" "$date" "$device" "$commit" <<'EOF' || status=1
import csv, glob, os, sys
out, date, device, commit = sys.argv[1:5]
logs = f"{out}/logs"
sdpa = {}
if os.path.exists(f"{logs}/sdpa.csv"):
    for r in csv.DictReader(open(f"{logs}/sdpa.csv")):
        if r.get("pass", "bwd") == "bwd":
            sdpa[(r["d"], r["causal"], r["N"])] = r
cols = ["date", "device", "commit", "dtype", "pass", "kernel", "d", "causal", "N", "H", "B", "median_ms", "min_ms",
        "max_ms", "tflops", "flash_bnhd_tflops", "cudnn_bnhd_tflops", "cudnn_bhnd_tflops", "ours_over_cudnn_bnhd"]
w = csv.writer(open(f"{out}/bwd_d256.csv", "w", newline=""), lineterminator="\n")
w.writerow(cols)
runs = {}  # (kernel, d, causal) -> the rows of every round
for path in sorted(glob.glob(f"{logs}/bench_bwd_*.csv")):
    for r in csv.DictReader(open(path)):
        kernel = "mma" if r.get("bwd_design") == "atomic" else r.get("bwd_design", "")
        runs.setdefault((kernel, r["d"], r["causal"]), []).append(r)
        print(f"round {os.path.basename(path)}: {kernel} d={r['d']} causal={r['causal']} {r['ms']} ms {r['tflops']} TFLOP/s")
for (kernel, d, causal), rows in sorted(runs.items(), key=lambda kv: (-int(kv[0][1]), kv[0][0], kv[0][2])):
    rows.sort(key=lambda x: float(x["ms"]))
    r = rows[(len(rows) - 1) // 2]  # the median round (the lower middle one of an even count)
    lo, hi = min(float(x["min_ms"]) for x in rows), max(float(x["max_ms"]) for x in rows)
    s = sdpa.get((r["d"], r["causal"], r["N"]), {})
    fl, cb, ch = (s.get(k, "") for k in ("flash_bnhd_tflops", "cudnn_bnhd_tflops", "cudnn_bhnd_tflops"))
    ratio = f"{float(r['tflops']) / float(cb):.3f}" if cb not in ("", "n/a") else ""
    row = [date, device, commit, r["dtype"], r["pass"], kernel, r["d"], r["causal"], r["N"], r["H"], r["B"], r["ms"], str(lo), str(hi), r["tflops"], fl, cb, ch, ratio]
    w.writerow(row)
    print("row:", ",".join(row[3:]))
EOF
python3 "$here/step_checks.py" "$out/bwd_d256_checks.csv" "$logs" "$date" "$device" "$commit" || status=1
echo "bwd_d256: status $status ($out/bwd_d256.csv, $out/bwd_d256_checks.csv)"
exit $status
