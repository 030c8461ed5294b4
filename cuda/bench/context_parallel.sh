#!/usr/bin/env bash
# cuda/bench/context_parallel.sh — context-parallel (ring) attention on the GPUs of one machine:
# the multi-GPU checks and the scaling sweeps, as CSV rows.
#
#   context_parallel.sh check [BIN_DIR] [OUT_DIR]  test_cuda_context_parallel (ring vs one GPU's fast
#                                                  kernels and the float64 reference, G = 2, 4, 8 as
#                                                  the machine has), then compute-sanitizer memcheck
#                                                  on its small shapes, then ring_cli_check.sh (the
#                                                  command lines' rows and bytes); rows into
#                                                  context_parallel_checks.csv
#   context_parallel.sh scale [BIN_DIR] [OUT_DIR]  causal forward + backward, d = 128, H = 16 with
#                                                  H_kv = 16 and 4 (`flashlab bench attention --gpus`):
#                                                  strong scaling at N = 512k on G = 1, 2, 4 (8) beside
#                                                  one GPU's fast kernels on the whole problem; weak
#                                                  scaling from N = 128k per GPU; N = 1M on all GPUs
#                                                  (one GPU cannot take it in one launch); rows into
#                                                  context_parallel.csv
#   context_parallel.sh all [BIN_DIR] [OUT_DIR]    check, then scale
#
# BIN_DIR (default gpu-carry) holds test_cuda_context_parallel and flashlab built with the cuda
# preset (NCCL found); OUT_DIR (default /tmp/flashlab-ring) lies outside the tree (raw logs
# stay out of it): OUT_DIR/logs/*.log, OUT_DIR/csv/context_parallel.csv and
# context_parallel_checks.csv. The recipe, end to end:
#   cmake --preset cuda
#   cmake --build --preset cuda -j2 --target test_cuda_context_parallel flashlab
#   mkdir -p gpu-carry && cp build/cuda/tests/cuda/test_cuda_context_parallel build/cuda/app/flashlab gpu-carry/
#   (GPU machine of 2, 4 or 8 GPUs, repository root)  bash cuda/bench/context_parallel.sh all gpu-carry "$OUT"
# The binaries load libnccl.so.2 from the machine (NCCL 2.28 there); NVLink multicast stays off
# (NCCL_NVLS_ENABLE=0 for every process this script starts).
set -euo pipefail
export NCCL_NVLS_ENABLE=0

mode=${1:-}
bin=${2:-gpu-carry}
out=${3:-/tmp/flashlab-ring}
REPS=${REPS:-3}  # timed rings per shape (flashlab bench attention --gpus takes at least 3)

case "$mode" in
  check|scale|all) ;;
  *) sed -n '2,30p' "$0"; exit 2 ;;
esac
for exe in test_cuda_context_parallel flashlab; do
  [[ -x "$bin/$exe" ]] || { echo "error: $bin/$exe is missing (hint: build and copy it as the header says)" >&2; exit 2; }
done
mkdir -p "$out/logs" "$out/csv"
gpus=$(nvidia-smi -L | wc -l)
device=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "machine: $gpus x $device"
sizes=()
for g in 1 2 4 8; do (( g <= gpus )) && sizes+=("$g"); done
now() { date -u '+%Y-%m-%d %H:%M'; }

check() {
  local csv="$out/csv/context_parallel_checks.csv"
  [[ -f "$csv" ]] || echo "date,device,gpus,command,result,assertions,test_cases,sanitizer_errors" > "$csv"
  local log="$out/logs/test_cuda_context_parallel.log" result=pass
  "$bin/test_cuda_context_parallel" --durations yes > "$log" 2>&1 || result=fail
  local summary; summary=$(grep -E "All tests passed|test cases:|assertions:" "$log" | tr '\n' ' ')
  local assertions; assertions=$(grep -oE "[0-9]+ assertions|assertions: +[0-9]+" "$log" | grep -oE "[0-9]+" | head -1)
  local cases; cases=$(grep -oE "in [0-9]+ test cases|test cases: +[0-9]+" "$log" | grep -oE "[0-9]+" | head -1)
  echo "$(now),$device,$gpus,test_cuda_context_parallel,$result,${assertions:-},${cases:-},–" >> "$csv"
  echo "test_cuda_context_parallel: $result ($summary)"
  if command -v compute-sanitizer > /dev/null; then
    local slog="$out/logs/memcheck_context_parallel.log" sresult=pass
    compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 "$bin/test_cuda_context_parallel" "[ring-sanitize]" \
      > "$slog" 2>&1 || sresult=fail
    local errors; errors=$(grep -oE "ERROR SUMMARY: [0-9]+" "$slog" | grep -oE "[0-9]+" | tail -1)
    echo "$(now),$device,$gpus,compute-sanitizer --tool memcheck test_cuda_context_parallel [ring-sanitize],$sresult,,,${errors:-}" >> "$csv"
    echo "memcheck: $sresult (${errors:-?} errors)"
  fi
  # The command lines: rows and bytes of `flashlab bench attention --gpus 2` and `flashlab traffic
  # ring --device cuda --gpus 2` against the model (ring_cli_check.sh; exit 77: skipped).
  local clog="$out/logs/ring_cli_check.log" cresult=pass rc=0
  bash "$(dirname "$0")/ring_cli_check.sh" "$bin" > "$clog" 2>&1 || rc=$?
  (( rc == 77 )) && cresult=skipped
  (( rc != 0 && rc != 77 )) && cresult=fail
  echo "$(now),$device,$gpus,ring_cli_check.sh,$cresult,,,–" >> "$csv"
  echo "ring CLI check: $cresult ($(tail -1 "$clog"))"
}

bench() {  # bench LABEL H_KV [flags of flashlab bench attention --gpus]: rows into context_parallel.csv
  local label=$1 hkv=$2; shift 2
  local csv="$out/csv/context_parallel.csv" raw="$out/logs/bench_$label.csv"
  echo "bench $label H_kv=$hkv $*"
  "$bin/flashlab" bench attention --heads 16 --heads-kv "$hkv" --dim 128 --causal --pass both --reps "$REPS" \
    --csv "$@" > "$raw" 2>> "$out/logs/bench_context_parallel.log" ||
    echo "error: that run failed; the sweep goes on (see the log)"
  # The command's rows, each after the run's date, device and this label; the header once per file.
  [[ -s "$raw" ]] || return 0
  [[ -f "$csv" ]] || echo "date,device,label,$(head -1 "$raw")" > "$csv"
  tail -n +2 "$raw" | sed "s|^|$(now),$device,$label,|" | tee -a "$csv"
}

scale() {
  for hkv in 16 4; do
    # strong scaling: the whole N = 512k on every G (one GPU's kernels timed once, at the first G)
    bench strong "$hkv" --gpus "$(IFS=,; echo "${sizes[*]}")" --seq 524288
    # weak scaling: 128k rows per GPU (the G = 1 row carries one GPU's TFLOP/s at 128k)
    bench weak "$hkv" --gpus 1 --seq 131072
    (( ${#sizes[@]} > 1 )) &&
      bench weak "$hkv" --gpus "$(IFS=,; echo "${sizes[*]:1}")" --scaling weak --seq 131072 --no-single
  done
  # N = 1M on every GPU of the machine (B·N·H·d = 2^31: beyond one launch of the fast kernels)
  if (( gpus >= 2 )); then bench long 4 --gpus "${sizes[-1]}" --seq 1048576 --no-single; fi
  echo "rows: $out/csv/context_parallel.csv"
}

case "$mode" in
  check) check ;;
  scale) scale ;;
  all) check; scale ;;
esac
