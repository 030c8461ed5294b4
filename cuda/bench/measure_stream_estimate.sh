#!/usr/bin/env bash
# cuda/bench/measure_stream_estimate.sh — the figures of the fast bf16 STREAM estimate, in one run
# on the GPU machine, from the repository root:
#
#   measure_stream_estimate.sh [BIN_DIR] [OUT_DIR]
#
# BIN_DIR (default gpu-carry) holds `test_cuda`, `flashlab` and `bench_cuda_stream_estimate` built
# with the cuda preset; OUT_DIR (default /tmp/flashlab-stream-estimate) must lie outside the tree
# (raw logs do not belong in it). Steps, one log each in OUT_DIR/logs:
#   the `[stream-fast]` tests; compute-sanitizer memcheck and racecheck on the small ones;
#   `flashlab stream needles --device cuda --kernel fast` at T = 1M, k = 16 (8 and 4 needle blocks);
#   bench_cuda_stream_estimate: T = 32768 … 1048576 × d = 64, 128 × k = 8, 16, 32 (20 timed
#   launches each, L2 flushed before each), then T = 1048576, 2097152, 4194304 at d = 128, k = 8 with the
#   CUPTI traffic of one launch.
# Output: OUT_DIR/csv/stream_fast_estimate.csv (the columns of cuda/results/README.md), to append to
# cuda/results/stream_fast_estimate.csv here; then `cmake --build --preset cpu --target results-pages`.
set -u
bin=${1:-gpu-carry}
out=${2:-/tmp/flashlab-stream-estimate}
logs=$out/logs
mkdir -p "$logs" "$out/csv"
export PATH=$PATH:/usr/local/cuda/bin
date=$(date -u '+%Y-%m-%d %H:%M')
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
status=0

step() {  # step LOG SECONDS CMD...: stdout+stderr into LOG, the exit status into LOG.rc
  local log=$1 limit=$2; shift 2
  echo "=== $*"
  timeout "$limit" "$@" >"$log" 2>&1
  local rc=$?
  echo "$rc" >"$log.rc"
  [ "$rc" -eq 0 ] || { echo "    failed: rc=$rc (see $log)"; status=1; }
}

step "$logs/test_fast.log" 300 "$bin/test_cuda" "[stream-fast]" -d yes
step "$logs/memcheck.log" 120 compute-sanitizer --tool memcheck --error-exitcode 1 "$bin/test_cuda" \
  "cuda stream fast: heads*,cuda stream fast: NaN*"
step "$logs/racecheck.log" 120 compute-sanitizer --tool racecheck --error-exitcode 1 "$bin/test_cuda" \
  "cuda stream fast: heads*"
for blocks in 8 4; do
  step "$logs/needles_$blocks.log" 120 "$bin/flashlab" stream needles --device cuda --kernel fast --seq 1048576 \
    --dim 128 --bq 64 --bk 64 --k 16 --needle-blocks "$blocks"
done
step "$logs/bench.log" 200 "$bin/bench_cuda_stream_estimate" --seq 32768,131072,262144,524288,1048576 \
  --dim 64,128 --k 8,16,32 --reps 20 --csv "$logs/bench.csv"
step "$logs/bench_traffic.log" 200 "$bin/bench_cuda_stream_estimate" --seq 1048576,2097152,4194304 \
  --dim 128 --k 8 --reps 10 --traffic --csv "$logs/bench_traffic.csv"

# One CSV: the date and device of the run before the bench's own columns.
{
  echo "date,device,$(head -1 "$logs/bench.csv")"
  for f in "$logs/bench.csv" "$logs/bench_traffic.csv"; do
    tail -n +2 "$f" | sed "s/^/$date,$device,/"
  done
} >"$out/csv/stream_fast_estimate.csv"
grep -h -E "recall|passed|failed|ERROR SUMMARY|RACECHECK SUMMARY" "$logs"/*.log
echo "csv: $out/csv/stream_fast_estimate.csv; status $status"
exit $status
