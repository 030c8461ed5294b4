#!/usr/bin/env bash
# cuda/bench/stream_gpus.sh — STREAM with the sequence sharded over the GPUs of one machine: the
# multi-GPU checks and the scaling rows, as CSV.
#
#   stream_gpus.sh check [BIN_DIR] [OUT_DIR]  test_cuda_stream_sharded (I and O bitwise one GPU's,
#                                             G = 2, 3, 4 as the machine has), then the single-GPU
#                                             fast estimate's I checksum at T = 1M, d = 128, k = 16
#                                             against the one recorded before the query-block range
#                                             was added (0xa33b7e18b460d080, stream_fast_estimate.csv)
#   stream_gpus.sh scale [BIN_DIR] [OUT_DIR]  `flashlab bench stream --gpus`: d = 128, k = 16, one
#                                             head; strong scaling at T = 1M, 4M, 8M, 16M on G = 1, 2, 4
#                                             (G = 1 the single-GPU anchor of each T), weak scaling
#                                             from 2M tokens per GPU; each G > 1 under the contiguous
#                                             layout, zigzag, and zigzag with the K exchange in
#                                             pieces (the CLI's default folds, schedule and
#                                             transport); rows into stream_gpus.csv
#   stream_gpus.sh all [BIN_DIR] [OUT_DIR]    check, then scale
#   stream_gpus.sh schedule [BIN_DIR] [OUT_DIR]  check, then the schedules at one shape: T = 8M on 4
#                                             GPUs (T = 4M on 2: the same 2M queries per rank), G = 1
#                                             at T and at T/G; each G > 1 contiguous, and zigzag with
#                                             the K exchange whole and in pieces, 1, 2, 4 and 8 folds,
#                                             serial and overlapped chunks, over NCCL and again by the
#                                             copy engines; then overlapped pieces of 4 and 8 folds
#                                             with the NCCL stream at high priority; per-rank lines in
#                                             OUT_DIR/logs/bench_*.log
#
# BIN_DIR (default gpu-carry) holds test_cuda_stream_sharded and flashlab built with the cuda preset
# (NCCL found) and, optionally, a file `commit` naming their commit; OUT_DIR (default
# /tmp/flashlab-stream-gpus) lies outside the tree: OUT_DIR/logs/, OUT_DIR/csv/stream_gpus.csv (its
# rows belong in the file of that name in cuda/results/, whose README gives the columns). The recipe:
#   cmake --preset cuda && cmake --build --preset cuda -j2 --target test_cuda_stream_sharded flashlab
#   mkdir -p gpu-carry && cp build/cuda/tests/cuda/test_cuda_stream_sharded build/cuda/app/flashlab gpu-carry/
#   (GPU machine of 2 or 4 GPUs, repository root)  bash cuda/bench/stream_gpus.sh all gpu-carry "$OUT"
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0). REPS (5), TEST_TIMEOUT (240 s), BENCH_TIMEOUT
# (360 s per bench command) and LAYOUTS (contiguous,zigzag) may be set in the environment.
set -uo pipefail
export NCCL_NVLS_ENABLE=0

mode=${1:-}
bin=${2:-gpu-carry}
out=${3:-/tmp/flashlab-stream-gpus}
REPS=${REPS:-5}
TEST_TIMEOUT=${TEST_TIMEOUT:-240}    # seconds for the test executable (three layouts per case)
BENCH_TIMEOUT=${BENCH_TIMEOUT:-360}  # seconds for each bench command (three rows per G > 1)
LAYOUTS=${LAYOUTS:-contiguous,zigzag}
exchange=whole
[[ $LAYOUTS == *zigzag* ]] && exchange=whole,pieces

case "$mode" in
  check|scale|all|schedule) ;;
  *) sed -n '2,35p' "$0"; exit 2 ;;
esac
for exe in test_cuda_stream_sharded flashlab; do
  [[ -x "$bin/$exe" ]] || { echo "error: $bin/$exe is missing (hint: build and copy it as the header says)" >&2; exit 2; }
done
mkdir -p "$out/logs" "$out/csv"
gpus=$(nvidia-smi -L | wc -l)
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "machine: $gpus x $device"
list=1
for g in 2 4; do (( g <= gpus )) && list+=",$g"; done
now() { date -u '+%Y-%m-%d %H:%M'; }
commit=$(head -1 "$bin/commit" 2>/dev/null || echo -)  # the build's commit, where BIN_DIR has it
status=0

