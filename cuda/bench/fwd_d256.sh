#!/usr/bin/env bash
# cuda/bench/fwd_d256.sh — the fast forwards at head dim d = 256 on the H100: their tests and
# sanitizers, then the tma-ws and mma forwards at N = 8192 beside SDPA's cuDNN and flash backends,
# with the tma-ws forward at d = 128 as the anchor of the same run: the rows of
# cuda/results/fwd_d256.csv and fwd_d256_checks.csv.
#
#   fwd_d256.sh [BIN_DIR] [OUT_DIR]   on the GPU machine, from the repository root
#   fwd_d256.sh tabulate OUT_DIR [BIN_DIR]  anywhere: the two CSVs again from OUT_DIR/logs
#
# BIN_DIR (default gpu-carry) holds `flashlab`, `test_cuda` and `test_cuda_fast_limits` built with the
# cuda preset and `commit` (git describe of the tree that built them, as measure.sh wants); OUT_DIR
# (default /tmp/flashlab-d256, outside the tree) gets the logs, the raw bench CSVs, SDPA's log and
# the two CSVs:
#   fwd_d256.csv: date, device, commit, dtype, pass, kernel, d, causal, N, H, B, median_ms, min_ms,
#     max_ms, tflops, then SDPA's TFLOP/s on the same shape in the same run (flash_bnhd_tflops,
#     cudnn_bnhd_tflops, cudnn_bhnd_tflops) and ours_over_cudnn_bnhd;
#   fwd_d256_checks.csv: as cuda/results/checks.csv (command, status, assertions, test_cases,
#     sanitizer_errors).
# Shapes: bf16, H = 16, B = 1, N = 8192, causal and not: d = 256 on tma-ws and mma, d = 128 on tma-ws.
set -u
here=$(dirname "$0")
status=0
if [ "${1:-}" = tabulate ]; then  # the CSVs again from the logs of a run (its env.txt: date, device, commit)
  out=${2:?usage: fwd_d256.sh tabulate OUT_DIR}
  logs=$out/logs
  IFS=$'\n' read -r -d '' date device commit <"$logs/env.txt"
else
  bin=${1:-gpu-carry}
  out=${2:-/tmp/flashlab-d256}
  logs=$out/logs
  mkdir -p "$logs"
  export PATH=$PATH:/usr/local/cuda/bin
  commit=$(head -1 "$bin/commit" 2>/dev/null || echo unknown)
  date=$(date -u '+%Y-%m-%d %H:%M')
  device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  printf '%s\n%s\n%s\n' "$date" "$device" "$commit" >"$logs/env.txt"
fi
step() {  # step LOG CMD...: stdout into LOG, stderr into LOG.err, the command into LOG.cmd, rc into LOG.rc
  local log=$1; shift
  echo "=== $*" | tee "$log.cmd"
  timeout "${step_timeout:-200}" "$@" >"$log" 2>"$log.err"
  local rc=$?
  echo "$rc" >"$log.rc"
  [ "$rc" -eq 0 ] || { echo "    failed: rc=$rc (see $log.err)"; status=1; }
}
run() {  # the tests, the timings, then the sanitizers (the longest steps last)
  step "$logs/test_cuda_d256.log" "$bin/test_cuda" '[fast-d256]' --durations yes
  step "$logs/test_cuda_fast_limits.log" "$bin/test_cuda_fast_limits"
  shape=(--pass fwd --seq 8192 --heads 16 --batch 1 --both)
  step "$logs/bench_tmaws.csv" "$bin/flashlab" bench attention --csv "${shape[@]}" --dim 256,128 --fwd-kernel tma-ws
  step "$logs/bench_mma.csv" "$bin/flashlab" bench attention --csv "${shape[@]}" --dim 256 --fwd-kernel mma
  step "$logs/sdpa.log" env PYTHONUNBUFFERED=1 python3 "$here/sdpa_bench.py" "$logs/bench_tmaws.csv" \
    --out "$logs/sdpa.csv"
  for tool in memcheck racecheck; do
    step "$logs/sanitize_$tool.log" compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/test_cuda" \
      '[fast-d256-sanitize]'
  done
}
[ "${1:-}" = tabulate ] || run
python3 - "$out" "$date" "$device" "$commit" <<'EOF' || status=1
import csv, os, sys
out, date, device, commit = sys.argv[1:5]
logs = f"{out}/logs"
sdpa = {}
if os.path.exists(f"{logs}/sdpa.csv"):
    for r in csv.DictReader(open(f"{logs}/sdpa.csv")):
        sdpa[(r["d"], r["causal"], r["N"])] = r
cols = ["date", "device", "commit", "dtype", "pass", "kernel", "d", "causal", "N", "H", "B", "median_ms", "min_ms",
        "max_ms", "tflops", "flash_bnhd_tflops", "cudnn_bnhd_tflops", "cudnn_bhnd_tflops", "ours_over_cudnn_bnhd"]
w = csv.writer(open(f"{out}/fwd_d256.csv", "w", newline=""), lineterminator="\n")
w.writerow(cols)
for f in (f"{logs}/bench_tmaws.csv", f"{logs}/bench_mma.csv"):
    if not os.path.exists(f):
        continue
    for r in csv.DictReader(open(f)):
        s = sdpa.get((r["d"], r["causal"], r["N"]), {})
        fl, cb, ch = (s.get(k, "") for k in ("flash_bnhd_tflops", "cudnn_bnhd_tflops", "cudnn_bhnd_tflops"))
        ratio = f"{float(r['tflops']) / float(cb):.3f}" if cb not in ("", "n/a") else ""
        w.writerow([date, device, commit, r["dtype"], r["pass"], r["fwd_kernel"], r["d"], r["causal"], r["N"], r["H"],
                    r["B"], r["ms"], r["min_ms"], r["max_ms"], r["tflops"], fl, cb, ch, ratio])
EOF
python3 "$here/step_checks.py" "$out/fwd_d256_checks.csv" "$logs" "$date" "$device" "$commit" || status=1
echo "fwd_d256: status $status ($out/fwd_d256.csv, $out/fwd_d256_checks.csv)"
exit $status
