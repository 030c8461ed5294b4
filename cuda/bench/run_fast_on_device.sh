#!/usr/bin/env bash
# cuda/bench/run_fast_on_device.sh — one GPU run for the fast tensor-core kernels (issue 7):
# forward, two-kernel and atomic backward: tests, sanitizers, timings beside PyTorch SDPA.
#
# Build here (CPU machine, nvcc present), copy the binaries into gpu-carry-fast/, run this there:
#   cmake -S . -B build-fast -DCMAKE_BUILD_TYPE=Release -DFLASHLAB_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
#   cmake --build build-fast --target test_cuda flashlab -j2
#   mkdir -p gpu-carry-fast && cp build-fast/tests/cuda/test_cuda build-fast/app/flashlab gpu-carry-fast/
#   (device) OUT=/some/dir bash cuda/bench/run_fast_on_device.sh [all|tests|bench]
# Logs in $OUT: env.log, fast_tests.log, fast_sanitize.log, bench.log, ours.csv, sdpa.log, ratios.csv.
set -u
OUT=${OUT:-./gpu-logs}
BIN=${BIN:-gpu-carry-fast}
WHAT=${1:-all}
mkdir -p "$OUT"
export PATH=$PATH:/usr/local/cuda/bin
status=0
step() {  # step NAME LOG CMD...: run, append to LOG, remember failures
  local name=$1 log=$2; shift 2
  echo "=== $name: $*" | tee -a "$log"
  local t0=$(date +%s)
  "$@" >>"$log" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc ($(( $(date +%s) - t0 )) s)" | tee -a "$log"
  [ $rc -eq 0 ] || status=1
}
{ date -u; nvidia-smi; } >"$OUT/env.log" 2>&1

if [ "$WHAT" = all ] || [ "$WHAT" = tests ]; then
  step "fast tests" "$OUT/fast_tests.log" timeout 200 "$BIN/test_cuda" '[fast],[fast-bwd]' --durations yes
  for tool in memcheck racecheck synccheck; do
    step "compute-sanitizer $tool" "$OUT/fast_sanitize.log" timeout 200 compute-sanitizer --tool "$tool" \
      --error-exitcode 9 "$BIN/test_cuda" '[fast-sanitize],[fast-bwd-sanitize]'
  done
  grep -h "worst\|passed\|failed\|ERROR SUMMARY\|RACECHECK SUMMARY" "$OUT/fast_tests.log" "$OUT/fast_sanitize.log"
fi

if [ "$WHAT" = all ] || [ "$WHAT" = bench ]; then
  # `flashlab bench attention --csv`: CSV on stdout (→ ours.csv), the device/method lines on stderr.
  step "bench" "$OUT/bench.log" timeout 240 bash -c "\"$BIN/flashlab\" bench attention --csv ${BENCH_ARGS:-} >\"$OUT/ours.csv\""
  cat "$OUT/bench.log" "$OUT/ours.csv"
  step "sdpa" "$OUT/sdpa.log" timeout 240 env PYTHONUNBUFFERED=1 python3 cuda/bench/sdpa_bench.py "$OUT/ours.csv" --out "$OUT/ratios.csv"
  cat "$OUT/sdpa.log"
fi
exit $status