check() {
  local log="$out/logs/test_cuda_stream_sharded.log" result=pass
  timeout "$TEST_TIMEOUT" "$bin/test_cuda_stream_sharded" --durations yes > "$log" 2>&1 || result=fail
  [[ $result == pass ]] || status=1
  echo "test_cuda_stream_sharded: $result ($(grep -E "All tests passed|test cases:|assertions:|SKIPPED" "$log" | tr '\n' ' '))"
  local anchor=0xa33b7e18b460d080 line
  line=$(timeout 60 "$bin/flashlab" bench stream --kernel fast --pass estimate --check-indices --seq 1048576 \
    --dim 128 --k 16 --reps 3 2> "$out/logs/single_gpu_checksum.err" | grep checksum)
  if [[ $line == *"$anchor"* ]]; then echo "one GPU, T = 1M, d = 128, k = 16: I checksum $anchor as recorded: yes"
  else echo "one GPU, T = 1M, d = 128, k = 16: I checksum differs from $anchor: NO ($line)"; status=1; fi
}

bench() {  # bench SCALING SEQ: rows into stream_gpus.csv
  local scaling=$1 seq=$2 raw="$out/logs/bench_$1.csv" csv="$out/csv/stream_gpus.csv"
  echo "bench stream --gpus $list --scaling $scaling --seq $seq --dim 128 --k 16 --reps $REPS --layout $LAYOUTS --exchange $exchange"
  timeout "$BENCH_TIMEOUT" "$bin/flashlab" bench stream --gpus "$list" --scaling "$scaling" --seq "$seq" --dim 128 --k 16 \
    --reps "$REPS" --warmup 1 --layout "$LAYOUTS" --exchange "$exchange" --csv > "$raw" 2>> "$out/logs/bench_stream_gpus.log" ||
    { echo "error: that run failed (see the log)"; status=1; }
  [[ -s "$raw" ]] || return 0
  [[ -f "$csv" ]] || echo "date,device,commit,$(head -1 "$raw")" > "$csv"
  tail -n +2 "$raw" | sed "s/^/$(now),$device,$commit,/" >> "$csv"
  if command -v column > /dev/null; then column -s, -t < "$raw"; else cat "$raw"; fi
}

schedule() {  # rows into stream_gpus.csv; the per-rank lines go to the log
  local G=2 T=4194304 csv="$out/csv/stream_gpus.csv"
  (( gpus >= 4 )) && { G=4; T=8388608; }
  local common=(--dim 128 --k 16 --reps "$REPS" --warmup 1 --csv)
  local runs=(
    "one_gpu|--gpus 1 --seq $((T / G))"
    "schedule|--gpus 1,$G --seq $T --layout contiguous,zigzag --exchange whole,pieces --folds 1,2,4,8 --schedule serial,overlap --transport nccl"
    "copy|--gpus $G --seq $T --layout contiguous,zigzag --exchange whole,pieces --folds 1,2,4,8 --schedule serial,overlap --transport copy"
    "priority|--gpus $G --seq $T --layout zigzag --exchange pieces --folds 4,8 --schedule overlap --comm-priority high")
  for r in "${runs[@]}"; do
    local name=${r%%|*} args=${r#*|}
    local raw="$out/logs/bench_$name.csv"
    echo "bench stream $args"
    # shellcheck disable=SC2086  # args is a list of flags
    timeout "$BENCH_TIMEOUT" "$bin/flashlab" bench stream $args "${common[@]}" > "$raw" 2> "$out/logs/bench_$name.log" ||
      { echo "error: that run failed (see the log)"; status=1; }
    [[ -s "$raw" ]] || continue
    [[ -f "$csv" ]] || echo "date,device,commit,$(head -1 "$raw")" > "$csv"
    tail -n +2 "$raw" | sed "s/^/$(now),$device,$commit,/" >> "$csv"
  done
}

case "$mode" in
  check) check ;;
  schedule) check; schedule ;;
  scale) bench strong 1048576,4194304,8388608,16777216; bench weak 2097152 ;;
  all) check; bench strong 1048576,4194304,8388608,16777216; bench weak 2097152 ;;
esac
exit $status
