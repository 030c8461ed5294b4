#!/usr/bin/env bash
# run_wgmma_on_device.sh — the wgmma forward (issue 7, cuda/src/attention_fwd_wgmma.cu) on the GPU
# machine: its tests vs float64 (test_cuda [fast-wgmma], plus the mma.sync [fast-sanitize] cases
# and [errors] to show nothing else moved), `flashlab bench attention --pass fwd` with
# --fwd-kernel wgmma and mma, PyTorch SDPA on the same shapes in the same session, the schedule
# variants of cuda/bench/wgmma_driver.cu, compute-sanitizer memcheck + racecheck on the small
# wgmma shapes. Logs go straight into $OUT (no tar: what finished survives a time-out).
# Usage, from the repo root: OUT=dir bash cuda/bench/run_wgmma_on_device.sh <dir with test_cuda, flashlab, wgmma_driver>
BIN=${1:-gpu-carry-wg}
OUT=${OUT:-/tmp/wgmma_out}
mkdir -p "$OUT"
status=0
step() {  # step <log> <command...>
  local log=$1
  shift
  echo "=== $*" >>"$log"
  local t0=$(date +%s)
  "$@" >>"$log" 2>&1
  local rc=$?
  echo "=== rc=$rc ($(( $(date +%s) - t0 )) s)" >>"$log"
  [ $rc -eq 0 ] || status=1
}
{ date -u; nvidia-smi; nvidia-smi -q -d CLOCK | head -30; } >"$OUT/env.log" 2>&1
step "$OUT/tests.log" timeout 40 "$BIN/test_cuda" '[fast-wgmma],[fast-sanitize],[errors]' --durations yes
step "$OUT/bench.log" timeout 30 bash -c "\"$BIN/flashlab\" bench attention --pass fwd --fwd-kernel wgmma --csv >\"$OUT/ours_wgmma.csv\""
step "$OUT/sdpa.log" timeout 60 env PYTHONUNBUFFERED=1 python3 cuda/bench/sdpa_bench.py "$OUT/ours_wgmma.csv" --reps 30 \
  --out "$OUT/ratios.csv"
step "$OUT/bench.log" timeout 30 bash -c "\"$BIN/flashlab\" bench attention --pass fwd --fwd-kernel mma --csv >\"$OUT/ours_mma.csv\""
for tool in memcheck racecheck; do
  step "$OUT/sanitize.log" timeout 30 compute-sanitizer --tool "$tool" --error-exitcode 9 "$BIN/test_cuda" \
    '[fast-wgmma][fast-sanitize]'
done
# Schedules side by side (variant 0 plain = the wired one, 2 = overlapped), sampled-row checks.
step "$OUT/bench.log" timeout 25 "$BIN/wgmma_driver" bench "$OUT/driver_v0.csv" 0
step "$OUT/bench.log" timeout 25 "$BIN/wgmma_driver" bench "$OUT/driver_v2.csv" 2
exit $status
